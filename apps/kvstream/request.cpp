#include "request.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "kvs/chat/chat_format.h"
#include "kvs/grammar/json_schema.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"
#include "structured.h"

namespace kvs::cli {
namespace {

const json kNull;

std::string rtrim_ws(std::string s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r'))
    s.pop_back();
  return s;
}

}  // namespace

void bad(std::string message, std::string param, std::string code) {
  throw ApiError{400, std::move(message), "invalid_request_error", std::move(code),
                 std::move(param)};
}


double number(const json& b, const char* key, double def, double lo, double hi) {
  if (!b.contains(key) || b[key].is_null()) return def;
  if (!b[key].is_number()) bad(cat("'", key, "' must be a number"), key);
  const double v = b[key].get<double>();
  if (!(v >= lo && v <= hi)) bad(cat("'", key, "' must be in [", lo, ", ", hi, "], got ", v), key);
  return v;
}
int64_t integer(const json& b, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!b.contains(key) || b[key].is_null()) return def;
  if (!b[key].is_number_integer()) bad(cat("'", key, "' must be an integer"), key);
  const int64_t v = b[key].get<int64_t>();
  if (v < lo || v > hi) bad(cat("'", key, "' must be in [", lo, ", ", hi, "], got ", v), key);
  return v;
}
std::string text_of(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key)) return "";
  const json& v = o[key];
  return v.is_string() ? v.get_ref<const std::string&>() : std::string();
}
bool boolean(const json& b, const char* key, bool def) {
  if (!b.contains(key) || b[key].is_null()) return def;
  if (!b[key].is_boolean()) bad(cat("'", key, "' must be a boolean"), key);
  return b[key].get<bool>();
}


json parse_body(const std::string& body) {
  json b;
  try {
    b = json::parse(body);
  } catch (const json::exception& e) {
    bad(cat("the body is not valid JSON: ", e.what()));
  }
  if (!b.is_object()) bad("the body must be a JSON object");
  return b;
}

// The parts every generation request shares: the model, sampling, limits, stop strings.
GenRequest RequestRules::common(const json& b) const {
  // Any name: a server of one model answers whatever model a client names, as llama-server.
  if (b.contains("model") && !b["model"].is_null() && !b["model"].is_string())
    bad("'model' must be a string", "model");
  integer(b, "n", 1, 1, 16);  // more than 1: the chat endpoint's choices
  const int64_t slot = integer(b, "id_slot", -1, -1, INT32_MAX);
  GenRequest r;
  r.id_slot = static_cast<int32_t>(slot);
  SamplerParams& sp = r.sampling;
  sp = sampling;
  // Structured output: grammar, json_schema, response_format (structured.h).
  sp.grammar = request_grammar(b, tok);
  auto real = [&](const char* key, float def, double lo, double hi) {
    return static_cast<float>(number(b, key, static_cast<double>(def), lo, hi));
  };
  sp.temp = real("temperature", sp.temp, 0, 2);
  sp.top_p = real("top_p", sp.top_p, 0, 1);
  if (sp.top_p == 0) sp.top_p = 1e-9f;  // 0: only the best token, as greedy
  sp.top_k = static_cast<int32_t>(integer(b, "top_k", sp.top_k, 0, 1 << 30));
  sp.min_p = real("min_p", sp.min_p, 0, 1);
  sp.repeat_penalty = real("repeat_penalty", sp.repeat_penalty, 1e-3, 10);
  r.presence_penalty = real("presence_penalty", 0, -2, 2);
  r.frequency_penalty = real("frequency_penalty", 0, -2, 2);
  r.ignore_eos = boolean(b, "ignore_eos", ignore_eos);
  r.context_shift = context_shift;
  r.n_keep = static_cast<int32_t>(integer(b, "n_keep", keep, -1, INT32_MAX));
  r.n_discard = static_cast<int32_t>(integer(b, "n_discard", 0, 0, INT32_MAX));
  r.return_progress = boolean(b, "return_progress", false);
  r.timings_per_token = boolean(b, "timings_per_token", false);
  r.logit_bias = logit_bias(b);
  const int64_t asked_seed = integer(b, "seed", seed, INT64_MIN, INT64_MAX);
  sp.seed = asked_seed >= 0 ? static_cast<uint64_t>(asked_seed) : Sampler::kSeedRandom;
  const int64_t max_tokens = integer(b, "max_tokens", n_predict, -1, INT32_MAX);
  r.max_tokens = integer(b, "max_completion_tokens", max_tokens, -1, INT32_MAX);
  if (r.max_tokens == 0) bad("'max_tokens' must be at least 1", "max_tokens");
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& st = b["stop"];
    if (st.is_string()) {
      r.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 16) {
      for (const json& s : st) {
        if (!s.is_string()) bad("'stop' must be a string or a list of strings", "stop");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or a list of at most 16 strings", "stop");
    }
    std::erase_if(r.stop, [](const std::string& s) { return s.empty(); });
  }
  return r;
}

