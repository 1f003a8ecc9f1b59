#include "kvs/chat/chat_parse.h"

#include <random>
#include <string>
#include <utility>

namespace kvs {
namespace {

using ojson = nlohmann::ordered_json;

bool ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
std::string ltrim(std::string s) {
  size_t b = 0;
  while (b < s.size() && ws(s[b])) ++b;
  return s.substr(b);
}
std::string rtrim(std::string s) {
  while (!s.empty() && ws(s.back())) s.pop_back();
  return s;
}

// Drops what a later piece could still turn into something else: a tail that begins `marker`,
// then trailing whitespace (it is sent once text follows it).
std::string hold_back(std::string s, const char* marker) {
  const std::string m = marker;
  for (size_t n = std::min(m.size() - 1, s.size()); n > 0; --n)
    if (s.compare(s.size() - n, n, m, 0, n) == 0) {
      s.resize(s.size() - n);
      break;
    }
  return rtrim(std::move(s));
}

bool prefix_of(const std::string& s, const char* marker) {
  const std::string m = marker;
  return s.size() < m.size() && m.compare(0, s.size(), s) == 0;
}

// {"name": ..., "arguments"|"parameters": {...}} into a call; false where it is not one.
bool json_call(const std::string& text, ToolCall& call) {
  const ojson j = ojson::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const ojson* args = j.contains("arguments")    ? &j["arguments"]
                      : j.contains("parameters") ? &j["parameters"]
                                                 : nullptr;
  call.name = j["name"].get<std::string>();
  if (!args || args->is_null())
    call.arguments = "{}";
  else if (args->is_string())
    call.arguments = args->get<std::string>();
  else
    call.arguments = args->dump();
  return true;
}

// The JSON-schema type of a tool's parameter ("" where the request does not say).
std::string param_type(const ojson& tools, const std::string& fn, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const ojson& t : tools) {
    const ojson& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || f.value("name", std::string()) != fn) continue;
    const ojson& p = f.contains("parameters") ? f["parameters"] : ojson();
    if (p.is_object() && p.contains("properties") && p["properties"].contains(param) &&
        p["properties"][param].is_object())
      return p["properties"][param].value("type", std::string());
  }
  return "";
}

// <function=NAME>\n<parameter=P>\nVALUE\n</parameter>...</function>: values are JSON where the
// tool's schema does not say string and they read as JSON, else strings.
bool xml_call(const std::string& text, const ojson& tools, ToolCall& call) {
  const size_t f = text.find("<function=");
  if (f == std::string::npos) return false;
  const size_t fe = text.find('>', f);
  if (fe == std::string::npos) return false;
  call.name = text.substr(f + 10, fe - f - 10);
  ojson args = ojson::object();
  size_t p = fe + 1;
  while ((p = text.find("<parameter=", p)) != std::string::npos) {
    const size_t pe = text.find('>', p);
    const size_t ve = pe == std::string::npos ? pe : text.find("</parameter>", pe);
    if (ve == std::string::npos) return false;
    const std::string name = text.substr(p + 11, pe - p - 11);
    std::string v = text.substr(pe + 1, ve - pe - 1);
    if (!v.empty() && v.front() == '\n') v.erase(0, 1);
    if (!v.empty() && v.back() == '\n') v.pop_back();
    const ojson parsed = param_type(tools, call.name, name) == "string"
                             ? ojson(ojson::value_t::discarded)
                             : ojson::parse(v, nullptr, false);
    args[name] = parsed.is_discarded() ? ojson(v) : parsed;
    p = ve + 12;
  }
  call.arguments = args.dump();
  return true;
}

void parse_tools(const std::string& body, const ChatParseOptions& o, bool partial, ChatMsg& m) {
  if (o.tools == ToolSyntax::None) {
    m.content = body;
    return;
  }
  if (o.tools == ToolSyntax::Llama3) {
    std::string t = ltrim(body);
    if (t.starts_with("<|python_tag|>")) t = ltrim(t.substr(14));
    if (partial) {
      // A JSON object may be a call: nothing is sent until it is whole.
      if (t.empty() || t[0] == '{' || prefix_of(t, "<|python_tag|>")) return;
      m.content = rtrim(body);
      return;
    }
    ToolCall c;
    if (!t.empty() && t[0] == '{' && json_call(rtrim(t), c))
      m.tool_calls.push_back(std::move(c));
    else
      m.content = body;
    return;
  }
  const size_t at = body.find("<tool_call>");
  if (at == std::string::npos) {
    m.content = partial ? hold_back(body, "<tool_call>") : body;
    return;
  }
  m.content = rtrim(body.substr(0, at));
  size_t p = at;
  while (p < body.size()) {
    if (body.compare(p, 11, "<tool_call>") != 0) {
      // Text after the calls: kept, as the model wrote it.
      if (!partial) m.content += body.substr(p);
      return;
    }
    const size_t e = body.find("</tool_call>", p);
    if (e == std::string::npos && partial) return;
    const std::string inner = body.substr(p + 11, e == std::string::npos ? e : e - p - 11);
    ToolCall c;
    const bool ok = o.tools == ToolSyntax::Hermes ? json_call(rtrim(ltrim(inner)), c)
                                                  : xml_call(inner, o.tool_defs, c);
    if (ok)
      m.tool_calls.push_back(std::move(c));
    else if (!partial)
      m.content += body.substr(p, e == std::string::npos ? e : e + 12 - p);
    if (e == std::string::npos) return;
    p = e + 12;
    while (p < body.size() && ws(body[p])) ++p;
  }
}

