// llama-server's own API beside OpenAI's: /completion (and /completions, /infill), /tokenize,
// /detokenize, /apply-template, /props, the slot actions and the llamacpp:* metrics, in the
// shapes its clients and its test suite read.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>

#include "kvs/chat/chat_format.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "serve.h"

namespace kvs::cli {
namespace {

json bytes_of(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// A piece as JSON text where it is whole UTF-8, else its bytes (as llama-server's /tokenize).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

// response_fields: "a/b" picks body["a"]["b"], kept under its path, as llama-server.
json pick_fields(const json& fields, const json& res) {
  json out = json::object();
  for (const json& f : fields) {
    if (!f.is_string()) continue;
    const std::string path = f.get<std::string>();
    const json* at = &res;
    std::stringstream ss(path);
    bool found = true;
    for (std::string part; std::getline(ss, part, '/');) {
      if (!at->is_object() || !at->contains(part)) {
        found = false;
        break;
      }
      at = &(*at)[part];
    }
    if (found) out[path] = *at;
  }
  return out;
}

// A file name of the slot directory: no path, nothing hidden.
void check_filename(const std::string& name) {
  if (name.empty() || name.size() > 255 || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos || name[0] == '.' || name.find('\0') != std::string::npos)
    bad(cat("'filename' must be a plain file name, got '", name, "'"), "filename");
}

}  // namespace

void Api::count_end(const Event& e) {
  prompt_s_total.fetch_add(e.prompt_s);
  predicted_s_total.fetch_add(e.decode_s);
  n_decode_total.fetch_add(1 + std::max<int64_t>(0, e.completion_tokens - 1));
}

json Api::generation_settings(const GenRequest& r, bool stream) const {
  json bias = json::array();
  for (const auto& [id, b] : r.logit_bias)
    bias.push_back({{"token", id}, {"bias", std::isinf(b) ? json(nullptr) : json(b)}});
  const SamplerParams& sp = r.sampling;
  return {{"seed", a.g.seed >= 0 && sp.seed == static_cast<uint64_t>(a.g.seed)
                       ? json(a.g.seed)
                       : json(sp.seed)},
          {"temperature", sp.temp},
          {"top_k", sp.top_k},
          {"top_p", sp.top_p},
          {"min_p", sp.min_p},
          {"repeat_last_n", sp.repeat_last_n},
          {"repeat_penalty", sp.repeat_penalty},
          {"presence_penalty", r.presence_penalty},
          {"frequency_penalty", r.frequency_penalty},
          {"adaptive_target", -1.0},
          {"adaptive_decay", 0.0},
          {"stop", r.stop},
          {"max_tokens", r.max_tokens},
          {"n_predict", r.max_tokens},
          {"ignore_eos", r.ignore_eos},
          {"n_keep", r.n_keep},
          {"n_discard", r.n_discard},
          {"stream", stream},
          {"logit_bias", bias},
          {"n_probs", std::max(0, r.top_logprobs)},
          {"samplers", json::array({"penalties", "top_k", "top_p", "min_p", "temperature"})},
          {"speculative.types", a.spec.kind()}};
}

json Api::native_timings(const Event& e) const {
  json t = timings(e);
  // The first token comes from the prompt's logits: the rate is over the decode steps after it.
  const int64_t steps = std::max<int64_t>(0, e.completion_tokens - 1);
  const double ms = e.decode_s * 1e3;
  t["predicted_per_token_ms"] = steps > 0 ? ms / static_cast<double>(steps) : 0.0;
  t["predicted_per_second"] = steps > 0 && ms > 0 ? 1e3 * static_cast<double>(steps) / ms : 0.0;
  return t;
}

json Api::native_final(const GenRequest& r, const Event& end, const std::string& content,
                       const std::vector<int32_t>& tokens, const json& probs, bool stream,
                       const json& fields) const {
  json res = {{"index", 0},
              {"content", content},
              {"tokens", tokens},
              {"id_slot", end.slot},
              {"stop", true},
              {"model", model_id},
              {"tokens_predicted", end.completion_tokens},
              {"tokens_evaluated", end.prompt_tokens},
              {"generation_settings", generation_settings(r, stream)},
              {"prompt", tok.decode(r.prompt, true)},
              {"has_new_line", content.find('\n') != std::string::npos},
              {"truncated", end.truncated},
              {"stop_type", end.stop_type},
              {"stopping_word", end.stopping_word},
              {"tokens_cached", end.n_past},
              {"timings", native_timings(end)}};
  if (!stream && !probs.empty()) res["completion_probabilities"] = probs;
  return fields.is_array() && !fields.empty() ? pick_fields(fields, res) : res;
}

void Api::completion(const httplib::Request& req, httplib::Response& res, bool infill) {
  const json b = parse_body(req.body);
  if (!b.contains("prompt") && !infill) bad("'prompt' is required", "prompt");
  // The prompts: one (text, ids, a mixed list, an object) or a list of them.
  std::vector<std::vector<int32_t>> prompts;
  if (infill) {
    if (b.contains("input_extra")) {
      const json& ex = b["input_extra"];
      if (!ex.is_array()) bad("'input_extra' must be a list of {filename, text}", "input_extra");
      for (const json& e : ex)
        if (!e.is_object() || !e.contains("filename") || !e["filename"].is_string() ||
            !e.contains("text") || !e["text"].is_string())
          bad("every 'input_extra' chunk needs a string 'filename' and 'text'", "input_extra");
    }
    // Fill in the middle: prefix and suffix around the model's FIM tokens.
    const int32_t pre = tok.find("<|fim_prefix|>") >= 0 ? tok.find("<|fim_prefix|>")
                                                         : tok.find("<fim_prefix>");
    const int32_t suf = tok.find("<|fim_suffix|>") >= 0 ? tok.find("<|fim_suffix|>")
                                                         : tok.find("<fim_suffix>");
    const int32_t mid = tok.find("<|fim_middle|>") >= 0 ? tok.find("<|fim_middle|>")
                                                         : tok.find("<fim_middle>");
    if (pre < 0 || suf < 0 || mid < 0)
      throw ApiError{501, "this model has no fill-in-the-middle tokens (<|fim_prefix|> ...)",
                     "not_supported_error", "", "", {{"code", 501}}};
    const std::string prefix = text_of(b, "input_prefix"), suffix = text_of(b, "input_suffix");
    std::string extra = text_of(b, "prompt");
    std::vector<int32_t> ids{pre};
    for (const std::string& part : {prefix}) {
      const auto t = tok.encode(part, false, false);
      ids.insert(ids.end(), t.begin(), t.end());
    }
    ids.push_back(suf);
    const auto ts = tok.encode(suffix, false, false);
    ids.insert(ids.end(), ts.begin(), ts.end());
    ids.push_back(mid);
    const auto te = tok.encode(extra, false, false);
    ids.insert(ids.end(), te.begin(), te.end());
    prompts.push_back(std::move(ids));
  } else {
    const json& p = b["prompt"];
    const bool many = p.is_array() && !p.empty() &&
                      std::none_of(p.begin(), p.end(), [](const json& x) { return x.is_number(); });
    if (many)
      for (const json& one : p) prompts.push_back(rules.native_prompt(one));
    else
      prompts.push_back(rules.native_prompt(p));
  }
  const bool stream = boolean(b, "stream", false);
  const bool return_tokens = boolean(b, "return_tokens", false);
  const json fields = b.contains("response_fields") ? b["response_fields"] : json();
  if (stream && prompts.size() > 1) bad("a list of prompts cannot be streamed", "stream");
  std::vector<std::shared_ptr<Job>> jobs;
  for (auto& p : prompts) {
    GenRequest r = rules.native_request(b, std::move(p));
    try {
      Sampler check(r.sampling);
    } catch (const Error& e) {
      bad(e.what());
    }
    jobs.push_back(submit(std::move(r), res));
  }
  struct State {
    std::string text;
    std::vector<int32_t> tokens;
    json probs = json::array();
    std::optional<Event> end;
  };
  auto st = std::make_shared<std::vector<State>>(jobs.size());
  // A token's entry of completion_probabilities: log-probabilities, or with
  // post_sampling_probs the probabilities after the sampler's chain (llama-server's names).
  auto prob_json = [this](const TokenLogprob& t) {
    const char* value = t.post_sampling ? "prob" : "logprob";
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string piece = tok.token_to_piece(id, true);
      top.push_back({{"id", id}, {"token", piece}, {"bytes", bytes_of(piece)}, {value, lp}});
    }
    const std::string piece = tok.token_to_piece(t.id, true);
    return json{{"id", t.id},
                {"token", piece},
                {"bytes", bytes_of(piece)},
                {value, t.logprob},
                {t.post_sampling ? "top_probs" : "top_logprobs", top}};
  };
  auto provider = [=, this](size_t, httplib::DataSink& sink) {
    auto cancel = [&] {
      for (const auto& j : jobs) j->cancelled = true;
      return false;
    };
    if (!sink.is_writable()) return cancel();
    std::string out;
    bool all_done = true, failed = false;
    for (size_t k = 0; k < jobs.size(); ++k) {
      State& s = (*st)[k];
      if (s.end) continue;
      std::vector<Event> events;
      jobs[k]->pop(events, 0.1 / static_cast<double>(jobs.size()));
      for (Event& e : events) {
        if (!e.error.empty()) {
          out = dump(error_body(ApiError{500, e.error, "server_error"}));
          if (stream) out = "data: " + out + "\n\n";
          failed = true;
          break;
        }
        if (e.progress) {
          if (stream) {
            json chunk = {{"index", 0}, {"content", ""}, {"tokens", json::array()},
                          {"stop", false}, {"id_slot", -1},
                          {"prompt_progress", prompt_progress(*e.progress)}};
            if (jobs[k]->request.timings_per_token) chunk["timings"] = timings(e);
            out += "data: " + dump(chunk) + "\n\n";
          }
          continue;
        }
        if (stream && !e.done) {
          json chunk = {{"index", 0},
                        {"content", e.text},
                        {"tokens", e.tokens},
                        {"stop", false},
                        {"id_slot", -1},
                        {"tokens_predicted", static_cast<int64_t>(s.tokens.size() + 1)},
                        {"tokens_evaluated", jobs[k]->request.prompt.size()}};
          if (e.logprob) chunk["completion_probabilities"] = json::array({prob_json(*e.logprob)});
          if (jobs[k]->request.timings_per_token) chunk["timings"] = timings(e);
          out += "data: " + dump(chunk) + "\n\n";
        }
        s.text += e.text;
        s.tokens.insert(s.tokens.end(), e.tokens.begin(), e.tokens.end());
        if (e.logprob) s.probs.push_back(prob_json(*e.logprob));
        if (e.done) {
          count_end(e);
          s.end = std::move(e);
          break;
        }
      }
      if (failed) break;
      all_done &= s.end.has_value();
    }
    if (!failed && all_done) {
      json results = json::array();
      for (size_t k = 0; k < jobs.size(); ++k) {
        State& s = (*st)[k];
        json one = native_final(jobs[k]->request, *s.end, stream ? std::string() : s.text,
                                return_tokens && !stream ? s.tokens : std::vector<int32_t>{},
                                s.probs, stream, fields);
        if (one.contains("index")) one["index"] = k;
        results.push_back(std::move(one));
      }
      if (stream)
        out += "data: " + dump(results[0]) + "\n\n";
      else
        out = dump(jobs.size() == 1 ? results[0] : results);
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) return cancel();
    if (failed || all_done) sink.done();
    return true;
  };
  auto release = [jobs](bool ok) {
    if (!ok)
      for (const auto& j : jobs) j->cancelled = true;
  };
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider,
                                   release);
}