// A prompt of n_tokens (or, with `bytes`, of that much text and at least n_tokens) that
// leaves no room in the context, in llama-server's shape.
void RequestRules::too_long(size_t n_tokens, size_t bytes, const char* field) const {
  const std::string what = bytes > 0
                               ? cat(bytes, " bytes of text, at least ", n_tokens, " tokens")
                               : cat(n_tokens, " tokens");
  throw ApiError{400,
                 cat("the request (", what, ") exceeds the available context size (", n_ctx,
                     " tokens a slot: -c over -np), which must leave room for a generated token"),
                 "exceed_context_size_error",
                 "",
                 field,
                 {{"code", 400}, {"n_prompt_tokens", n_tokens}, {"n_ctx", n_ctx}}};
}
// Refuses, before it is tokenized, a text too long to fit the context whatever its tokens.
void RequestRules::check_text_size(size_t bytes, const char* field) const {
  const size_t per_token = tok.max_token_bytes();
  if (bytes >= static_cast<size_t>(n_ctx) * per_token)
    too_long((bytes + per_token - 1) / per_token, bytes, field);
}

// The prompt's tokens into r, refused when they leave no room in the context.
void RequestRules::set_prompt(GenRequest& r, std::vector<int32_t> ids, const char* field) const {
  if (ids.empty()) bad("the prompt is empty", field);
  if (static_cast<int64_t>(ids.size()) >= n_ctx) too_long(ids.size(), 0, field);
  r.prompt = std::move(ids);
}

namespace {

using ojson = nlohmann::ordered_json;

// A message's text parts joined ("content": [{"type": "text", "text": ...}]), counted into
// `bytes`.
std::string message_text(const json& c, size_t& bytes) {
  std::string text;
  for (const json& part : c) {
    if (text_of(part, "type") != "text" || !part.contains("text") || !part["text"].is_string())
      bad("only text content parts are supported", "messages");
    bytes += part["text"].get_ref<const std::string&>().size();
    if (!text.empty()) text += "\n\n";  // parts become paragraphs, as llama-server joins them
    text += part["text"].get<std::string>();
  }
  return text;
}

// A message as templates read it: the content a string, tool calls' arguments an object where
// they are JSON (templates print them with tojson or iterate them), as llama-server passes them.
ojson template_message(const json& m, const std::string& role, std::string text,
                       bool null_content) {
  ojson out = ojson::parse(m.dump());
  out["role"] = role;
  // A null content (an assistant's tool calls) is empty text: templates such as Qwen3's call
  // string methods on it.
  out["content"] = null_content ? ojson("") : ojson(std::move(text));
  if (out.contains("tool_calls")) {
    if (!out["tool_calls"].is_array()) bad("'tool_calls' must be a list", "messages");
    for (ojson& c : out["tool_calls"]) {
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
          !c["function"].contains("name") || !c["function"]["name"].is_string())
        bad("a tool call needs 'function' with a 'name'", "messages");
      ojson& f = c["function"];
      if (f.contains("arguments") && f["arguments"].is_string()) {
        ojson args = ojson::parse(f["arguments"].get<std::string>(), nullptr, false);
        if (args.is_object()) f["arguments"] = std::move(args);
      }
    }
  }
  return out;
}

// The tool a request's tool_choice forces: "" for none ("auto", "none", absent), "*" for any
// ("required"), else the function's name.
std::string forced_tool(const json& b) {
  if (!b.contains("tool_choice") || b["tool_choice"].is_null()) return "";
  const json& tc = b["tool_choice"];
  if (tc.is_string()) return tc.get<std::string>() == "required" ? "*" : "";
  const json f = tc.value("function", json::object());
  if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
    bad("a 'tool_choice' object needs 'function': {'name': ...}", "tool_choice");
  return f["name"].get<std::string>();
}