std::string call_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int k = 0; k < 24; ++k) id += kAlnum[rng() % (sizeof kAlnum - 1)];
  return id;
}

}  // namespace

ToolSyntax tool_syntax_of(const std::string& src) {
  if (src.find("<function=") != std::string::npos && src.find("<parameter=") != std::string::npos)
    return ToolSyntax::XmlParams;
  if (src.find("<tool_call>") != std::string::npos) return ToolSyntax::Hermes;
  if (src.find("<|start_header_id|>") != std::string::npos &&
      src.find("tools") != std::string::npos)
    return ToolSyntax::Llama3;
  return ToolSyntax::None;
}

const char* tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::Hermes:
      return "hermes";
    case ToolSyntax::XmlParams:
      return "xml-params";
    case ToolSyntax::Llama3:
      return "llama3";
    default:
      return "none";
  }
}

ChatMsg parse_chat_output(const std::string& text, const ChatParseOptions& o, bool partial) {
  ChatMsg m;
  if (!o.enabled) {
    m.content = text;
    return m;
  }
  std::string body = text;
  if (o.reasoning) {
    bool in_think = o.thinking_open;
    size_t start = 0;
    if (!in_think) {
      size_t k = 0;
      while (k < text.size() && ws(text[k])) ++k;
      if (text.compare(k, 7, "<think>") == 0) {
        in_think = true;
        start = k + 7;
      } else if (partial && (k == text.size() || prefix_of(text.substr(k), "<think>"))) {
        return m;  // may still open a <think>
      }
    }
    if (in_think) {
      const size_t e = text.find("</think>", start);
      if (e == std::string::npos) {
        const std::string r = ltrim(text.substr(start));
        m.reasoning = partial ? hold_back(r, "</think>") : rtrim(r);
        return m;
      }
      m.reasoning = rtrim(ltrim(text.substr(start, e - start)));
      body = ltrim(text.substr(e + 8));
    }
  }
  parse_tools(body, o, partial, m);
  return m;
}

std::vector<ojson> ChatStream::update(bool partial) {
  const ChatMsg m = parse_chat_output(text_, o_, partial);
  std::vector<ojson> out;
  // Texts only grow; a parse that would take back what was sent sends nothing more of it.
  if (m.reasoning.size() > msg_.reasoning.size() && m.reasoning.starts_with(msg_.reasoning)) {
    out.push_back({{"reasoning_content", m.reasoning.substr(msg_.reasoning.size())}});
    msg_.reasoning = m.reasoning;
  }
  if (m.content.size() > msg_.content.size() && m.content.starts_with(msg_.content)) {
    out.push_back({{"content", m.content.substr(msg_.content.size())}});
    msg_.content = m.content;
  }
  for (size_t k = msg_.tool_calls.size(); k < m.tool_calls.size(); ++k) {
    ToolCall c = m.tool_calls[k];
    c.id = call_id();
    out.push_back(
        {{"tool_calls",
          ojson::array({{{"index", k},
                         {"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}}})}});
    msg_.tool_calls.push_back(std::move(c));
  }
  return out;
}

std::vector<ojson> ChatStream::push(const std::string& text) {
  text_ += text;
  return update(true);
}

std::vector<ojson> ChatStream::finish() {
  return update(false);
}

ojson ChatStream::message() const {
  ojson j = {{"role", "assistant"}};
  j["content"] = msg_.content.empty() && !msg_.tool_calls.empty() ? ojson() : ojson(msg_.content);
  if (!msg_.reasoning.empty()) j["reasoning_content"] = msg_.reasoning;
  if (!msg_.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const ToolCall& c : msg_.tool_calls)
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    j["tool_calls"] = calls;
  }
  return j;
}

}  // namespace kvs