json Api::props() const {
  GenRequest defaults;
  defaults.sampling = a.g.sp;
  defaults.max_tokens = rules.n_predict;
  defaults.ignore_eos = a.g.ignore_eos;
  defaults.n_keep = a.keep;
  json slot = {{"id", 0},
               {"id_task", -1},
               {"n_ctx", eo.n_ctx},
               {"speculative", a.spec.on()},
               {"is_processing", false},
               {"params", generation_settings(defaults, false)}};
  slot["params"]["seed"] = a.g.seed;
  const int32_t bos = tok.bos(), eos = tok.eos();
  return {{"default_generation_settings", slot},
          {"total_slots", eo.n_seq},
          {"model_alias", model_id},
          {"model_path", a.s.model},
          {"modalities", {{"vision", false}, {"audio", false}}},
          {"chat_template", tok.chat_format() ? tok.chat_format()->source() : tok.chat_family()},
          {"bos_token", bos >= 0 ? tok.token_to_piece(bos, true) : ""},
          {"eos_token", eos >= 0 ? tok.token_to_piece(eos, true) : ""},
          {"build_info", fingerprint()},
          {"is_sleeping", false},
          {"webui", !a.no_ui}};
}

void Api::slot_action(const httplib::Request& req, httplib::Response& res) {
  const std::string action = req.get_param_value("action");
  int32_t slot = -1;
  try {
    slot = std::stoi(req.matches[1].str());
  } catch (const std::exception&) {
    bad(cat("'", req.matches[1].str(), "' is not a slot number"), "id_slot");
  }
  if (slot < 0 || slot >= sched.n_slots())
    bad(cat("slot ", slot, " does not exist (0 to ", sched.n_slots() - 1, ")"), "id_slot");
  const auto t0 = std::chrono::steady_clock::now();
  auto ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  // Engine errors (busy slot, a refused file) are the client's to fix.
  auto run = [&](const std::function<void(Engine&, std::vector<int32_t>&)>& fn) {
    try {
      sched.with_slot(slot, fn);
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception& e) {
      bad(e.what());
    }
  };
  json out;
  if (action == "erase") {
    int32_t n = 0;
    run([&](Engine& eng, std::vector<int32_t>& last) {
      n = static_cast<int32_t>(last.size());
      eng.erase_prefix(last);
      last.clear();
    });
    out = {{"id_slot", slot}, {"n_erased", n}};
  } else if (action == "save" || action == "restore") {
    if (a.slot_save_path.empty())
      throw ApiError{501, "slot save and restore need --slot-save-path DIR",
                     "not_supported_error", "", "", {{"code", 501}}};
    const json b = req.body.empty() ? json::object() : parse_body(req.body);
    const std::string name = text_of(b, "filename");
    check_filename(name);
    const std::string path = (std::filesystem::path(a.slot_save_path) / name).string();
    size_t bytes = 0;
    int32_t n = 0;
    if (action == "save") {
      run([&](Engine& eng, std::vector<int32_t>& last) { n = eng.save_prefix(last, path, &bytes); });
      out = {{"id_slot", slot},
             {"filename", name},
             {"n_saved", n},
             {"n_written", bytes},
             {"timings", {{"save_ms", ms()}}}};
    } else {
      run([&](Engine& eng, std::vector<int32_t>& last) {
        eng.load_prefix(path, last, &bytes);
        n = static_cast<int32_t>(last.size());
      });
      out = {{"id_slot", slot},
             {"filename", name},
             {"n_restored", n},
             {"n_read", bytes},
             {"timings", {{"restore_ms", ms()}}}};
    }
  } else {
    bad(cat("action must be save, restore or erase, got '", action, "'"), "action");
  }
  res.set_content(dump(out), "application/json");
}