// The grammar of an answer that is one call of `only` ("*": any of the tools) in the
// template's convention, after the model's reasoning where it thinks first.
// Qwen3.5's XML call of one of the tools: <function=NAME> and <parameter=P> blocks of the
// tool's parameters, whose values follow the parameter's type where it is a number, an integer
// or a boolean, and are any text without "</" otherwise (the parser reads them so).
std::string xml_call_gbnf(const ojson& tools, const std::string& only) {
  std::string calls, rules;
  int k = 0;
  for (const ojson& t : tools) {
    const ojson f = t.value("function", ojson::object());
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    const std::string name = f["name"].get<std::string>();
    if (only != "*" && name != only) continue;
    std::string params;
    if (f.contains("parameters") && f["parameters"].is_object() &&
        f["parameters"].contains("properties") && f["parameters"]["properties"].is_object())
      for (const auto& [p, schema] : f["parameters"]["properties"].items()) {
        std::string type;
        if (const auto it = schema.find("type"); it != schema.end() && it->is_string())
          type = it->get<std::string>();
        const char* value = type == "integer"   ? "xml-int"
                            : type == "number"  ? "xml-num"
                            : type == "boolean" ? "xml-bool"
                                                : "xml-value";
        params += cat(params.empty() ? "" : " | ", "\"<parameter=\" ", ojson(p).dump(),
                      " \">\\n\" ", value, " \"\\n</parameter>\\n\"");
      }
    const std::string r = cat("call-", k++);
    calls += cat(calls.empty() ? "" : " | ", r);
    rules += cat(r, " ::= \"<function=\" ", ojson(name).dump(), " \">\\n\" ");
    if (!params.empty()) rules += cat("(", params, ")* ");
    rules += "\"</function>\"\n";
  }
  if (calls.empty()) return "";
  return cat("tool-call ::= ", calls, "\n", rules,
             "xml-value ::= ( [^<] | \"<\" [^/] )*\n"
             "xml-int ::= \"-\"? [0-9]+\n"
             "xml-num ::= \"-\"? [0-9]+ (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
             "xml-bool ::= \"true\" | \"false\"\n");
}

std::string tool_call_gbnf(const ChatParseOptions& o, const std::string& only) {
  const char* args = o.tools == ToolSyntax::Hermes   ? "arguments"
                     : o.tools == ToolSyntax::Llama3 ? "parameters"
                                                     : nullptr;
  if (o.tools == ToolSyntax::XmlParams && o.tool_defs.is_array()) {
    std::string gbnf = xml_call_gbnf(o.tool_defs, only);
    if (gbnf.empty()) bad(cat("'tool_choice' names '", only, "', which is not among the tools"), "tool_choice");
    const std::string call = "\"<tool_call>\\n\" tool-call \"\\n</tool_call>\"";
    const std::string think = "( [^<] | \"<\" [^/] )* \"</think>\" [ \\n]*";
    if (o.thinking_open) return cat("root ::= ", think, " ", call, "\n", gbnf);
    if (o.reasoning) return cat("root ::= (\"<think>\" ", think, ")? ", call, "\n", gbnf);
    return cat("root ::= ", call, "\n", gbnf);
  }
  if (!args || !o.tool_defs.is_array()) return "";
  ojson any = ojson::array();
  for (const ojson& t : o.tool_defs) {
    const ojson f = t.value("function", ojson::object());
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    const std::string name = f["name"].get<std::string>();
    if (only != "*" && name != only) continue;
    const ojson params = f.contains("parameters") && f["parameters"].is_object()
                             ? f["parameters"]
                             : ojson{{"type", "object"}};
    any.push_back({{"type", "object"},
                   {"properties", {{"name", {{"const", name}}}, {args, params}}},
                   {"required", {"name", args}}});
  }
  if (any.empty()) bad(cat("'tool_choice' names '", only, "', which is not among the tools"), "tool_choice");
  std::string gbnf = grammar::json_schema_to_gbnf(any.size() == 1 ? any[0] : ojson{{"anyOf", any}});
  gbnf.replace(0, gbnf.find("::="), "tool-call ");
  const std::string call = o.tools == ToolSyntax::Hermes
                               ? "\"<tool_call>\\n\" tool-call \"</tool_call>\""
                               : "tool-call";
  const std::string think = "( [^<] | \"<\" [^/] )* \"</think>\" [ \\n]*";
  if (o.thinking_open) return cat("root ::= ", think, " ", call, "\n", gbnf);
  if (o.reasoning) return cat("root ::= (\"<think>\" ", think, ")? ", call, "\n", gbnf);
  return cat("root ::= ", call, "\n", gbnf);
}

}  // namespace

