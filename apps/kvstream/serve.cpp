// kvstream serve: an OpenAI-compatible HTTP server over the scheduler (scheduler.h), which also
// speaks llama-server's own API (serve_native.cpp). Handler threads parse and check a request,
// tokenize it, submit a job and write its events as they come, as one JSON answer or as
// Server-Sent Events; a client that goes away cancels its job.
#include "serve.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "chat_flags.h"
#include "chat_page.h"
#include "commands.h"
#include "kvs/chat/chat_parse.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json prompt_progress(const Event::Progress& p) {
  return {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", p.ms}};
}

// OpenAI's error object; llama-server's clients read the same message and type.
json error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  err.update(e.extra);
  return {{"error", err}};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e)), "application/json");
}


namespace {

constexpr int kKeepAlive = 5;  // seconds an idle keep-alive connection stays open
// Idle connections (browsers keep a few open, a client may open many) that the HTTP threads
// absorb beside one per slot and queue place.
constexpr int kIdleConnections = 256;


// --cache-ram: a size (MiB without a suffix, as llama-server), 0 for none, -1 for no limit.
size_t cache_ram_of(const std::string& text) {
  if (text == "-1") return SIZE_MAX;
  const bool bare = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  return bare ? static_cast<size_t>(parse_size(text, "--cache-ram")) << 20
              : static_cast<size_t>(parse_size(text, "--cache-ram"));
}

// The methods of every endpoint, for the Allow header of a 405 (httplib answers HEAD as GET).
const std::map<std::string, std::string> kMethods = {{"/v1/chat/completions", "POST, OPTIONS"},
                                                     {"/chat/completions", "POST, OPTIONS"},
                                                     {"/v1/completions", "POST, OPTIONS"},
                                                     {"/completions", "POST, OPTIONS"},
                                                     {"/models", "GET, HEAD, OPTIONS"},
                                                     {"/", "GET, HEAD, OPTIONS"},
                                                     {"/health", "GET, HEAD, OPTIONS"},
                                                     {"/v1/models", "GET, HEAD, OPTIONS"},
                                                     {"/metrics", "GET, HEAD, OPTIONS"},
                                                     {"/slots", "GET, HEAD, OPTIONS"},
                                                     {"/completion", "POST, OPTIONS"},
                                                     {"/tokenize", "POST, OPTIONS"},
                                                     {"/detokenize", "POST, OPTIONS"},
                                                     {"/apply-template", "POST, OPTIONS"},
                                                     {"/infill", "POST, OPTIONS"},
                                                     {"/props", "GET, HEAD, OPTIONS"},
                                                     {"/v1/messages", "POST, OPTIONS"}};

// Whether an Origin header names this machine (http://localhost[:port], 127.0.0.1, [::1]), for
// --cors-origins localhost.
bool origin_is_localhost(const std::string& origin) {
  const size_t scheme = origin.find("://");
  std::string host = scheme == std::string::npos ? origin : origin.substr(scheme + 3);
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    const std::string rest = host.substr(close + 1);
    host = host.substr(0, close + 1);
    if (!rest.empty() && rest[0] != ':') return false;
  } else if (const size_t colon = host.find(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace


json Api::usage(const Event& e) const {
  return {{"prompt_tokens", e.prompt_tokens},
          {"completion_tokens", e.completion_tokens},
          {"total_tokens", e.prompt_tokens + e.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", e.cached_tokens}}}};
}
static double decode_rate(const Event& e) {
  return e.decode_s > 0 ? static_cast<double>(e.completion_tokens) / e.decode_s : 0.0;
}
// llama-server's timings object: the prompt's tokens read (those from the cache apart), the
// generated ones, their times and rates.
json Api::timings(const Event& e) const {
  const int64_t prompt_n = e.prompt_tokens - e.cached_tokens;
  const double prompt_ms = e.prompt_s * 1e3, predicted_ms = e.decode_s * 1e3;
  auto per = [](double ms, int64_t n) { return n > 0 ? ms / static_cast<double>(n) : 0.0; };
  auto rate = [](double ms, int64_t n) { return ms > 0 ? 1e3 * static_cast<double>(n) / ms : 0.0; };
  json t = {{"cache_n", e.cached_tokens},
            {"prompt_n", prompt_n},
            {"prompt_ms", prompt_ms},
            {"prompt_per_token_ms", per(prompt_ms, prompt_n)},
            {"prompt_per_second", rate(prompt_ms, prompt_n)},
            {"predicted_n", e.completion_tokens},
            {"predicted_ms", predicted_ms},
            {"predicted_per_token_ms", per(predicted_ms, e.completion_tokens)},
            {"predicted_per_second", decode_rate(e)}};
  if (a.spec.on()) {  // llama-server's names
    t["draft_n"] = e.drafted;
    t["draft_n_accepted"] = e.accepted;
  }
  return t;
}

// The non-OpenAI figures of an answer, for the chat page and other clients that want them.
json Api::kvstream_figures(const Event& e) const {
  return {{"tokens_per_s", decode_rate(e)},
          {"context_used", e.n_past},
          {"n_ctx", eo.n_ctx},
          {"pages_resident", e.pages_resident},
          {"pages_streamed", e.pages_streamed},
          {"cached_tokens", e.cached_tokens}};
}

json Api::token_json(int32_t id, float lp) const {
  const std::string piece = tok.token_to_piece(id, true);
  return {{"token", piece},
          {"logprob", lp},
          {"bytes", std::vector<uint8_t>(piece.begin(), piece.end())}};
}
json Api::chat_logprob(const TokenLogprob& t) const {
  json j = token_json(t.id, t.logprob), top = json::array();
  for (const auto& [id, lp] : t.top) top.push_back(token_json(id, lp));
  j["top_logprobs"] = top;
  return j;
}

void provide(httplib::Response& res, std::shared_ptr<Job> job, bool stream,
             std::function<bool(std::vector<Event>& events, std::string& out)> write) {
  auto provider = [job, write = std::move(write)](size_t, httplib::DataSink& sink) {
    std::vector<Event> events;
    job->pop(events, 0.1);
    if (!sink.is_writable()) {
      job->cancelled = true;
      return false;
    }
    std::string out;
    const bool done = write(events, out);
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      job->cancelled = true;
      return false;
    }
    if (done) sink.done();
    return true;
  };
  auto release = [job](bool ok) {
    if (!ok) job->cancelled = true;
  };
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider,
                                   release);
}

// Writes one job's answer: SSE chunks while it runs (stream), or one JSON object at the end.
// The provider returns false when the client is gone, which cancels the job.
void Api::respond(httplib::Response& res, std::shared_ptr<Job> job, bool chat, bool stream,
             bool include_usage, bool verbose) {
  const std::string id = cat(chat ? "chatcmpl-" : "cmpl-", random_id());
  const std::time_t created = std::time(nullptr);
  const char* object =
      chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  const bool want_lp = job->request.top_logprobs >= 0;
  const bool per_token = job->request.timings_per_token;
  auto envelope = [=, this](json choice) {
    json j = {{"id", id},
              {"object", object},
              {"created", created},
              {"model", model_id},
              {"system_fingerprint", fingerprint()},
              {"choices", json::array({std::move(choice)})}};
    if (stream && include_usage) j["usage"] = nullptr;
    return j;
  };
  struct State {
    std::string text;
    json lp_chat = json::array();
    json lp_tokens = json::array(), lp_values = json::array(), lp_top = json::array(),
         lp_offsets = json::array();
    bool started = false;
    // The chat answer's parser (reasoning, tool calls), where the request's format has one.
    std::unique_ptr<ChatStream> parse;
  };
  auto st = std::make_shared<State>();
  if (chat && job->request.chat.enabled)
    st->parse = std::make_unique<ChatStream>(job->request.chat);
  // A parsed delta (chat_parse.h) as a chunk of the stream.
  auto delta_chunk = [envelope](const nlohmann::ordered_json& d, json lp) {
    return envelope({{"index", 0},
                     {"delta", json::parse(d.dump())},
                     {"logprobs", std::move(lp)},
                     {"finish_reason", nullptr}});
  };
  // Adds a token to the lists of a completion's legacy logprobs object.
  auto add_completion_lp = [this](State& s, const TokenLogprob& t, size_t offset) {
    s.lp_tokens.push_back(tok.token_to_piece(t.id, true));
    s.lp_values.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tid, lp] : t.top) top[tok.token_to_piece(tid, true)] = lp;
    s.lp_top.push_back(top);
    s.lp_offsets.push_back(offset);
  };
  auto completion_lp = [](const State& s) {
    return json{{"tokens", s.lp_tokens},
                {"token_logprobs", s.lp_values},
                {"top_logprobs", s.lp_top},
                {"text_offset", s.lp_offsets}};
  };
  provide(res, job, stream, [=, this](std::vector<Event>& events, std::string& out) {
    auto sse = [&](const json& j) { out += "data: " + dump(j) + "\n\n"; };
    if (stream && chat && !st->started) {
      st->started = true;
      sse(envelope({{"index", 0},
                    {"delta", {{"role", "assistant"}, {"content", nullptr}}},
                    {"logprobs", nullptr},
                    {"finish_reason", nullptr}}));
    }
    bool done = false;
    for (Event& e : events) {
      if (!e.error.empty()) {
        const json err = error_body(ApiError{500, e.error, "server_error"});
        if (stream)
          sse(err);
        else
          out = dump(err);
        done = true;
        break;
      }
      if (e.progress) {
        if (stream) {
          json chunk = envelope(json::object());
          chunk["choices"] = json::array();
          chunk["prompt_progress"] = prompt_progress(*e.progress);
          if (per_token) chunk["timings"] = timings(e);
          sse(chunk);
        }
        continue;
      }
      // A token's chunk, with the timings so far where the request asks for them.
      auto sse_token = [&](json j) {
        if (per_token) j["timings"] = timings(e);
        sse(j);
      };
      if (stream && (!e.text.empty() || e.logprob)) {
        json lp = nullptr;
        if (e.logprob && chat) lp = {{"content", json::array({chat_logprob(*e.logprob)})}};
        if (e.logprob && !chat) {
          State one;
          add_completion_lp(one, *e.logprob, st->text.size());
          lp = completion_lp(one);
        }
        st->text += e.text;
        if (st->parse) {
          std::vector<nlohmann::ordered_json> ds = st->parse->push(e.text);
          if (ds.empty() && !lp.is_null()) ds.emplace_back(nlohmann::ordered_json::object());
          for (const auto& d : ds) sse_token(delta_chunk(d, std::exchange(lp, nullptr)));
        } else if (chat)
          sse_token(envelope({{"index", 0},
                        {"delta", {{"content", e.text}}},
                        {"logprobs", lp},
                        {"finish_reason", nullptr}}));
        else
          sse_token(envelope(
              {{"index", 0}, {"text", e.text}, {"logprobs", lp}, {"finish_reason", nullptr}}));
      } else if (!stream) {
        if (e.logprob) {
          if (chat)
            st->lp_chat.push_back(chat_logprob(*e.logprob));
          else
            add_completion_lp(*st, *e.logprob, st->text.size());
        }
        st->text += e.text;
      }
      if (!e.done) continue;
      count_end(e);
      done = true;
      std::string finish = e.finish_reason;
      if (st->parse) {
        if (!stream) st->parse->push(st->text);
        for (const auto& d : st->parse->finish())
          if (stream) sse(delta_chunk(d, nullptr));
        if (st->parse->has_tool_calls() && finish == "stop") finish = "tool_calls";
      }
      if (stream) {
        json last = chat ? envelope({{"index", 0},
                                     {"delta", json::object()},
                                     {"logprobs", nullptr},
                                     {"finish_reason", finish}})
                         : envelope({{"index", 0},
                                     {"text", ""},
                                     {"logprobs", nullptr},
                                     {"finish_reason", e.finish_reason}});
        last["timings"] = timings(e);
        last["kvstream"] = kvstream_figures(e);
        sse(last);
        if (include_usage) {
          json u = envelope(json::object());
          u["choices"] = json::array();
          u["usage"] = usage(e);
          u["timings"] = timings(e);  // llama-server's last chunk carries them
          sse(u);
        }
        out += "data: [DONE]\n\n";
      } else {
        json lp = nullptr;
        if (want_lp) lp = chat ? json{{"content", st->lp_chat}} : completion_lp(*st);
        json message = {{"role", "assistant"}, {"content", st->text}};
        if (st->parse) message = json::parse(st->parse->message().dump());
        json choice = chat ? json{{"index", 0},
                                  {"message", std::move(message)},
                                  {"logprobs", lp},
                                  {"finish_reason", finish}}
                           : json{{"index", 0},
                                  {"text", st->text},
                                  {"logprobs", lp},
                                  {"finish_reason", e.finish_reason}};
        json j = envelope(std::move(choice));
        j["usage"] = usage(e);
        j["timings"] = timings(e);
        j["kvstream"] = kvstream_figures(e);
        if (verbose) j["__verbose"] = native_final(job->request, e, st->text, {}, {}, false, {});
        out = dump(j);
      }
      break;
    }
    return done;
  });
}

std::string Api::random_id() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(rng()));
  return b;
}