std::string Api::llamacpp_metrics() const {
  const SchedulerStats s = sched.stats();
  std::ostringstream o;
  o.precision(15);
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP llamacpp:" << name << " " << help << "\n# TYPE llamacpp:" << name << " " << type
      << "\nllamacpp:" << name << " " << v << "\n";
  };
  const double cached = s.prompt_cache ? static_cast<double>(s.prompt_cache->tokens_reused) : 0;
  const double prompt_n = static_cast<double>(s.prompt_tokens) - cached;
  const double prompt_s = prompt_s_total.load(), predicted_s = predicted_s_total.load();
  metric("prompt_tokens_total", "counter", "Prompt tokens processed (those from the cache apart)",
         prompt_n);
  metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the prompt cache",
         cached);
  metric("prompt_seconds_total", "counter", "Prompt processing time", prompt_s);
  metric("tokens_predicted_total", "counter", "Tokens generated",
         static_cast<double>(s.completion_tokens));
  metric("tokens_predicted_seconds_total", "counter", "Generation time", predicted_s);
  metric("n_decode_total", "counter", "Engine steps", static_cast<double>(s.steps));
  metric("n_tokens_max", "counter", "The most tokens a slot held",
         static_cast<double>(eo.n_ctx));
  metric("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified",
         static_cast<double>(s.drafted));
  metric("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted",
         static_cast<double>(s.accepted));
  metric("spec_decode_num_drafts_total", "counter", "Draft tokens verified",
         static_cast<double>(s.drafted));
  metric("prompt_tokens_seconds", "gauge", "Prompt tokens a second",
         prompt_s > 0 ? prompt_n / prompt_s : 0.0);
  metric("predicted_tokens_seconds", "gauge", "Generated tokens a second",
         predicted_s > 0 ? static_cast<double>(s.completion_tokens) / predicted_s : 0.0);
  metric("requests_processing", "gauge", "Slots with a request", s.slots_busy);
  metric("requests_deferred", "gauge", "Requests waiting for a slot", s.queued);
  metric("n_busy_slots_per_decode", "gauge", "Busy slots a step, on average",
         s.steps > 0 ? static_cast<double>(s.completion_tokens) / static_cast<double>(s.steps)
                     : 0.0);
  return o.str();
}