GenRequest RequestRules::chat_request(const json& b) const {
  GenRequest r = common(b);
  if (b.contains("logprobs") && boolean(b, "logprobs", false))
    r.top_logprobs = static_cast<int32_t>(integer(b, "top_logprobs", 0, 0, 20));
  else if (b.contains("top_logprobs") && !b["top_logprobs"].is_null())
    bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  set_prompt(r, tok.encode(chat_text(b, &r.chat), true, true), "messages");
  // tool_choice "required" or a named function: the answer is held to a call by a grammar.
  const std::string only = forced_tool(b);
  if (!only.empty() && r.chat.tools != ToolSyntax::None) {
    const std::string gbnf = tool_call_gbnf(r.chat, only);
    if (!gbnf.empty()) {
      if (r.sampling.grammar)
        bad("a forced 'tool_choice' cannot be combined with a grammar or response_format",
            "tool_choice");
      r.sampling.grammar = constraint_of(gbnf, tok);
    }
  }
  return r;
}

std::string RequestRules::chat_text(const json& b, ChatParseOptions* parse) const {
  if (!b.contains("messages")) bad("'messages' is required", "messages");
  const json& ms = b["messages"];
  if (!ms.is_array() || ms.empty()) bad("'messages' must be a non-empty list", "messages");
  ChatInput in;
  size_t bytes = 0;
  for (const json& m : ms) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("every message needs a 'role'", "messages");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(cat("message role '", role,
              "' is not supported (system, developer, user, assistant, tool)"),
          "messages");
    std::string text;
    const json& c = m.contains("content") ? m["content"] : kNull;
    if (c.is_string()) {
      check_text_size(bytes += c.get_ref<const std::string&>().size(), "messages");
      text = c.get<std::string>();
    } else if (c.is_array()) {
      text = message_text(c, bytes);
      check_text_size(bytes, "messages");
    } else if (!c.is_null() || role != "assistant") {
      bad("a message's 'content' must be a string or a list of text parts", "messages");
    }
    in.messages.push_back(template_message(m, role, std::move(text), c.is_null()));
  }
  // Tools go to the template (unless tool_choice is "none"), and the answer is parsed for
  // calls in the template's convention.
  std::string choice = "auto";
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const json& tc = b["tool_choice"];
    if (tc.is_string()) {
      choice = tc.get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        bad("'tool_choice' must be 'auto', 'none', 'required' or a function", "tool_choice");
    } else if (!tc.is_object()) {
      bad("'tool_choice' must be a string or an object", "tool_choice");
    }
  }
  if (b.contains("tools") && !b["tools"].is_null()) {
    if (!b["tools"].is_array()) bad("'tools' must be a list", "tools");
    for (const json& t : b["tools"])
      if (!t.is_object()) bad("every tool must be an object", "tools");
    if (choice != "none" && !b["tools"].empty()) in.tools = ojson::parse(b["tools"].dump());
  }
  if (b.contains("chat_template_kwargs") && !b["chat_template_kwargs"].is_null()) {
    if (!b["chat_template_kwargs"].is_object())
      bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    in.kwargs = ojson::parse(b["chat_template_kwargs"].dump());
  }
  bool split = split_reasoning;
  if (b.contains("reasoning_format") && !b["reasoning_format"].is_null()) {
    const std::string f =
        b["reasoning_format"].is_string() ? b["reasoning_format"].get<std::string>() : "";
    if (f != "none" && f != "auto" && f != "deepseek" && f != "deepseek-legacy")
      bad("'reasoning_format' must be none, auto, deepseek or deepseek-legacy", "reasoning_format");
    split = f != "none";
  }
  // A final assistant message is continued, not answered (llama-server's assistant prefill,
  // vLLM's continue_final_message): the template closes the turns before it and opens the
  // assistant's, and its text follows.
  const bool continue_final = boolean(b, "continue_final_message", false);
  in.add_generation_prompt = boolean(b, "add_generation_prompt", true);
  if (continue_final && b.contains("add_generation_prompt") && in.add_generation_prompt)
    bad("'continue_final_message' and 'add_generation_prompt' cannot both be true",
        "continue_final_message");
  std::string prefill;
  if (in.messages.size() > 1 && in.messages.back()["role"] == "assistant" &&
      (continue_final || in.add_generation_prompt)) {
    if (in.messages[in.messages.size() - 2]["role"] == "assistant")
      bad("two assistant messages cannot end the conversation", "messages");
    const ojson& last = in.messages.back()["content"];
    prefill = last.is_string() ? last.get<std::string>() : "";
    in.messages.erase(in.messages.size() - 1);
    in.add_generation_prompt = true;
  } else if (continue_final) {
    bad("'continue_final_message' needs an assistant message last", "continue_final_message");
  }
  // What llama-server gives every template: whether to think (--reasoning), today's date in the
  // forms Llama 3.x and FireFunction read; a request's chat_template_kwargs override them.
  ojson defaults = {{"enable_thinking", enable_thinking}};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char date[64];
  if (std::strftime(date, sizeof date, "%d %b %Y", &tm)) defaults["date_string"] = date;
  if (std::strftime(date, sizeof date, "%b %d %Y %H:%M:%S GMT", &tm)) defaults["datetime"] = date;
  if (const ChatFormat* f = tok.chat_format()) {
    // FireFunction v2's template prints its tools from `functions` (llama.cpp spots it so).
    if (f->source().find(" functools[") != std::string::npos)
      defaults["functions"] = in.tools.is_array() ? in.tools.dump(2) : "";
    for (const auto& [k, v] : f->kwargs().items()) defaults.erase(k);  // --chat-template-kwargs
  }
  for (const auto& [k, v] : in.kwargs.items()) defaults[k] = v;
  in.kwargs = std::move(defaults);
  std::string prompt;
  try {
    prompt = tok.apply_chat(in) + prefill;
  } catch (const jinja::Error& e) {
    bad(cat("the chat template failed: ", e.what()), "messages");
  }
  const ChatFormat* f = tok.chat_format();
  if (parse && f) {
    ChatParseOptions& o = *parse;
    o.enabled = true;
    o.reasoning = split;
    o.tools = in.tools.is_array() ? tool_syntax_of(f->source()) : ToolSyntax::None;
    o.tool_defs = in.tools;
    // The template opened the model's reasoning (Qwen3.5's "<think>\n"): the answer starts in it.
    const std::string tail = rtrim_ws(prompt);
    o.thinking_open = tail.ends_with("<think>");
  }
  return prompt;
}

