// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), which Claude-Code-
// style agents speak (its routes also take OpenAI's /v1/responses, serve_responses.cpp): the body becomes a chat request (the same template, sampling and limits
// as /v1/chat/completions), the answer Anthropic's message or its event stream: tools, tool_use
// and tool_result blocks through the template's tool calls, thinking blocks from its reasoning;
// images are refused with 400 naming them.
#include <memory>
#include <optional>

#include "kvs/chat/chat_parse.h"
#include "kvs/util/error.h"
#include "serve.h"

namespace kvs::cli {
namespace {

// A system prompt or a text-only content: a string or a list of text blocks, as one text.
std::string anthropic_text(const json& c, const char* field) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(cat("'", field, "' must be a string or a list of content blocks"), field);
  std::string text;
  for (const json& block : c) {
    const std::string type = text_of(block, "type");
    if (type != "text" || !block.contains("text") || !block["text"].is_string())
      bad(cat("content blocks of type '", type,
              "' are not supported here (kvstream takes text, thinking, tool_use and "
              "tool_result blocks; no images)"),
          field);
    if (!text.empty()) text += "\n\n";
    text += block["text"].get<std::string>();
  }
  return text;
}

// Anthropic's tools ({name, description, input_schema}) as OpenAI's functions.
json openai_tools(const json& tools) {
  if (!tools.is_array()) bad("'tools' must be a list", "tools");
  json out = json::array();
  for (const json& t : tools) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      bad("every tool needs a 'name'", "tools");
    json f = {{"name", t["name"]}};
    if (t.contains("description")) f["description"] = t["description"];
    f["parameters"] = t.contains("input_schema") ? t["input_schema"] : json{{"type", "object"}};
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

// A message's blocks as OpenAI's messages: an assistant's text, thinking and tool_use become
// one message with reasoning_content and tool_calls; a user's tool_result blocks become tool
// messages (before the text that follows them), as llama-server converts them.
void add_messages(const json& m, json& msgs) {
  const std::string role = text_of(m, "role");
  if (role != "user" && role != "assistant")
    bad(cat("message role '", role, "' is not supported (user, assistant)"), "messages");
  const json c = m.value("content", json());
  if (!c.is_array()) {
    msgs.push_back({{"role", role}, {"content", anthropic_text(c, "messages")}});
    return;
  }
  std::string text, thinking;
  json calls = json::array();
  for (const json& block : c) {
    const std::string type = text_of(block, "type");
    if (type == "text" && block.contains("text") && block["text"].is_string()) {
      if (!text.empty()) text += "\n\n";
      text += block["text"].get<std::string>();
    } else if (type == "thinking" && role == "assistant") {
      thinking += block.value("thinking", "");
    } else if (type == "redacted_thinking" && role == "assistant") {
    } else if (type == "tool_use" && role == "assistant") {
      if (!block.contains("name") || !block["name"].is_string())
        bad("a tool_use block needs a 'name'", "messages");
      calls.push_back({{"id", block.value("id", "")},
                       {"type", "function"},
                       {"function",
                        {{"name", block["name"]},
                         {"arguments", dump(block.value("input", json::object()))}}}});
    } else if (type == "tool_result" && role == "user") {
      std::string result = anthropic_text(block.value("content", json()), "messages");
      if (block.value("is_error", false)) result = "Error: " + result;
      msgs.push_back(
          {{"role", "tool"}, {"tool_call_id", block.value("tool_use_id", "")}, {"content", result}});
    } else {
      bad(cat("content blocks of type '", type, "' are not supported in a ", role,
              " message (text, thinking, tool_use, tool_result; no images)"),
          "messages");
    }
  }
  if (role == "user" && text.empty() && !msgs.empty() && msgs.back()["role"] == "tool") return;
  json out = {{"role", role}, {"content", text}};
  if (!thinking.empty()) out["reasoning_content"] = thinking;
  if (!calls.empty()) {
    out["tool_calls"] = calls;
    if (text.empty()) out["content"] = nullptr;
  }
  msgs.push_back(std::move(out));
}

// The chat completion body of an Anthropic Messages body.
json chat_body(const json& b) {
  if (!b.contains("messages") || !b["messages"].is_array())
    bad("'messages' must be a list", "messages");
  json msgs = json::array();
  if (b.contains("system")) {
    const std::string sys = anthropic_text(b["system"], "system");
    if (!sys.empty()) msgs.push_back({{"role", "system"}, {"content", sys}});
  }
  for (const json& m : b["messages"]) add_messages(m, msgs);
  // An empty conversation is one empty user turn, as llama-server accepts it.
  if (msgs.empty() || msgs.back()["role"] == "system")
    msgs.push_back({{"role", "user"}, {"content", ""}});
  json out = {{"messages", msgs}};
  if (b.contains("tools") && !b["tools"].is_null()) out["tools"] = openai_tools(b["tools"]);
  if (b.contains("tool_choice") && b["tool_choice"].is_object()) {
    const json& tc = b["tool_choice"];
    const std::string type = text_of(tc, "type");
    if (type == "auto" || type == "none")
      out["tool_choice"] = type;
    else if (type == "any")
      out["tool_choice"] = "required";
    else if (type == "tool")
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc.value("name", "")}}}};
    else
      bad("'tool_choice' must be of type auto, any, tool or none", "tool_choice");
  }
  // Extended thinking: the template's enable_thinking follows it.
  if (b.contains("thinking") && b["thinking"].is_object())
    out["chat_template_kwargs"] = {{"enable_thinking", text_of(b["thinking"], "type") == "enabled"}};
  for (const char* k : {"temperature", "top_p", "top_k", "max_tokens", "return_progress", "timings_per_token"})
    if (b.contains(k)) out[k] = b[k];
  if (b.contains("stop_sequences")) out["stop"] = b["stop_sequences"];
  return out;
}

