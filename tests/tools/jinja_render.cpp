// Renders chat templates for tests/tools/test_chat_template.py, which renders the same cases with
// Python's jinja2 and compares: one JSON case a line on stdin ({"template": TEXT, "name": NAME,
// "context": {...}, "now": SECONDS}), one JSON answer a line on stdout ({"text": ...} or
// {"error": ...}).
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "kvs/chat/jinja.h"

int main() {
  using json = nlohmann::ordered_json;
  std::string line;
  while (std::getline(std::cin, line)) {
    json out;
    try {
      const json c = json::parse(line);
      const kvs::jinja::Template t(c.at("template").get<std::string>(),
                                   c.value("name", std::string("template")));
      kvs::jinja::RenderOptions o;
      o.now = c.value("now", int64_t{0});
      out["text"] = t.render(c.at("context"), o);
    } catch (const std::exception& e) {
      out["error"] = e.what();
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