// llama-server's form, "b" and a build: clients check that it starts so.
std::string Api::fingerprint() {
  return cat("b", KVS_VERSION, "-kvstream");
}

// Queues a request, or answers 503 when every slot is busy and the queue is full.
std::shared_ptr<Job> Api::submit(GenRequest r, httplib::Response& res) {
  auto job = std::make_shared<Job>(std::move(r));
  if (!sched.submit(job)) {
    res.set_header("Retry-After", "1");
    throw ApiError{503, "every slot is busy and the queue is full; retry later", "server_error",
                   "server_busy"};
  }
  return job;
}

void Api::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const json b = parse_body(req.body);
  GenRequest r = chat ? rules.chat_request(b) : rules.completion_request(b);
  const bool stream = boolean(b, "stream", false);
  bool include_usage = false;
  if (b.contains("stream_options") && b["stream_options"].is_object())
    include_usage = boolean(b["stream_options"], "include_usage", false);
  // The sampler checks its parameters; a bad one is the client's.
  try {
    Sampler check(r.sampling);
  } catch (const Error& e) {
    bad(e.what());
  }
  const int64_t n = integer(b, "n", 1, 1, 16);
  if (n > 1) {
    if (r.top_logprobs >= 0) bad("log-probabilities are not given for 'n' above 1", "n");
    choices(res, r, n, chat, stream, include_usage);
    return;
  }
  // __verbose (the prompt as rendered, ...) on request, or on every answer of a --verbose server.
  respond(res, submit(std::move(r), res), chat, stream, include_usage,
          boolean(b, "verbose", a.s.verbose));
}

