// kvstream plan: the partition of the KV arena at a context, the bytes streamed per token and
// the predicted decode bound max(T_gpu, S/B), without running the model; with drafts of a given
// acceptance, the verify step's bound and the tokens it yields.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "commands.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/model_draft.h"
#include "kvs/gguf/gguf.h"
#include "kvs/kv/planner.h"
#include "kvs/model/config.h"
#include "kvs/model/synthetic.h"
#include "kvs/model/weights.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs::cli {
namespace {

struct PlanArgs {
  SharedArgs s;
  SpecArgs spec;
  std::string json_out;
  double hbm_gbps = 0;  // 0: the backend's default, as s.h2d_gbps
  double accept = -1;   // --accept: each draft kept with this probability (-1: no drafts)
  double gpu_ms = 0;    // --gpu-ms: the device's own work a step, measured (0: from the bytes)
};

// The backend a plan is for, and the bandwidths it assumes: a step reads at `mem_gbps`, the
// ring copies at `copy_gbps`.
struct Backend {
  std::string name;
  double mem_gbps = 0, copy_gbps = 0;
};
Backend backend_of(const PlanArgs& pa) {
  Backend b;
#ifdef KVS_HAVE_CUDA
  b.name = pa.s.backend.empty() ? "cuda" : pa.s.backend;
#else
  b.name = pa.s.backend.empty() ? "cpu" : pa.s.backend;
  KVS_CHECK(b.name != "cuda",
            "plan --backend cuda: this build has no CUDA backend, whose device footprint (kernel "
            "scratch, the embedding table) a CUDA plan counts; build with the cuda preset, or "
            "plan for --backend cpu");
#endif
  // cuda: an H200's HBM and a PCIe 5 x16 link; cpu: two DDR4 channels, a copy reading and
  // writing the same memory.
  const bool cuda = b.name == "cuda";
  b.mem_gbps = pa.hbm_gbps > 0 ? pa.hbm_gbps : cuda ? 4400 : 20;
  b.copy_gbps = pa.s.h2d_gbps > 0 ? pa.s.h2d_gbps : cuda ? 55 : 10;
  return b;
}

// A model's shape and its weights' sizes, from the file's header (the tensors mapped, not
// read) or the synthetic preset's shapes.
struct Shape {
  std::unique_ptr<gguf::File> file;
  ModelConfig c;
  Weights w;
};
Shape shape_of(const std::string& model) {
  constexpr std::string_view kSynth = "synthetic:";
  Shape s;
  s.file = model.rfind(kSynth, 0) == 0 ? synthetic_shapes(model.substr(kSynth.size()))
                                       : gguf::File::open(model);
  s.c = ModelConfig::from_gguf(*s.file);
  s.w = Weights::from_gguf(*s.file, s.c);
  return s;
}

// Every figure the plan prints, for the text and the JSON.
struct Figures {
  Backend backend;
  ModelConfig c;
  EngineOptions o;
  KvShape shape;
  size_t weights = 0, page = 0, kv_token = 0;
  // What the device holds beside the weights a step reads: on CUDA the embedding table and
  // the kernels' scratch (the prefill's in the workspace).
  size_t device_extra = 0, work_scratch = 0;
  size_t draft = 0;  // -md: the draft model's weights, buffers and KV
  int32_t fixed = 0;
  // With the phase arena the prefill's activations are the arena's top (work), lent to the KV
  // while decoding: `arena` is the decode's, `prefill_arena` the KV's while prefilling.
  bool phase = false;
  size_t work = 0, arena = 0, prefill_arena = 0;
  std::string arena_from;
  Plan p;  // the decode's
  double resident_frac = 0, prefill_frac = 0, tok_s = 0;
  size_t per_token = 0;  // streamed bytes
  // --accept: a verify step of 1 + draft_max rows (its plan) and the tokens a step yields.
  Plan verify;
  double tokens_per_step = 0, spec_tok_s = 0;
};

Figures figures(const PlanArgs& pa) {
  const SharedArgs& a = pa.s;
  Figures f;
  f.backend = backend_of(pa);
  const Shape m = shape_of(a.model);
  f.c = m.c;
  f.weights = m.w.matrix_bytes();
  const ModelConfig& c = f.c;
  f.o = engine_options(a, c);
  apply_speculation(pa.spec, f.o, f.backend.name);
  const EngineOptions& o = f.o;
#ifdef KVS_HAVE_CUDA
  if (f.backend.name == "cuda") {
    const CudaFootprint fp = cuda_footprint(m.w, Engine::scratch_args(c, o));
    f.device_extra = fp.weights - f.weights + fp.reserved;
    f.work_scratch = fp.workspace;
  }
#endif
  if (pa.spec.kind() == "draft") {
    const Shape d = shape_of(pa.spec.model_draft);
    KVS_CHECK(d.c.n_vocab == c.n_vocab,
              "-md/--model-draft: the draft model's vocabulary is not the target's: ", d.c.n_vocab,
              " tokens against ", c.n_vocab, " (vocab size)");
    f.draft = ModelDrafter::planned_bytes(d.c, d.w.matrix_bytes(), o, pa.spec.draft_max);
  }
  const int64_t ctx = o.n_ctx;
  const int32_t parallel = o.n_seq;
  KVS_CHECK(o.kv_mode == KvMode::Auto || o.kv_mode == KvMode::Stream || o.kv_mode == KvMode::Split,
            "kvstream plan: --kv-mode is auto, stream or split");
  const KvLayout kv = KvLayout::make(o.k_type, o.v_type, o.page_size, c.n_head_kv, c.head_dim);
  const KvShape& shape = f.shape = Engine::kv_shape(c, o);
  const int32_t fixed = f.fixed = Engine::fixed_frames(c, o), L = shape.n_full;
  const size_t page = f.page = kv.page_bytes();
  const int32_t pages = shape.max_pages;
  f.kv_token = static_cast<size_t>(L) * (kv.k_row + kv.v_row);
  f.phase = Engine::phase_arena(c, o);
  const size_t pass = Engine::pass_bytes(c, o.n_batch);
  f.work = f.phase ? (pass + f.work_scratch + 256 + page - 1) / page * page : 0;
  // The recurrent layers' states are buffers of their own beside the arena.
  const size_t buffers = Engine::activation_bytes(c, o) + shape.recurrent_bytes + f.device_extra -
                         (f.phase ? pass - Engine::pass_bytes(c, o.n_seq) : 0);
  // What a step reads of the windows: their last n_swa positions, or all there are.
  const size_t window_read = static_cast<size_t>(shape.n_window) * (kv.k_row + kv.v_row) *
                             static_cast<size_t>(std::min<int64_t>(ctx, c.n_swa)) *
                             static_cast<size_t>(parallel);

  // What the engine takes where the limit leaves more: all the KV, or in stream mode the
  // smallest arena and two ring chunks.
  const size_t chunk_pages = std::max<size_t>(1, (o.ring_chunk_bytes + page - 1) / page);
  size_t arena = o.kv_mode == KvMode::Stream
                     ? min_arena_bytes(page, fixed) + 2 * chunk_pages * page
                     : shape.full_bytes + shape.window_bytes + static_cast<size_t>(fixed) * page;
  f.arena_from = "everything fits (no --kv-arena or --vram-limit)";
  if (!a.kv_arena.empty()) {
    arena = parse_size(a.kv_arena, "--kv-arena");
    f.arena_from = "--kv-arena";
  } else if (!a.vram_limit.empty()) {
    const size_t limit = parse_size(a.vram_limit, "--vram-limit");
    KVS_CHECK(limit > f.weights + buffers + f.draft, "--vram-limit ", format_bytes(limit),
              " does not hold the weights (", format_bytes(f.weights), ") and buffers (",
              format_bytes(buffers), ")",
              f.draft ? cat(" and the draft model (", format_bytes(f.draft), ")") : "");
    const size_t left = limit - f.weights - buffers - f.draft;
    KVS_CHECK(left > f.work, "--vram-limit ", format_bytes(limit),
              " does not hold the prefill's workspace (", format_bytes(f.work), ")");
    if (left - f.work < arena) {
      arena = left - f.work;
      f.arena_from = cat("--vram-limit ", format_bytes(limit), " less weights and buffers",
                         f.draft ? " and the draft model" : "");
    } else {
      f.arena_from = cat("all it needs; --vram-limit ", format_bytes(limit), " leaves more");
    }
  }
  f.prefill_arena = arena / page * page;  // as the engine's pool: whole frames
  f.arena = f.prefill_arena + f.work;
  // T_gpu: a decode step reads every weight once, each sequence's whole KV, and reads and
  // writes every recurrent state.
  const double copy_gbps = f.backend.copy_gbps;
  const double hbm = f.backend.mem_gbps * 1e9,
               h2d = o.h2d_limit > 0 ? std::min(copy_gbps * 1e9, o.h2d_limit) : copy_gbps * 1e9;
  const double gpu_s =
      pa.gpu_ms > 0 ? pa.gpu_ms / 1e3
                    : (static_cast<double>(f.weights) + static_cast<double>(window_read) +
                       2 * static_cast<double>(shape.recurrent_bytes) +
                       static_cast<double>(f.kv_token) * static_cast<double>(ctx) * parallel) /
                          hbm;
  // rows: the tokens of a sequence's step; split attention's CPU attends to its pages once for
  // each of them.
  const auto plan_of = [&](size_t arena_bytes, int32_t rows = 1) {
    Plan p;  // without full layers: everything resident
    p.resident.assign(static_cast<size_t>(parallel), kUnlimited);
    p.extra.assign(static_cast<size_t>(parallel), 0);
    p.gpu_s = p.predicted_step_s = gpu_s;
    if (L == 0) return p;
    PlanInput in;
    in.arena_bytes = arena_bytes;
    in.page_bytes = page;
    in.n_layer = L;
    in.fixed_frames = fixed;
    in.seq_pages.assign(static_cast<size_t>(parallel), pages);
    in.h2d_bytes_per_s = h2d;
    in.layer_s = gpu_s / L;
    in.min_chunk_bytes = o.ring_chunk_bytes;
    in.min_slots = a.ring_slots;
    in.force_ring = o.kv_mode == KvMode::Stream;
    in.split = o.kv_mode == KvMode::Split;
    in.cpu_bytes_per_s = a.cpu_gbps * 1e9;
    in.cpu_rows = rows;
    in.split_share = a.split_share;
    return plan(in);
  };
  const auto resident_of = [&](const Plan& p) {
    int64_t n = 0;
    for (size_t s = 0; s < p.resident.size(); ++s)
      for (int32_t l = 0; l < L; ++l) n += std::min(pages, resident_cap(p, s, l));
    return L == 0 ? 1.0 : static_cast<double>(n) / (static_cast<double>(pages) * L * parallel);
  };
  f.p = plan_of(f.arena);
  f.resident_frac = resident_of(f.p);
  f.prefill_frac = resident_of(plan_of(f.prefill_arena));
  f.tok_s = parallel / f.p.predicted_step_s;
  f.per_token = f.p.streamed_bytes / static_cast<size_t>(parallel);
  if (pa.accept >= 0) {
    // Each draft kept with probability P until the first rejection, whose row gives the
    // token: 1 + P + ... + P^k tokens a step of k drafts.
    const int32_t k = pa.spec.draft_max;
    f.verify = plan_of(f.arena, k + 1);
    for (int32_t i = 0; i <= k; ++i) f.tokens_per_step += std::pow(pa.accept, i);
    f.spec_tok_s = parallel * f.tokens_per_step / f.verify.predicted_step_s;
  }
  return f;
}

// Split: the CPU's share of the pages that would stream without it.
double cpu_share(const Plan& p) {
  const double cpu = static_cast<double>(p.cpu_bytes);
  return cpu > 0 ? cpu / (cpu + static_cast<double>(p.streamed_bytes)) : 0.0;
}

void print(const PlanArgs& pa, const Figures& f) {
  const SharedArgs& a = pa.s;
  const KvShape& shape = f.shape;
  const Plan& p = f.p;
  const Backend& b = f.backend;
  const bool cpu = b.name == "cpu";
  std::printf(
      "backend    %s (--backend): a step reads %s at %.0f GB/s (--hbm-gbps), the ring copies "
      "at %.1f GB/s (--h2d-gbps)\n",
      b.name.c_str(), cpu ? "host memory" : "the GPU's memory", b.mem_gbps, b.copy_gbps);
  std::printf("model      %s: %d layers, weights %s, KV %s/%s %s per token\n", a.model.c_str(),
              f.c.n_layer, format_bytes(f.weights).c_str(), a.ctk.c_str(), a.ctv.c_str(),
              format_bytes(f.kv_token).c_str());
  std::printf("layers     %d full (paged, may stream)", shape.n_full);
  if (shape.n_window > 0)
    std::printf(", %d window of %d positions (resident, %d pages each: %s)", shape.n_window,
                f.c.n_swa, shape.window_pages, format_bytes(shape.window_bytes).c_str());
  const size_t checkpoint = shape.recurrent_layer_bytes * static_cast<size_t>(shape.n_recurrent);
  if (shape.n_recurrent > 0)
    std::printf(
        ", %d recurrent (resident state beside the arena: %s; a prompt-cache checkpoint "
        "of a sequence: %s of host memory)",
        shape.n_recurrent, format_bytes(shape.recurrent_bytes).c_str(),
        format_bytes(checkpoint).c_str());
  std::printf("\n");
  if (f.device_extra)
    std::printf("device     %s more beside the weights a step reads: the embedding table and the "
                "CUDA kernels' scratch\n",
                format_bytes(f.device_extra).c_str());
  if (f.draft)
    std::printf("draft      %s: %s on the device (weights, buffers, its whole KV resident)\n",
                pa.spec.model_draft.c_str(), format_bytes(f.draft).c_str());
  std::printf("context    %lld tokens x %d sequence(s): KV %s in %d pages of %s per full layer\n",
              static_cast<long long>(f.o.n_ctx), f.o.n_seq, format_bytes(shape.full_bytes).c_str(),
              shape.max_pages, format_bytes(f.page).c_str());
  std::printf("arena      %s (%s); %d fixed frames (pages being written%s)\n",
              format_bytes(f.arena).c_str(), f.arena_from.c_str(), f.fixed,
              shape.n_window > 0 ? ", windows" : "");
  if (f.phase)
    std::printf(
        "phase      a prefill takes %s back for its workspace (activations of -b %d; on CUDA "
        "also its f16 scratch): %s and %.1f %% of the KV resident while prefilling\n",
        format_bytes(f.work).c_str(), f.o.n_batch, format_bytes(f.prefill_arena).c_str(),
        100 * f.prefill_frac);
  if (!p.streams()) {
    std::printf("partition  everything resident, ring empty\n");
  } else {
    std::printf("partition  %.1f %% of the KV resident (%d pages per layer and sequence",
                100 * f.resident_frac, p.resident[0]);
    if (p.extra[0] > 0) std::printf(", %d more in the first %d layers", 1, p.extra[0]);
    std::printf("); ring %d slots x %d pages (%s)\n", p.n_slots, p.slot_pages,
                format_bytes(static_cast<size_t>(p.ring_frames()) * f.page).c_str());
  }
  std::printf("streamed   %s per step, %s per token\n", format_bytes(p.streamed_bytes).c_str(),
              format_bytes(f.per_token).c_str());
  if (p.cpu_bytes > 0)
    std::printf(
        "split      the CPU attends %d pages per layer and sequence from the host store (%.1f %% "
        "of the pages that would stream): %s per step, cpu_s %.3f ms at %.1f GB/s (--cpu-gbps; "
        "a run calibrates and measures it)\n",
        p.cpu[0], 100 * cpu_share(p), format_bytes(p.cpu_bytes).c_str(), p.cpu_s * 1e3, a.cpu_gbps);
  // On the CPU backend the device's step is the CPU's and the ring copies within host memory.
  const std::string bound = !cpu ? p.bound() : p.bound() == std::string("pcie") ? "copy" : "cpu";
  std::printf("bound      %s %.3f ms (%s), copy_s %.3f ms (at %.1f GB/s%s)",
              cpu ? "T_cpu" : "T_gpu", p.gpu_s * 1e3,
              pa.gpu_ms > 0 ? "--gpu-ms" : cat("at ", static_cast<int>(b.mem_gbps), " GB/s").c_str(),
              p.copy_s * 1e3,
              f.o.h2d_limit > 0 ? std::min(b.copy_gbps, f.o.h2d_limit / 1e9) : b.copy_gbps,
              f.o.h2d_limit > 0 && f.o.h2d_limit / 1e9 < b.copy_gbps ? ", --h2d-limit" : "");
  if (p.cpu_bytes > 0)
    std::printf(", cpu_s + %s %.3f ms", cpu ? "T_cpu" : "T_gpu", p.cpu_side_s() * 1e3);
  std::printf(": %.3f ms per step (%s), %.1f tokens/s\n", p.predicted_step_s * 1e3, bound.c_str(),
              f.tok_s);
  if (pa.accept >= 0)
    std::printf(
        "drafts     %d a step, each kept at %.2f (--accept): %.2f tokens a step of %d rows, "
        "%.3f ms (%s%s), %.1f tokens/s (%.2fx); the drafter's own work is not counted\n",
        pa.spec.draft_max, pa.accept, f.tokens_per_step, pa.spec.draft_max + 1,
        f.verify.predicted_step_s * 1e3, f.verify.bound(),
        f.verify.cpu_bytes > 0 ? cat(", the CPU's share ", format_bytes(f.verify.cpu_bytes)).c_str()
                               : "",
        f.spec_tok_s, f.spec_tok_s / f.tok_s);
}

nlohmann::json plan_json(const PlanArgs& pa, const Figures& f) {
  const KvShape& shape = f.shape;
  const Plan& p = f.p;
  nlohmann::json j;
  j["backend"] = f.backend.name;
  j["model"] = pa.s.model;
  j["ctx"] = f.o.n_ctx;
  j["parallel"] = f.o.n_seq;
  j["weights_bytes"] = f.weights;
  j["device_extra_bytes"] = f.device_extra;
  j["workspace_scratch_bytes"] = f.work_scratch;
  j["draft_bytes"] = f.draft;
  j["kv_bytes_per_token"] = f.kv_token;
  j["kv_bytes"] = shape.full_bytes;
  j["page_bytes"] = f.page;
  j["arena_bytes"] = f.arena;
  j["phase_arena"] = f.phase;
  j["workspace_bytes"] = f.work;
  j["prefill_arena_bytes"] = f.prefill_arena;
  j["prefill_resident_fraction"] = f.prefill_frac;
  j["fixed_frames"] = f.fixed;
  j["full_layers"] = shape.n_full;
  j["window_layers"] = shape.n_window;
  j["window"] = f.c.n_swa;
  j["window_bytes"] = shape.window_bytes;
  j["recurrent_layers"] = shape.n_recurrent;
  j["recurrent_bytes"] = shape.recurrent_bytes;
  // What one recurrent checkpoint of the prompt cache (--cache-ram) holds.
  j["checkpoint_bytes"] = shape.recurrent_layer_bytes * static_cast<size_t>(shape.n_recurrent);
  j["resident_fraction"] = f.resident_frac;
  j["resident_pages"] = p.resident;
  j["resident_extra_layers"] = p.extra;
  j["slot_pages"] = p.slot_pages;
  j["n_slots"] = p.n_slots;
  j["streamed_bytes_per_step"] = p.streamed_bytes;
  j["streamed_bytes_per_token"] = f.per_token;
  j["t_gpu_s"] = p.gpu_s;
  j["copy_s"] = p.copy_s;
  j["cpu_pages"] = p.cpu;
  j["cpu_bytes_per_step"] = p.cpu_bytes;
  j["cpu_s"] = p.cpu_s;
  j["cpu_side_s"] = p.cpu_side_s();
  j["cpu_gbps"] = pa.s.cpu_gbps;
  j["cpu_share"] = cpu_share(p);
  j["h2d_limit"] = f.o.h2d_limit;
  j["bound"] = p.bound();
  j["predicted_step_s"] = p.predicted_step_s;
  j["predicted_tokens_per_s"] = f.tok_s;
  j["h2d_gbps"] = f.backend.copy_gbps;
  j["hbm_gbps"] = f.backend.mem_gbps;
  if (pa.accept >= 0)
    j["drafts"] = {{"draft_max", pa.spec.draft_max},
                   {"accept", pa.accept},
                   {"tokens_per_step", f.tokens_per_step},
                   {"step_s", f.verify.predicted_step_s},
                   {"bound", f.verify.bound()},
                   {"cpu_bytes_per_step", f.verify.cpu_bytes},
                   {"streamed_bytes_per_step", f.verify.streamed_bytes},
                   {"tokens_per_s", f.spec_tok_s}};
  return j;
}

void plan_cmd(const PlanArgs& pa) {
  KVS_CHECK(pa.s.h2d_gbps >= 0 && pa.hbm_gbps >= 0,
            "--h2d-gbps and --hbm-gbps must be 0 (the backend's default) or more, got ",
            pa.s.h2d_gbps, " and ", pa.hbm_gbps);
  KVS_CHECK(pa.s.kv_arena.empty() || pa.s.vram_limit.empty(),
            "give --kv-arena or --vram-limit, not both");
  KVS_CHECK(pa.accept < 0 || pa.spec.on(),
            "--accept: the drafts' acceptance needs --spec (and --draft-max, their number)");
  const Figures f = figures(pa);
  print(pa, f);
  if (!pa.json_out.empty()) write_json(pa.json_out, plan_json(pa, f));
}

}  // namespace