void Api::native_routes(httplib::Server& svr) {
  for (const char* path : {"/completion", "/completions"})
    svr.Post(path, guarded([this](const auto& req, auto& res) { completion(req, res, false); }));
  svr.Post("/infill", guarded([this](const auto& req, auto& res) { completion(req, res, true); }));
  svr.Post("/tokenize", guarded([this](const auto& req, auto& res) {
    const json b = parse_body(req.body);
    if (!b.contains("content") || !b["content"].is_string())
      bad("'content' must be a string", "content");
    const auto ids = tok.encode(b["content"].get_ref<const std::string&>(),
                                boolean(b, "add_special", false), boolean(b, "parse_special", true));
    json tokens = json::array();
    const bool pieces = boolean(b, "with_pieces", false);
    for (int32_t id : ids) {
      if (!pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string piece = tok.token_to_piece(id, true);
      tokens.push_back({{"id", id}, {"piece", valid_utf8(piece) ? json(piece) : bytes_of(piece)}});
    }
    res.set_content(dump({{"tokens", tokens}}), "application/json");
  }));
  svr.Post("/detokenize", guarded([this](const auto& req, auto& res) {
    const json b = parse_body(req.body);
    std::vector<int32_t> ids;
    if (b.contains("tokens") && !b["tokens"].is_array()) bad("'tokens' must be a list", "tokens");
    for (const json& t : b.value("tokens", json::array())) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
        bad("'tokens' must be token ids of the vocabulary", "tokens");
      ids.push_back(t.get<int32_t>());
    }
    res.set_content(dump({{"content", tok.decode(ids, true)}}), "application/json");
  }));
  svr.Post("/apply-template", guarded([this](const auto& req, auto& res) {
    res.set_content(dump({{"prompt", rules.chat_text(parse_body(req.body))}}), "application/json");
  }));
  // llama-server's count of a chat request's prompt tokens.
  for (const char* path : {"/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"})
    svr.Post(path, guarded([this](const auto& req, auto& res) {
      const auto ids = tok.encode(rules.chat_text(parse_body(req.body)), true, true);
      res.set_content(dump({{"input_tokens", ids.size()}}), "application/json");
    }));
  svr.Get("/props", guarded([this](const auto&, auto& res) {
    res.set_content(dump(props()), "application/json");
  }));
  svr.Post("/props", guarded([this](const auto&, auto&) {
    throw ApiError{a.props ? 501 : 403,
                   a.props ? "kvstream has no properties to change yet"
                           : "changing properties needs --props",
                   "not_supported_error", "", "", {{"code", a.props ? 501 : 403}}};
  }));
  svr.Post(R"(/slots/([^/]+))", guarded([this](const auto& req, auto& res) { slot_action(req, res); }));
}

