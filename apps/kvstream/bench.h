// kvstream bench's pieces shared by its files (bench.cpp, bench_spec.cpp): the arguments, the
// engine options of a mode, statistics, random tokens, the fill to a depth and the warm-up.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs::cli {

struct BenchArgs {
  SharedArgs s;
  std::string depths = "0", modes = "auto", json_out, pair, fill = "prefill";
  std::string n_gen_text = "32", n_prompt_text, verify_text, ingest_text;
  int32_t reps = 1;
  std::string command;
  // Resolved from the text above and the model.
  std::string backend;
  EngineOptions base;
  int32_t n_gen = 32, n_batch = 512;
  std::vector<int64_t> verify;  // --verify-tokens: tokens of one sequence a timed step verifies
  std::vector<int64_t> ingest;  // --ingest: whole prompts timed from an empty cache
  SpecArgs spec;
  double accept = 0;  // --spec oracle: the chance that a draft is kept (--accept)
  std::string file;   // --spec: the prompt its drafts continue
  bool chat = false;
};

inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = s.find(',', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

inline EngineOptions options(const BenchArgs& a, const std::string& mode) {
  EngineOptions o = a.base;
  o.kv_mode = parse_kv_mode(mode.c_str());
  return o;
}

// The context a run needs, checked against the engine's int32 positions.
inline int32_t context_of(int64_t n, const char* what) {
  KVS_CHECK(n <= INT32_MAX, what, " need a context of ", n, " tokens, more than 2^31-1");
  return static_cast<int32_t>(n);
}

// The mean and the sample standard deviation of repeated measurements (llama-bench's avg and
// stddev).
struct Stat {
  double mean = 0, std = 0;
};
inline Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x / static_cast<double>(v.size());
  if (v.size() > 1) {
    for (double x : v) s.std += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(s.std / static_cast<double>(v.size() - 1));
  }
  return s;
}
inline std::string show(const Stat& s, size_t n) {
  char b[64];
  if (n > 1)
    std::snprintf(b, sizeof(b), "%.2f ± %.2f", s.mean, s.std);
  else
    std::snprintf(b, sizeof(b), "%.2f", s.mean);
  return b;
}

// Seconds that f takes.
template <class F>
double seconds(F&& f) {
  const double t0 = now();
  f();
  return now() - t0;
}

// The fields every run's JSON has: its mode, cache types and decode tokens, and the engine's
// arena.
inline nlohmann::json run_json(const BenchArgs& a, const Engine& eng, const std::string& mode) {
  nlohmann::json r;
  r["mode"] = mode;
  r["cache_type_k"] = a.s.ctk;
  r["cache_type_v"] = a.s.ctv;
  r["tg_tokens"] = a.n_gen;
  r["arena_bytes"] = eng.arena_bytes();
  r["workspace_bytes"] = eng.workspace_bytes();
  return r;
}

// Random token ids below the vocabulary's size, from one seeded generator.
struct RandomTokens {
  uint32_t vocab;
  std::mt19937 rng{1};
  std::vector<int32_t> operator()(int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  }
};

inline int32_t argmax(const float* l, int32_t n) {
  return static_cast<int32_t>(std::max_element(l, l + n) - l);
}

// Fills s up to `depth` tokens (not timed), in -b chunks, with progress on a terminal: by
// prefilling random tokens, or (--fill random) by writing random K/V rows straight into the
// cache, seeded by `seed` (the speed at a depth does not depend on what the cache holds).
template <class Tokens>
void fill(const BenchArgs& a, Engine& eng, Sequence& s, int64_t depth, const std::string& what,
          Tokens&& random_tokens, uint32_t seed) {
  const int32_t b = eng.options().n_batch;
  const int64_t from = s.n_past;
  if (depth <= from) return;
  const bool prefill = a.fill == "prefill";
  const auto t = prefill ? random_tokens(depth - from) : std::vector<int32_t>{};
  Progress progress(cat(what, " fill to ", depth), depth - from, true);
  for (int64_t i = from; i < depth; i += b) {
    const int32_t m = static_cast<int32_t>(std::min<int64_t>(b, depth - i));
    if (prefill)
      eng.eval(s, t.data() + (i - from), m);
    else
      eng.fill_random(s, m, seed + static_cast<uint32_t>(i / b));
    progress.update(i + m - from);
  }
  progress.finish();
}

// A prefill of all of t but its last token, then a decode of that one, in a sequence of its own.
inline void warm_up(Engine& eng, const std::vector<int32_t>& t) {
  Sequence w = eng.open_sequence();
  eng.eval(w, t.data(), static_cast<int32_t>(t.size() - 1));
  eng.eval(w, &t.back(), 1);
  eng.close_sequence(w);
}

// bench --spec (bench_spec.cpp).
void spec_bench(BenchArgs& a, const Model& model, const std::vector<int64_t>& depths,
                int64_t max_depth, size_t vram, const std::vector<int32_t>& prompt,
                nlohmann::json& runs, std::string& device_name, const std::function<void()>& save);

}  // namespace kvs::cli