json Api::model_json() const {
  return {{"id", model_id},
          {"object", "model"},
          {"created", started},
          {"owned_by", "kvstream"},
          {"aliases", aliases},
          {"tags", tags},
          {"meta",
           {{"n_ctx", eo.n_ctx},
            {"n_ctx_train", model.config.n_ctx_train},
            {"n_vocab", tok.n_vocab()},
            {"arch", model.config.arch_name},
            {"slots", eo.n_seq}}}};
}

void Api::routes(httplib::Server& svr) {
  // OpenAI's paths, and llama-server's chat path without /v1 (its /completions is its own).
  for (const char* path : {"/v1/chat/completions", "/chat/completions"})
    svr.Post(path, guarded([this](const auto& req, auto& res) { generate(req, res, true); }));
  svr.Post("/v1/completions",
           guarded([this](const auto& req, auto& res) { generate(req, res, false); }));
  // The chat page (chat_page.html, embedded at build time); it asks for the key itself.
  svr.Get("/", guarded([this](const auto&, auto& res) {
    if (a.no_ui) throw ApiError{404, "no chat page (--no-ui)", "invalid_request_error", "not_found"};
    res.set_content(kChatPage, "text/html");
  }));
  for (const char* path : {"/health", "/v1/health"})
    svr.Get(path, [](const auto&, auto& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
  svr.Get(R"(/(v1/)?models)", [this](const auto&, auto& res) {
    // OpenAI's list, and llama-server's "models" beside it.
    const json m = model_json();
    json lm = {{"name", model_id}, {"model", model_id}, {"type", "model"}, {"tags", tags}};
    res.set_content(dump({{"object", "list"},
                          {"data", json::array({m})},
                          {"models", json::array({lm})}}),
                    "application/json");
  });
  auto not_supported = [](const std::string& what) {
    return ApiError{501, what, "not_supported_error", "", "", {{"code", 501}}};
  };
  svr.Get("/metrics", guarded([this, not_supported](const auto&, auto& res) {
    if (!a.metrics) throw not_supported("this server has no metrics endpoint (start it with --metrics)");
    res.set_header("Process-Start-Time-Unix", std::to_string(started));
    res.set_content(metrics() + llamacpp_metrics(), "text/plain; version=0.0.4");
  }));
  svr.Get("/slots", guarded([this, not_supported](const auto&, auto& res) {
    if (!a.slots) throw not_supported("this server has no slots endpoint (started with --no-slots)");
    res.set_content(dump(slots()), "application/json");
  }));
  native_routes(svr);
  anthropic_routes(svr);
  // CORS, authorisation and the request count before routing; OpenAI bodies for what httplib
  // answers itself (404, 413, ...).
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    ++http_requests;
    const std::string origin = req.get_header_value("Origin");
    if (a.cors_origins == "localhost") {
      if (!origin.empty() && origin_is_localhost(origin))
        res.set_header("Access-Control-Allow-Origin", origin);
    } else if (a.cors_origins == "*") {
      // Credentials are allowed, so the origin is echoed rather than "*" (as llama-server).
      res.set_header("Access-Control-Allow-Origin", origin.empty() ? "*" : origin);
    } else {
      for (const std::string& o : split_list(a.cors_origins))
        if (o == origin) res.set_header("Access-Control-Allow-Origin", origin);
    }
    if (req.method == "OPTIONS") {  // a preflight: browsers send it without the key
      res.set_header("Access-Control-Allow-Credentials", "true");
      res.set_header("Access-Control-Allow-Methods", a.cors_methods);
      res.set_header("Access-Control-Allow-Headers", a.cors_headers);
      res.status = 200;
      res.set_content("", "text/html");
      return httplib::Server::HandlerResponse::Handled;
    }
    // Without either header a request has no body (RFC 9112), where httplib would read one
    // until the client closes the connection or --timeout passes.
    if ((req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
        !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
      send_error(res, ApiError{411,
                               cat("a ", req.method,
                                   " needs a body with a Content-Length (or chunked) header"),
                               "invalid_request_error", "length_required"});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (a.api_key.empty() || req.path == "/health" || req.path == "/v1/health" ||
        (req.path == "/" && !a.no_ui))
      return httplib::Server::HandlerResponse::Unhandled;
    // Authorization: Bearer KEY, or Anthropic's X-Api-Key; --api-key may list several.
    std::string key = req.get_header_value("Authorization");
    if (key.empty()) key = req.get_header_value("X-Api-Key");
    if (key.rfind("Bearer ", 0) == 0) key = key.substr(7);
    for (const std::string& k : split_list(a.api_key))
      if (!key.empty() && key == k) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError{401,
                             "invalid or missing API key (Authorization: Bearer KEY, or "
                             "X-Api-Key: KEY)",
                             "authentication_error", "invalid_api_key", "", {{"code", 401}}});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      const auto it = kMethods.find(req.path);
      if (it != kMethods.end()) {
        res.status = 405;
        res.set_header("Allow", it->second);
        send_error(
            res,
            ApiError{405, cat(req.method, " is not allowed on ", req.path, " (", it->second, ")"),
                     "invalid_request_error", "method_not_allowed"});
        return;
      }
    }
    // httplib caps form-encoded bodies (curl -d without a Content-Type) at 8 KiB.
    const bool form = req.get_header_value("Content-Type") == "application/x-www-form-urlencoded";
    const std::string what =
        res.status == 404 ? "no such endpoint"
        : res.status == 413
            ? (form ? "the request is too large for a form-encoded body; send it as "
                      "Content-Type: application/json"
                    : "the request is too large (--max-request-size)")
            : cat("HTTP status ", res.status);
    send_error(res, ApiError{res.status, what,
                             res.status >= 500 ? "server_error" : "invalid_request_error",
                             res.status == 404 ? "not_found" : ""});
  });
  svr.set_logger([this](const auto& req, const auto& res) {
    if (res.status >= 400) ++http_errors;
    if (a.s.verbose)
      std::fprintf(stderr, "kvstream: %s %s %d\n", req.method.c_str(), req.path.c_str(),
                   res.status);
  });
}