// kvstream's own figures: the Prometheus text of /metrics (beside llama.cpp's llamacpp:*)
// and /slots.
std::string Api::metrics() const {
  const SchedulerStats s = sched.stats();
  std::ostringstream o;
  o.precision(15);  // byte counts in full, not rounded to 6 digits
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP kvstream_" << name << " " << help << "\n# TYPE kvstream_" << name << " " << type
      << "\nkvstream_" << name << " " << v << "\n";
  };
  metric("http_requests_total", "counter", "HTTP requests received",
         static_cast<double>(http_requests.load()));
  metric("http_errors_total", "counter", "HTTP requests answered with a 4xx or 5xx status",
         static_cast<double>(http_errors.load()));
  metric("requests_total", "counter", "Generation requests admitted into a slot",
         static_cast<double>(s.admitted));
  metric("requests_rejected_total", "counter", "Generation requests refused with 503",
         static_cast<double>(s.rejected));
  metric("requests_finished_total", "counter", "Generations that ended (stop or length)",
         static_cast<double>(s.finished));
  metric("requests_cancelled_total", "counter",
         "Requests whose client went away before their end (queued or running)",
         static_cast<double>(s.cancelled));
  metric("requests_failed_total", "counter", "Generations ended by an engine error",
         static_cast<double>(s.failed));
  metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests",
         static_cast<double>(s.prompt_tokens));
  metric("completion_tokens_total", "counter", "Tokens generated",
         static_cast<double>(s.completion_tokens));
  metric("steps_total", "counter", "Engine steps", static_cast<double>(s.steps));
  metric("busy_seconds_total", "counter", "Time spent in engine steps", s.busy_s);
  metric("decode_tokens_per_second", "gauge",
         "Tokens generated per second of step time over the last 10 s", s.decode_tokens_per_s);
  metric("slots_busy", "gauge", "Slots with a request", s.slots_busy);
  metric("slots_total", "gauge", "Slots (-np)", static_cast<double>(s.slots.size()));
  metric("queue_length", "gauge", "Requests waiting for a slot", s.queued);
  if (a.spec.on()) {
    metric("spec_drafted_total", "counter", "Draft tokens verified (speculative decoding)",
           static_cast<double>(s.drafted));
    metric("spec_accepted_total", "counter", "Draft tokens accepted",
           static_cast<double>(s.accepted));
  }
  metric("bytes_streamed_total", "counter", "KV bytes copied host to device by the ring",
         static_cast<double>(s.bytes_streamed));
  metric("bytes_written_back_total", "counter", "KV bytes written back device to host",
         static_cast<double>(s.bytes_written_back));
  metric("copy_busy_seconds_total", "counter", "Time the host-to-device copy stream was busy",
         s.copy_busy_s);
  if (const auto& c = s.prompt_cache) {
    metric("prompt_cache_lookups_total", "counter", "Requests that looked in the prompt cache",
           static_cast<double>(c->lookups));
    metric("prompt_cache_hits_total", "counter", "Requests that reused cached prompt pages",
           static_cast<double>(c->hits));
    metric("prompt_cache_tokens_total", "counter", "Prompt tokens reused from the cache",
           static_cast<double>(c->tokens_reused));
    metric("prompt_cache_bytes", "gauge", "Host memory the prompt cache holds",
           static_cast<double>(c->bytes));
    metric("prompt_cache_budget_bytes", "gauge", "Host memory the prompt cache may hold",
           static_cast<double>(c->budget));
    metric("prompt_cache_evictions_total", "counter",
           "Cached pages evicted (least recently used)", static_cast<double>(c->evicted));
    metric("prompt_cache_checkpoints", "gauge", "Recurrent checkpoints the prompt cache holds",
           static_cast<double>(c->checkpoints));
    metric("prompt_cache_checkpoint_bytes", "gauge",
           "Host memory the prompt cache's recurrent checkpoints hold (part of its bytes)",
           static_cast<double>(c->checkpoint_bytes));
    if (!eo.cache_disk.empty()) {
      metric("prompt_cache_disk_bytes", "gauge", "Bytes of the prompt cache's disk entries",
             static_cast<double>(c->disk_bytes));
      metric("prompt_cache_disk_writes_total", "counter", "Prompt-cache entries written to disk",
             static_cast<double>(c->disk_writes));
      metric("prompt_cache_disk_reads_total", "counter",
             "Prompt-cache entries read back from disk", static_cast<double>(c->disk_reads));
    }
  }
  return o.str();
}

json Api::slots() const {
  const SchedulerStats s = sched.stats();
  json out = json::array();
  for (size_t i = 0; i < s.slots.size(); ++i) {
    const SlotInfo& x = s.slots[i];
    out.push_back({{"id", i},
                   {"id_task", x.id_task},
                   {"is_processing", std::string(x.state) != "idle"},
                   {"speculative", a.spec.on()},
                   {"state", x.state},
                   {"n_ctx", eo.n_ctx},
                   {"n_past", x.n_past},
                   {"prompt_tokens", x.prompt_tokens},
                   {"generated_tokens", x.generated},
                   {"pages_resident", x.pages_resident},
                   {"pages_streamed", x.pages_streamed}});
  }
  return out;
}

}  // namespace kvs::cli