std::vector<int32_t> RequestRules::native_prompt(const json& p) const {
  if (p.is_object()) {
    if (p.contains("multimodal_data"))
      bad("this model takes no images or audio ('multimodal_data')", "prompt");
    if (!p.contains("prompt_string") || !p["prompt_string"].is_string())
      bad("a prompt object needs 'prompt_string'", "prompt");
    return native_prompt(p["prompt_string"]);
  }
  if (p.is_string()) {
    check_text_size(p.get_ref<const std::string&>().size(), "prompt");
    return tok.encode(p.get_ref<const std::string&>(), true, true);
  }
  if (!p.is_array()) bad("'prompt' must be a string, token ids or a list of them", "prompt");
  std::vector<int32_t> ids;
  for (const json& t : p) {
    if (t.is_string()) {
      check_text_size(t.get_ref<const std::string&>().size(), "prompt");
      // BOS only before text that opens the prompt, as llama-server's mixed prompts.
      const auto more = tok.encode(t.get_ref<const std::string&>(), ids.empty(), true);
      ids.insert(ids.end(), more.begin(), more.end());
    } else if (t.is_number_integer()) {
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v >= tok.n_vocab()) bad(cat("token id ", v, " is out of range"), "prompt");
      ids.push_back(static_cast<int32_t>(v));
    } else {
      bad("a prompt list holds token ids and strings", "prompt");
    }
    if (ids.size() >= static_cast<size_t>(n_ctx)) too_long(ids.size(), 0, "prompt");
  }
  return ids;
}

