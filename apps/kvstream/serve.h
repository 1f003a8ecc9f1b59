// kvstream serve's parts: the flags (serve_args.cpp), the OpenAI endpoints and the server's
// set-up (serve.cpp), llama-server's own endpoints (serve_native.cpp). Handler threads parse
// and check a request, tokenize it, submit a job to the scheduler and write its events.
#pragma once

#include <httplib.h>

#include <atomic>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_flags.h"
#include "options.h"
#include "request.h"
#include "scheduler.h"

namespace kvs::cli {

using json = nlohmann::json;

struct ServeArgs {
  SharedArgs s;
  GenArgs g;
  SpecArgs spec;
  std::string host = "127.0.0.1", api_key, alias, tags;
  int32_t port = 8080, queue = 64, timeout = 10, threads_http = -1;
  std::string max_body = "32M";
  std::string cache_ram = "8192";  // llama-server's default, in its unit (MiB)
  int32_t ctx_checkpoints = 8;     // llama-server's default
  std::string cache_disk, cache_disk_size = "16G";
  // llama-server's endpoints and their switches, with its defaults.
  bool metrics = false, slots = true, props = false, no_ui = false, kv_unified = false;
  std::string cors_origins = "*", cors_methods = "GET, POST, DELETE, OPTIONS", cors_headers = "*";
  std::string slot_save_path;
  ChatTemplateArgs chat;  // --jinja, --chat-template, --reasoning-format, ... (chat_flags.h)
  std::string reasoning = "auto";  // --reasoning: off sets the templates' enable_thinking false
  bool embedding = false;  // accepted with a warning: kvstream serves no embeddings
  bool context_shift = false;
  int32_t keep = 0;  // --keep: n_keep of requests that give none
};

// Registers llama-server's flags that serve takes with their meaning, or as accepted without
// effect where kvstream has nothing to change (continuous batching, mmap, the log's form).
void add_llama_server_flags(CLI::App* c, ServeArgs& a);

std::string dump(const json& j);

// llama-server's prompt_progress object of a progress event.
json prompt_progress(const Event::Progress& p);
json error_body(const ApiError& e);
void send_error(httplib::Response& res, const ApiError& e);
// A handler whose ApiError is the answer, and whose other exceptions are a 500.
template <class F>
auto guarded(F fn) {
  return [fn](const httplib::Request& req, httplib::Response& res) {
    try {
      fn(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError{500, e.what(), "server_error"});
    }
  };
}
// Answers one job: the events popped as they come become `out` by `write`, which returns true
// once the answer is whole; sent as Server-Sent Events (stream) or one JSON body. A client that
// goes away cancels the job.
void provide(httplib::Response& res, std::shared_ptr<Job> job, bool stream,
             std::function<bool(std::vector<Event>& events, std::string& out)> write);

struct Api {
  const ServeArgs& a;
  const Model& model;
  const Tokenizer& tok;
  const EngineOptions& eo;
  Scheduler& sched;
  std::string model_id;                // the first alias, or the file's name
  std::vector<std::string> aliases, tags;  // --alias (comma-separated) and --tags
  RequestRules rules;
  std::time_t started = std::time(nullptr);
  std::atomic<int64_t> http_requests{0}, http_errors{0};
  std::atomic<int64_t> n_decode_total{0};
  std::atomic<double> prompt_s_total{0}, predicted_s_total{0};

  // serve.cpp: the OpenAI endpoints and what every endpoint shares.
  void routes(httplib::Server& svr);
  json usage(const Event& e) const;
  json timings(const Event& e) const;
  json kvstream_figures(const Event& e) const;
  json token_json(int32_t id, float lp) const;
  json chat_logprob(const TokenLogprob& t) const;
  // verbose: the answer carries llama-server's __verbose (the native answer, prompt included).
  void respond(httplib::Response& res, std::shared_ptr<Job> job, bool chat, bool stream,
               bool include_usage, bool verbose = false);
  // serve_choices.cpp: an answer of n > 1 choices, each its own sequence, whole or streamed.
  void choices(httplib::Response& res, const GenRequest& r, int64_t n, bool chat, bool stream,
               bool include_usage);
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  std::shared_ptr<Job> submit(GenRequest r, httplib::Response& res);
  std::string metrics() const;
  json slots() const;
  json model_json() const;
  static std::string random_id();
  static std::string fingerprint();

  // serve_native.cpp: /completion, /tokenize, /detokenize, /apply-template, /props, /infill,
  // /slots/{id}?action=..., the llamacpp:* metrics.
  void native_routes(httplib::Server& svr);
  void completion(const httplib::Request& req, httplib::Response& res, bool infill);
  json native_final(const GenRequest& r, const Event& end, const std::string& content,
                    const std::vector<int32_t>& tokens, const json& probs, bool stream,
                    const json& fields) const;
  json generation_settings(const GenRequest& r, bool stream) const;
  json native_timings(const Event& e) const;
  json props() const;
  void slot_action(const httplib::Request& req, httplib::Response& res);
  std::string llamacpp_metrics() const;
  void count_end(const Event& e);

  // serve_anthropic.cpp: /v1/messages and /v1/messages/count_tokens.
  void anthropic_routes(httplib::Server& svr);
  void messages(const httplib::Request& req, httplib::Response& res);
  // serve_responses.cpp: /v1/responses.
  void responses(const httplib::Request& req, httplib::Response& res);
};

}  // namespace kvs::cli