void serve(const ServeArgs& a) {
  // SIGINT and SIGTERM go to one thread that stops the server: blocked before any thread
  // starts (the kernels' pool, the device's copy threads), so that every thread inherits the
  // mask; one that arrives while the model loads stops the server once it is up.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  const std::string backend = backend_of(a.s);
  check_flash_attn(a.s);
  apply_threads(a.s);
  n_predict_of(a.g);
  KVS_CHECK(a.port >= 0 && a.port <= 65535, "--port ", a.port, " is out of range (0 to 65535)");
  KVS_CHECK(a.queue >= 0, "--queue must be 0 or more");
  KVS_CHECK(a.timeout >= 1, "--timeout must be at least 1 second, got ", a.timeout);
  KVS_CHECK(a.threads_http == -1 || a.threads_http >= 1,
            "--threads-http must be -1 (automatic) or at least 1, got ", a.threads_http);
  Sampler check(a.g.sp);
  if (a.embedding)
    std::fprintf(stderr,
                 "kvstream: warning: --embedding/--reranking: kvstream serves no embeddings or "
                 "reranking; those endpoints answer 404\n");
  const size_t max_body = parse_size(a.max_body, "--max-request-size");
  const size_t vram = vram_limit_of(a.s);
  auto model = Model::load(a.s.model);
  apply_chat_template_flags(*model->tokenizer, a.chat);
  EngineOptions eo = engine_options(a.s, model->config);
  // -c is the whole KV over the slots, as llama-server's (-c 512 -np 2: 256 tokens a slot);
  // --kv-unified lets each slot reach all of it.
  if (!a.kv_unified) {
    KVS_CHECK(eo.n_ctx >= eo.n_seq, "-c/--ctx-size ", eo.n_ctx, " is less than a token for each of ",
              "the ", eo.n_seq, " slots (-np); -c is the total over the slots");
    eo.n_ctx /= eo.n_seq;
  }
  if (!a.slot_save_path.empty())
    KVS_CHECK(std::filesystem::is_directory(a.slot_save_path),
              "--slot-save-path: not a directory: ", a.slot_save_path);
  eo.cache_ram = cache_ram_of(a.cache_ram);
  KVS_CHECK(a.ctx_checkpoints >= 0, "--ctx-checkpoints must be 0 or more");
  eo.ctx_checkpoints = a.ctx_checkpoints;
  eo.cache_disk = a.cache_disk;
  eo.cache_disk_bytes = static_cast<size_t>(parse_size(a.cache_disk_size, "--cache-disk-size"));
  apply_speculation(a.spec, eo, backend);
  const auto draft_model = load_draft(a.spec, *model);
  check_host_kv(eo, model->config, backend);
  auto dev = device_of(a.s, backend, vram);
  const auto drafter = make_drafter(a.spec, draft_model.get(), *model, *dev, eo);
  const auto mtp = make_mtp(a.spec, *model, *dev, eo);
  Engine eng(*model, *dev, eo, mtp ? &mtp->engine() : nullptr);
  for (const std::string& w : eng.prompt_cache_warnings())  // the disk tier's refused files
    std::fprintf(stderr, "kvstream: %s\n", w.c_str());
  Speculator spec(spec_options(a.spec), eng, drafter.get(), mtp.get());

  note_no_template(*model->tokenizer, a.s.model,
                   "/v1/chat/completions continues the messages' texts, a plain completion");
  Scheduler sched(eng, *model->tokenizer, a.queue, a.s.verbose, spec.on() ? &spec : nullptr);
  std::vector<std::string> aliases = split_list(a.alias);
  // llama-server names the model by its first alias in sorted order.
  std::sort(aliases.begin(), aliases.end());
  const std::string id =
      aliases.empty() ? std::filesystem::path(a.s.model).filename().string() : aliases.front();
  Api api{a,
          *model,
          *model->tokenizer,
          eo,
          sched,
          id,
          aliases.empty() ? std::vector<std::string>{id} : aliases,
          split_list(a.tags),
          {*model->tokenizer, eo.n_ctx, a.g.sp, a.g.seed, n_predict_of(a.g), a.g.ignore_eos}};
  api.rules.context_shift = a.context_shift;
  api.rules.keep = a.keep;
  api.rules.split_reasoning = a.chat.split_reasoning();
  api.rules.enable_thinking = a.reasoning != "off";
  // One server per --host address (llama-server takes a comma-separated list), all on --port.
  const std::vector<std::string> hosts = split_list(a.host);
  KVS_CHECK(!hosts.empty(), "--host: no address given");
  std::vector<std::unique_ptr<httplib::Server>> servers;
  // A connection holds its thread while it waits for a request (kKeepAlive), reads one
  // (--timeout) or is answered: many more threads than slots, so that idle connections do
  // not make a new client wait.
  const size_t threads = static_cast<size_t>(
      a.threads_http > 0 ? a.threads_http : eo.n_seq + a.queue + kIdleConnections);
  int port = a.port;
  for (const std::string& host : hosts) {
    auto& svr = *servers.emplace_back(std::make_unique<httplib::Server>());
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    // SO_REUSEADDR only: httplib's default, SO_REUSEPORT, lets a second server share the port.
    svr.set_socket_options([](int sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    svr.set_keep_alive_timeout(kKeepAlive);
    svr.set_keep_alive_max_count(100);
    svr.set_payload_max_length(max_body);
    svr.set_read_timeout(a.timeout);
    svr.set_write_timeout(a.timeout);
    api.routes(svr);
    errno = 0;
    const int asked = port;
    if (port == 0)
      port = svr.bind_to_any_port(host);
    else if (!svr.bind_to_port(host, port))
      port = -1;
    KVS_CHECK(port > 0, "cannot listen on ", host, ":", asked,
              errno == EADDRINUSE ? " (--host, --port): the address is in use (another server?)"
              : errno != 0        ? cat(" (--host, --port): ", std::strerror(errno))
                                  : std::string(" (--host, --port)"));
  }
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    for (auto& svr : servers) svr->stop();
  });
  const PromptCacheStats* pc = eng.prompt_cache_stats();
  std::fprintf(
      stderr,
      "kvstream: serving %s (%s) on http://%s:%d, %d slots of -c %d, -b %d, "
      "kv-mode %s, arena %s, prompt cache %s, %d threads%s\n",
      id.c_str(), chat_template_name(*model->tokenizer).c_str(), a.host.c_str(), port, eo.n_seq, eo.n_ctx,
      eo.n_batch, kv_mode_name(eo.kv_mode), format_bytes(eng.arena_bytes()).c_str(),
      pc ? format_bytes(pc->budget).c_str() : "off", thread_pool().size(),
      a.spec.on() ? cat(", --spec ", a.spec.kind(), " up to ", a.spec.draft_max, " drafts").c_str()
                  : "");
  std::fflush(stderr);
  std::vector<std::thread> listeners;
  for (size_t i = 1; i < servers.size(); ++i)
    listeners.emplace_back([&svr = *servers[i]] { svr.listen_after_bind(); });
  servers.front()->listen_after_bind();
  for (auto& svr : servers) svr->stop();
  for (auto& t : listeners) t.join();
  if (stopper.joinable()) {
    pthread_kill(stopper.native_handle(), SIGTERM);
    stopper.join();
  }
  std::fprintf(stderr, "kvstream: server stopped\n");
}


}  // namespace kvs::cli