void register_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  a->s.cpu_gbps = 75;  // ../shared/ceilings.md: int8 q8_0 K . q on the GPU machine's 16 threads
  CLI::App* c =
      app.add_subcommand("plan", "Show the KV partition and predicted decode speed at a context");
  add_shared(c, a->s, kModel | kContext | kParallel | kCache | kMemory | kKvMode);
  c->add_option("--backend", a->s.backend,
                "The backend to plan for: cpu or cuda (default: cuda where the build has it, "
                "else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("--hbm-gbps", a->hbm_gbps,
                "Memory bandwidth a step reads at, GB/s (0: 4400 for cuda, 20 for cpu)")
      ->capture_default_str();
  c->add_option("--gpu-ms", a->gpu_ms,
                "The device's own work a decode step, in ms, where it is measured (bench's step "
                "less its waits: tg time less ready_wait_s and cpu_wait_s per token); 0: every "
                "weight and the whole KV read once at --hbm-gbps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--json", a->json_out, "Also write the plan as JSON to this file");
  add_speculation(c, a->spec);
  c->add_option("--accept", a->accept,
                "With --spec: predict drafting at this acceptance (each of --draft-max drafts kept "
                "with this probability until one is not), e.g. bench --spec oracle's")
      ->check(CLI::Range(0.0, 1.0));
  c->callback([a] { plan_cmd(*a); });
}

}  // namespace kvs::cli