// llama-server's logit_bias: [[TOKEN or TEXT, BIAS or false], ...] or {"TOKEN" or "TEXT": BIAS};
// a text's bias goes to each of its tokens, false (or null) means never.
std::vector<std::pair<int32_t, float>> RequestRules::logit_bias(const json& b) const {
  std::vector<std::pair<int32_t, float>> out;
  if (!b.contains("logit_bias") || b["logit_bias"].is_null()) return out;
  auto add = [&](const json& key, const json& bias) {
    float v = 0;
    if (bias.is_number())
      v = bias.get<float>();
    else if (bias.is_boolean() && !bias.get<bool>())
      v = -INFINITY;
    else
      bad("a logit_bias value must be a number or false", "logit_bias");
    std::vector<int32_t> ids;
    if (key.is_number_integer()) {
      ids.push_back(static_cast<int32_t>(key.get<int64_t>()));
    } else if (key.is_string()) {
      const std::string& k = key.get_ref<const std::string&>();
      char* end = nullptr;
      const long id = std::strtol(k.c_str(), &end, 10);
      if (!k.empty() && end && *end == 0)
        ids.push_back(static_cast<int32_t>(id));
      else
        ids = tok.encode(k, false, false);
    } else {
      bad("a logit_bias key must be a token id or a text", "logit_bias");
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.n_vocab())
        bad(cat("logit_bias: token id ", id, " is out of range"), "logit_bias");
      out.emplace_back(id, v);
    }
  };
  const json& lb = b["logit_bias"];
  if (lb.is_object()) {
    for (const auto& [k, v] : lb.items()) add(json(k), v);
  } else if (lb.is_array()) {
    for (const json& e : lb) {
      if (!e.is_array() || e.size() != 2) bad("logit_bias entries are [token, bias] pairs", "logit_bias");
      add(e[0], e[1]);
    }
  } else {
    bad("'logit_bias' must be an object or a list of pairs", "logit_bias");
  }
  return out;
}

GenRequest RequestRules::native_request(const json& b, std::vector<int32_t> prompt) const {
  GenRequest r = common(b);
  // A request's n_predict replaces the server's -n (the default), as llama-server's.
  const int64_t n = integer(b, "n_predict", r.max_tokens, -1, INT32_MAX);
  if (n == 0) bad("'n_predict' must be -1 or at least 1", "n_predict");
  r.max_tokens = n;
  const int64_t n_probs = integer(b, "n_probs", 0, 0, 100);
  r.post_sampling_probs = boolean(b, "post_sampling_probs", false);
  r.top_logprobs = n_probs > 0 ? static_cast<int32_t>(n_probs) : -1;
  r.sampling.repeat_last_n =
      static_cast<int32_t>(integer(b, "repeat_last_n", r.sampling.repeat_last_n, -1, 1 << 30));
  // ignore_eos: end-of-generation tokens are never sampled, as llama-server does.
  if (r.ignore_eos)
    for (int32_t id = 0; id < tok.n_vocab(); ++id)
      if (tok.is_eog(id)) r.logit_bias.emplace_back(id, -INFINITY);
  set_prompt(r, std::move(prompt), "prompt");
  return r;
}

GenRequest RequestRules::completion_request(const json& b) const {
  GenRequest r = common(b);
  if (!b.contains("prompt")) bad("'prompt' is required", "prompt");
  const json* pp = &b["prompt"];
  if (pp->is_array() && pp->size() == 1 && (*pp)[0].is_string()) pp = &(*pp)[0];
  const json& p = *pp;
  if (boolean(b, "echo", false)) bad("'echo' is not supported", "echo");
  if (b.contains("suffix") && !b["suffix"].is_null()) bad("'suffix' is not supported", "suffix");
  r.top_logprobs = static_cast<int32_t>(integer(b, "logprobs", -1, 0, 20));
  if (p.is_string()) {
    check_text_size(p.get_ref<const std::string&>().size(), "prompt");
    set_prompt(r, tok.encode(p.get_ref<const std::string&>(), true, false), "prompt");
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    if (p.size() >= static_cast<size_t>(n_ctx)) too_long(p.size(), 0, "prompt");
    std::vector<int32_t> ids;
    for (const json& t : p) {
      if (!t.is_number_integer()) bad("a token prompt must be a list of integers", "prompt");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v >= tok.n_vocab()) bad(cat("token id ", v, " is out of range"), "prompt");
      ids.push_back(static_cast<int32_t>(v));
    }
    set_prompt(r, std::move(ids), "prompt");
  } else {
    bad("'prompt' must be a string, a list of one string or a list of token ids", "prompt");
  }
  return r;
}

}  // namespace kvs::cli
