#include "kvs/chat/chat_format.h"

#include <string>
#include <utility>

namespace kvs {

ChatFormat::ChatFormat(const std::string& source, std::string name, ChatTokens tokens,
                       nlohmann::ordered_json kwargs)
    : tmpl_(source, std::move(name)), tokens_(std::move(tokens)), kwargs_(std::move(kwargs)) {
  if (!kwargs_.is_object()) kwargs_ = nlohmann::ordered_json::object();
}

std::string ChatFormat::apply(const ChatInput& in) const {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages;
  if (in.tools.is_array() && !in.tools.empty()) ctx["tools"] = in.tools;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["bos_token"] = tokens_.bos;
  ctx["eos_token"] = tokens_.eos;
  for (const auto& [k, v] : kwargs_.items()) ctx[k] = v;
  if (in.kwargs.is_object())
    for (const auto& [k, v] : in.kwargs.items()) ctx[k] = v;
  std::string out = tmpl_.render(ctx);
  if (tokens_.add_bos && !tokens_.bos.empty() && out.starts_with(tokens_.bos))
    out.erase(0, tokens_.bos.size());
  if (tokens_.add_eos && !tokens_.eos.empty() && out.ends_with(tokens_.eos))
    out.resize(out.size() - tokens_.eos.size());
  return out;
}

bool ChatFormat::reads_tools() const {
  return source().find("tools") != std::string::npos;
}

std::string ChatFormat::builtin(const std::string& name) {
  // The formats kvstream followed before it rendered templates, as Jinja.
  if (name == "chatml")
    return "{%- for message in messages -%}\n"
           "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
           "{%- endfor -%}\n"
           "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";
  if (name == "llama3")
    return "{{- bos_token -}}\n"
           "{%- for message in messages -%}\n"
           "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + "
           "message.content | trim + '<|eot_id|>' -}}\n"
           "{%- endfor -%}\n"
           "{%- if add_generation_prompt -%}"
           "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}";
  if (name == "llama2")
    return "{%- set ns = namespace(sys='', first=true) -%}\n"
           "{%- for message in messages -%}\n"
           "{%- if message.role == 'system' -%}{%- set ns.sys = message.content -%}\n"
           "{%- elif message.role == 'user' -%}\n"
           "{{- (bos_token if not ns.first else '') + '[INST] ' -}}\n"
           "{%- if ns.sys -%}{{- '<<SYS>>\\n' + ns.sys + '\\n<</SYS>>\\n\\n' -}}{%- endif -%}\n"
           "{%- set ns.sys = '' -%}{%- set ns.first = false -%}\n"
           "{{- message.content + ' [/INST]' -}}\n"
           "{%- else -%}{{- ' ' + message.content + ' ' + eos_token -}}\n"
           "{%- endif -%}\n"
           "{%- endfor -%}";
  if (name == "gemma")
    return "{{- bos_token -}}\n"
           "{%- set ns = namespace(sys='') -%}\n"
           "{%- for message in messages -%}\n"
           "{%- if message.role == 'system' -%}{%- set ns.sys = ns.sys + message.content | trim "
           "-%}\n"
           "{%- else -%}\n"
           "{%- set role = 'model' if message.role == 'assistant' else message.role -%}\n"
           "{{- '<start_of_turn>' + role + '\\n' -}}\n"
           "{%- if ns.sys and role != 'model' -%}{{- ns.sys + '\\n\\n' -}}{%- set ns.sys = '' -%}"
           "{%- endif -%}\n"
           "{{- message.content | trim + '<end_of_turn>\\n' -}}\n"
           "{%- endif -%}\n"
           "{%- endfor -%}\n"
           "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}";
  if (name == "command-r")
    return "{%- for message in messages -%}\n"
           "{%- set token = {'system': 'SYSTEM', 'user': 'USER'}.get(message.role, 'CHATBOT') -%}\n"
           "{{- '<|START_OF_TURN_TOKEN|><|' + token + '_TOKEN|>' + message.content | trim + "
           "'<|END_OF_TURN_TOKEN|>' -}}\n"
           "{%- endfor -%}\n"
           "{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}"
           "{%- endif -%}";
  return "";
}

}  // namespace kvs
