// OpenAI's Responses API (POST /v1/responses, also /responses): `input` (a text, or messages
// of text parts) and `instructions` become a chat request; the answer is a response object with
// one message item, or its event stream (response.created ... response.completed). Text only:
// tools and non-text parts are refused with 400 naming them.
#include <ctime>
#include <memory>

#include "kvs/util/error.h"
#include "serve.h"

namespace kvs::cli {
namespace {

// A message's content: a string, or parts of type input_text/output_text/text.
std::string response_text(const json& c) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad("a message's 'content' must be a string or a list of parts", "input");
  std::string text;
  for (const json& part : c) {
    const std::string type = text_of(part, "type");
    if ((type != "input_text" && type != "output_text" && type != "text") ||
        !part.contains("text") || !part["text"].is_string())
      bad(cat("input parts of type '", type, "' are not supported (text only)"), "input");
    text += part["text"].get<std::string>();
  }
  return text;
}

json chat_body_of_response(const json& b) {
  if (b.contains("tools") && b["tools"].is_array() && !b["tools"].empty())
    bad("tools are not supported", "tools");
  json msgs = json::array();
  if (b.contains("instructions") && b["instructions"].is_string())
    msgs.push_back({{"role", "system"}, {"content", b["instructions"]}});
  if (!b.contains("input")) bad("'input' is required", "input");
  const json& in = b["input"];
  if (in.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", in}});
  } else if (in.is_array()) {
    for (const json& m : in) {
      if (!m.is_object() || !m.contains("role"))
        bad("every input item needs a 'role' (function calls are not supported)", "input");
      msgs.push_back({{"role", m["role"]}, {"content", response_text(m.value("content", json()))}});
    }
  } else {
    bad("'input' must be a string or a list of messages", "input");
  }
  json out = {{"messages", msgs}};
  for (const char* k : {"temperature", "top_p", "top_k", "seed", "return_progress", "timings_per_token"})
    if (b.contains(k)) out[k] = b[k];
  if (b.contains("max_output_tokens")) out["max_tokens"] = b["max_output_tokens"];
  return out;
}

}  // namespace

void Api::responses(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req.body);
  GenRequest r = rules.chat_request(chat_body_of_response(body));
  try {
    Sampler check(r.sampling);
  } catch (const Error& e) {
    bad(e.what());
  }
  const bool stream = boolean(body, "stream", false);
  const bool per_token = r.timings_per_token;
  auto job = submit(std::move(r), res);
  const std::string resp_id = "resp_" + random_id(), msg_id = "msg_" + random_id();
  const std::time_t created = std::time(nullptr);
  struct State {
    std::string text;
    bool started = false;
    int64_t seq = 0;
  };
  auto st = std::make_shared<State>();
  auto response = [=, this](const char* status, json output, const Event* e) {
    json j = {{"id", resp_id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"model", model_id},
              {"output", std::move(output)},
              {"parallel_tool_calls", false},
              {"tool_choice", "none"},
              {"tools", json::array()}};
    if (e) {
      j["completed_at"] = std::time(nullptr);
      j["usage"] = {{"input_tokens", e->prompt_tokens},
                    {"output_tokens", e->completion_tokens},
                    {"total_tokens", e->prompt_tokens + e->completion_tokens},
                    {"input_tokens_details", {{"cached_tokens", e->cached_tokens}}},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}}};
    }
    return j;
  };
  auto part = [](const std::string& text) {
    return json{{"type", "output_text"},
                {"text", text},
                {"annotations", json::array()},
                {"logprobs", json::array()}};
  };
  auto item = [=](const char* status, json content) {
    return json{{"id", msg_id},
                {"type", "message"},
                {"status", status},
                {"role", "assistant"},
                {"content", std::move(content)}};
  };
  provide(res, job, stream, [=, this](std::vector<Event>& events, std::string& out) {
    auto sse = [&](const char* type, json j) {
      j["type"] = type;
      j["sequence_number"] = st->seq++;
      out += cat("event: ", type, "\ndata: ", dump(j), "\n\n");
    };
    const json where = {{"item_id", msg_id}, {"output_index", 0}, {"content_index", 0}};
    if (stream && !st->started) {
      st->started = true;
      sse("response.created", {{"response", response("in_progress", json::array(), nullptr)}});
      sse("response.in_progress", {{"response", response("in_progress", json::array(), nullptr)}});
      sse("response.output_item.added",
          {{"output_index", 0}, {"item", item("in_progress", json::array())}});
      json added = where;
      added["part"] = part("");
      sse("response.content_part.added", added);
    }
    bool done = false;
    for (Event& e : events) {
      if (!e.error.empty()) {
        const json err = error_body(ApiError{500, e.error, "server_error"});
        out = stream ? cat("event: error\ndata: ", dump(err), "\n\n") : dump(err);
        done = true;
        break;
      }
      if (e.progress) {
        if (stream) {
          json p = {{"response", response("in_progress", json::array(), nullptr)},
                    {"prompt_progress", prompt_progress(*e.progress)}};
          if (per_token) p["timings"] = timings(e);
          sse("response.in_progress", std::move(p));
        }
        continue;
      }
      if (stream && !e.text.empty()) {
        json delta = where;
        delta["delta"] = e.text;
        if (per_token) delta["timings"] = timings(e);
        sse("response.output_text.delta", delta);
      }
      st->text += e.text;
      if (!e.done) continue;
      count_end(e);
      done = true;
      const json output = json::array({item("completed", json::array({part(st->text)}))});
      if (stream) {
        json text_done = where, part_done = where;
        text_done["text"] = st->text;
        part_done["part"] = part(st->text);
        sse("response.output_text.done", text_done);
        sse("response.content_part.done", part_done);
        sse("response.output_item.done", {{"output_index", 0}, {"item", output[0]}});
        sse("response.completed",
            {{"response", response("completed", output, &e)}, {"timings", timings(e)}});
      } else {
        out = dump(response("completed", output, &e));
      }
      break;
    }
    return done;
  });
}

}  // namespace kvs::cli