// A parsed tool call's arguments as the tool_use block's input (an object).
json tool_input(const std::string& arguments) {
  json in = json::parse(arguments, nullptr, false);
  return in.is_object() ? in : json::object();
}

}  // namespace

void Api::anthropic_routes(httplib::Server& svr) {
  svr.Post("/v1/messages/count_tokens", guarded([this](const auto& req, auto& res) {
    const json b = chat_body(parse_body(req.body));
    const auto ids = tok.encode(rules.chat_text(b), true, true);
    res.set_content(dump({{"input_tokens", ids.size()}}), "application/json");
  }));
  svr.Post("/v1/messages", guarded([this](const auto& req, auto& res) { messages(req, res); }));
  for (const char* path : {"/v1/responses", "/responses"})
    svr.Post(path, guarded([this](const auto& req, auto& res) { responses(req, res); }));
}

void Api::messages(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req.body);
  const json b = chat_body(body);
  GenRequest r = rules.chat_request(b);
  try {
    Sampler check(r.sampling);
  } catch (const Error& e) {
    bad(e.what());
  }
  const bool stream = boolean(body, "stream", false);
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  const ChatParseOptions parse_options = r.chat;
  auto job = submit(std::move(r), res);
  const std::string id = "msg_" + random_id();
  // The stream's content blocks: the one open (its type, "" for none) and how many began.
  struct State {
    std::string text;
    bool started = false;
    std::unique_ptr<ChatStream> parse;
    std::string open;
    int blocks = 0;
    bool tool_used = false;
  };
  auto st = std::make_shared<State>();
  if (parse_options.enabled) st->parse = std::make_unique<ChatStream>(parse_options);
  auto stop_reason = [st](const Event& e) {
    if (st->tool_used && e.stop_type != "limit") return "tool_use";
    return e.stop_type == "word" ? "stop_sequence" : e.stop_type == "limit" ? "max_tokens"
                                                                              : "end_turn";
  };
  auto usage = [](const Event& e) {
    return json{{"input_tokens", e.prompt_tokens},
                {"output_tokens", e.completion_tokens},
                {"cache_read_input_tokens", e.cached_tokens},
                {"cache_creation_input_tokens", 0}};
  };
  provide(res, job, stream, [=, this](std::vector<Event>& events, std::string& out) {
    auto sse = [&](const char* type, json j) {
      j["type"] = type;
      out += cat("event: ", type, "\ndata: ", dump(j), "\n\n");
    };
    auto close = [&] {
      if (st->open.empty()) return;
      if (st->open == "thinking")  // Anthropic's clients expect a signature before the stop
        sse("content_block_delta",
            {{"index", st->blocks - 1}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
      sse("content_block_stop", {{"index", st->blocks - 1}});
      st->open.clear();
    };
    auto begin = [&](const std::string& type, json block) {
      close();
      sse("content_block_start", {{"index", st->blocks++}, {"content_block", std::move(block)}});
      st->open = type;
    };
    // An OpenAI delta of the parsed answer as the stream's block events.
    auto emit = [&](const json& d) {
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
        if (st->open != "thinking") begin("thinking", {{"type", "thinking"}, {"thinking", ""}});
        sse("content_block_delta",
            {{"index", st->blocks - 1},
             {"delta", {{"type", "thinking_delta"}, {"thinking", d["reasoning_content"]}}}});
      }
      if (d.contains("content") && d["content"].is_string() &&
          !d["content"].get_ref<const std::string&>().empty()) {
        if (st->open != "text") begin("text", {{"type", "text"}, {"text", ""}});
        sse("content_block_delta",
            {{"index", st->blocks - 1}, {"delta", {{"type", "text_delta"}, {"text", d["content"]}}}});
      }
      if (d.contains("tool_calls") && d["tool_calls"].is_array())
        for (const json& c : d["tool_calls"]) {
          const json f = c.value("function", json::object());
          if (c.contains("id") || f.contains("name")) {
            st->tool_used = true;
            begin("tool_use", {{"type", "tool_use"},
                               {"id", c.value("id", "")},
                               {"name", f.value("name", "")},
                               {"input", json::object()}});
          }
          if (f.contains("arguments") && f["arguments"].is_string() && st->open == "tool_use")
            sse("content_block_delta", {{"index", st->blocks - 1},
                                        {"delta", {{"type", "input_json_delta"},
                                                   {"partial_json", f["arguments"]}}}});
        }
    };
    if (stream && !st->started) {
      st->started = true;
      sse("message_start", {{"message",
                             {{"id", id},
                              {"type", "message"},
                              {"role", "assistant"},
                              {"model", model_id},
                              {"content", json::array()},
                              {"stop_reason", nullptr},
                              {"stop_sequence", nullptr},
                              {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}}}});
    }
    bool done = false;
    for (Event& e : events) {
      if (!e.error.empty()) {
        const json err = {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", e.error}}}};
        out = stream ? cat("event: error\ndata: ", dump(err), "\n\n") : dump(err);
        done = true;
        break;
      }
      if (stream && !e.text.empty()) {
        if (st->parse)
          for (const auto& d : st->parse->push(e.text)) emit(json::parse(d.dump()));
        else
          emit({{"content", e.text}});
      }
      st->text += e.text;
      if (!e.done) continue;
      count_end(e);
      done = true;
      const json stop_seq = e.stop_type == "word" ? json(e.stopping_word) : json(nullptr);
      if (stream) {
        if (st->parse)
          for (const auto& d : st->parse->finish()) emit(json::parse(d.dump()));
        if (st->blocks == 0) begin("text", {{"type", "text"}, {"text", ""}});
        close();
        sse("message_delta", {{"delta", {{"stop_reason", stop_reason(e)}, {"stop_sequence", stop_seq}}},
                              {"usage", {{"output_tokens", e.completion_tokens}}}});
        sse("message_stop", json::object());
      } else {
        json content = json::array();
        if (st->parse) {
          st->parse->push(st->text);
          st->parse->finish();
          const json m = json::parse(st->parse->message().dump());
          if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
            content.push_back(
                {{"type", "thinking"}, {"thinking", m["reasoning_content"]}, {"signature", ""}});
          if (m.contains("content") && m["content"].is_string() &&
              !m["content"].get_ref<const std::string&>().empty())
            content.push_back({{"type", "text"}, {"text", m["content"]}});
          if (m.contains("tool_calls"))
            for (const json& c : m["tool_calls"]) {
              st->tool_used = true;
              content.push_back({{"type", "tool_use"},
                                 {"id", c.value("id", "")},
                                 {"name", c["function"].value("name", "")},
                                 {"input", tool_input(c["function"].value("arguments", "{}"))}});
            }
        }
        if (content.empty()) content.push_back({{"type", "text"}, {"text", st->text}});
        out = dump({{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", model_id},
                    {"content", content},
                    {"stop_reason", stop_reason(e)},
                    {"stop_sequence", stop_seq},
                    {"usage", usage(e)}});
      }
      break;
    }
    return done;
  });
}

}  // namespace kvs::cli
