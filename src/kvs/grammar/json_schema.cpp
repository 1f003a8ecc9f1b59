#include "kvs/grammar/json_schema.h"

#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvs/grammar/gbnf.h"
#include "kvs/grammar/regex.h"
#include "kvs/util/error.h"

namespace kvs::grammar {

namespace {

using json = nlohmann::ordered_json;

// Generic JSON, as llama.cpp's converter writes it; whitespace bounded, so a small model cannot
// pad forever. Every value rule ends in `space`.
const std::map<std::string, std::pair<std::string, std::vector<std::string>>> kPrimitives = {
    {"space", {"| \" \" | \"\\n\"{1,2} [ \\t]{0,20}", {}}},
    {"boolean", {"(\"true\" | \"false\") space", {"space"}}},
    {"null", {"\"null\" space", {"space"}}},
    {"decimal-part", {"[0-9]{1,16}", {}}},
    {"integral-part", {"[0] | [1-9] [0-9]{0,15}", {}}},
    {"number",
     {"(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space",
      {"integral-part", "decimal-part", "space"}}},
    {"integer", {"(\"-\"? integral-part) space", {"integral-part", "space"}}},
    {"char", {"[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})", {}}},
    {"string", {"\"\\\"\" char* \"\\\"\" space", {"char", "space"}}},
    {"value",
     {"object | array | string | number | boolean | null",
      {"object", "array", "string", "number", "boolean", "null"}}},
    {"object",
     {"\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" "
      "space",
      {"string", "value", "space"}}},
    {"array",
     {"\"[\" space ( value (\",\" space value)* )? \"]\" space", {"value", "space"}}},
    {"date", {"[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])", {}}},
    {"time",
     {"([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{3})? (\"Z\" | "
      "[+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])",
      {}}},
    {"date-time", {"date \"T\" time", {"date", "time"}}},
    {"uuid",
     {"[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
      "[0-9a-fA-F]{12}",
      {}}},
};

// Keywords that only describe: ignoring them changes nothing a grammar could enforce.
const std::set<std::string> kAnnotations = {
    "title",    "description", "default",    "examples",         "$schema",
    "$id",      "$comment",    "deprecated", "readOnly",         "writeOnly",
    "$defs",    "definitions", "contentEncoding", "contentMediaType", "discriminator",
    "strict",   "name",        "$anchor",    "xml",              "externalDocs", "example"};

// Keywords this converter reads.
const std::set<std::string> kRead = {
    "type",     "properties", "required", "additionalProperties", "items",     "prefixItems",
    "minItems", "maxItems",   "enum",     "const",                "anyOf",     "oneOf",
    "allOf",    "$ref",       "minLength", "maxLength",           "format",    "nullable",
    "pattern"};

class Converter {
 public:
  explicit Converter(const json& root) : root_(root) {}

  std::string run() {
    const std::string body = visit(root_, "root", "#");
    std::string out = "root ::= " + body + "\n";
    for (const auto& [name, def] : rules_) out += name + " ::= " + def + "\n";
    return out;
  }

 private:
  [[noreturn]] static void refuse(const std::string& where, const std::string& what) {
    fail(what, " (at ", where, ")");
  }

  std::string primitive(const std::string& name) {
    if (!rules_.count(name)) {
      const auto& [def, deps] = kPrimitives.at(name);
      rules_[name] = def;
      for (const std::string& d : deps) primitive(d);
    }
    return name;
  }

  // A rule for `def` named after `hint`, reusing one of the same definition.
  std::string rule(const std::string& hint, const std::string& def) {
    if (const auto it = by_def_.find(def); it != by_def_.end()) return it->second;
    std::string base;
    for (char c : hint) base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    std::string name = base;
    for (int i = 1; rules_.count(name) || kPrimitives.count(name) || name == "root"; ++i)
      name = cat(base, "-", i);
    rules_[name] = def;
    by_def_[def] = name;
    return name;
  }

  std::string literal(const json& v) { return gbnf_literal(v.dump()) + " " + primitive("space"); }

  const json& resolve(const std::string& ref, const std::string& where) const {
    if (ref == "#") return root_;
    if (ref.rfind("#/", 0) != 0) refuse(where, cat("$ref '", ref, "' is not local (#/...)"));
    try {
      return root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      refuse(where, cat("$ref '", ref, "' points at nothing"));
    }
  }

  // A GBNF expression for schema s (`name`: a hint for its rules; `where`: its JSON path).
  std::string visit(const json& s, const std::string& name, const std::string& where) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(where, "the schema false accepts nothing");
      return primitive("value");
    }
    if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      if (kRead.count(k) || kAnnotations.count(k)) continue;
      if (k == "uniqueItems" && v == false) continue;
      refuse(where, cat("the keyword '", k, "' is not supported"));
    }
    if (s.contains("nullable") && s["nullable"] == true) {
      json t = s;
      t.erase("nullable");
      return "(" + visit(t, name, where) + " | " + primitive("null") + ")";
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) refuse(where, "$ref must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
      std::string hint = ref.substr(ref.rfind('/') + 1);
      if (hint.empty() || hint == "#") hint = "ref";
      std::string n = hint;
      for (int i = 1; rules_.count(n) || kPrimitives.count(n) || n == "root"; ++i) n = cat(hint, "-", i);
      refs_[ref] = n;  // before the visit, so that a recursive schema refers to itself
      rules_[n] = "";
      rules_[n] = visit(resolve(ref, where), n, ref);
      return n;
    }
    if (s.contains("const")) return literal(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) refuse(where, "enum must be a non-empty list");
      std::string alts;
      for (const json& v : s["enum"]) alts += (alts.empty() ? "" : " | ") + literal(v);
      return rule(name, alts);
    }
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(k)) continue;
      const json& list = s[k];
      if (!list.is_array() || list.empty()) refuse(where, cat(k, " must be a non-empty list"));
      if (std::string(k) == "allOf" && list.size() > 1) refuse(where, "allOf of several schemas is not supported");
      std::string alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts += (i ? " | " : "") + visit(list[i], cat(name, "-", i), cat(where, "/", k, "/", i));
      return rule(name, alts);
    }
    if (s.contains("type") && s["type"].is_array()) {
      std::string alts;
      for (const json& t : s["type"]) {
        json one = s;
        one["type"] = t;
        alts += (alts.empty() ? "" : " | ") + visit(one, name, where);
      }
      if (alts.empty()) refuse(where, "type must not be an empty list");
      return rule(name, alts);
    }
    std::string type = s.contains("type") && s["type"].is_string() ? s["type"].get<std::string>() : "";
    if (s.contains("type") && !s["type"].is_string()) refuse(where, "type must be a string or a list");
    if (type.empty()) {
      if (s.contains("properties") || s.contains("additionalProperties")) type = "object";
      else if (s.contains("items") || s.contains("prefixItems")) type = "array";
      else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) type = "string";
    }
    if (type.empty()) return primitive("value");
    if (type == "object") return object(s, name, where);
    if (type == "array") return array(s, name, where);
    if (type == "string") return string(s, name, where);
    if (type == "number" || type == "integer" || type == "boolean" || type == "null")
      return primitive(type);
    refuse(where, cat("unknown type '", type, "'"));
  }

  static uint64_t count(const json& s, const char* k, uint64_t def, const std::string& where) {
    if (!s.contains(k)) return def;
    if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0)
      refuse(where, cat(k, " must be a non-negative integer"));
    const uint64_t v = s[k].get<uint64_t>();
    if (v > kMaxRepeat) refuse(where, cat(k, " above ", kMaxRepeat, " is not supported"));
    return v;
  }

  // What repeats {min, max} times (max = UINT64_MAX: unbounded), in GBNF.
  static std::string times(uint64_t min, uint64_t max) {
    if (max == UINT64_MAX) return min == 0 ? "*" : min == 1 ? "+" : cat("{", min, ",}");
    return min == max ? cat("{", min, "}") : cat("{", min, ",", max, "}");
  }

  std::string string(const json& s, const std::string& name, const std::string& where) {
    if (s.contains("format")) {
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      if (f != "date" && f != "time" && f != "date-time" && f != "uuid")
        refuse(where, cat("string format '", f, "' is not supported (date, time, date-time, uuid)"));
      return rule(name, "\"\\\"\" " + primitive(f) + " \"\\\"\" " + primitive("space"));
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) refuse(where, "pattern must be a string");
      if (s.contains("minLength") || s.contains("maxLength"))
        refuse(where, "pattern with minLength or maxLength is not supported");
      std::string body;
      try {
        body = pattern_to_gbnf(s["pattern"].get<std::string>());
      } catch (const Error& e) {
        refuse(where, cat("pattern: ", e.what()));
      }
      return rule(name, "\"\\\"\" (" + body + ") \"\\\"\" " + primitive("space"));
    }
    const uint64_t min = count(s, "minLength", 0, where);
    const uint64_t max = count(s, "maxLength", UINT64_MAX, where);
    if (min > max) refuse(where, "minLength > maxLength");
    if (min == 0 && max == UINT64_MAX) return primitive("string");
    return rule(name, "\"\\\"\" " + primitive("char") + times(min, max) + " \"\\\"\" " + primitive("space"));
  }

  std::string array(const json& s, const std::string& name, const std::string& where) {
    std::vector<std::string> tuple;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) refuse(where, "prefixItems must be a list");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        tuple.push_back(visit(s["prefixItems"][i], cat(name, "-", i), cat(where, "/prefixItems/", i)));
    }
    // The older drafts' tuple, "items": [...] (llama.cpp reads it so): those elements, no more.
    const bool old_tuple = s.contains("items") && s["items"].is_array();
    if (old_tuple)
      for (size_t i = 0; i < s["items"].size(); ++i)
        tuple.push_back(visit(s["items"][i], cat(name, "-", i), cat(where, "/items/", i)));
    const bool no_more = old_tuple || (s.contains("items") && s["items"] == false);
    std::string item;
    if (!no_more)
      item = s.contains("items") ? visit(s["items"], name + "-item", where + "/items") : primitive("value");
    uint64_t min = count(s, "minItems", old_tuple ? tuple.size() : 0, where);
    uint64_t max = count(s, "maxItems", UINT64_MAX, where);
    if (no_more) max = std::min<uint64_t>(max, tuple.size());
    if (min > max) refuse(where, "minItems > maxItems");
    primitive("space");
    // Each element after the first is "," space x; a tuple's first elements are fixed, and the
    // array may stop after any of them at or past minItems.
    std::vector<std::string> seq = tuple;
    std::string def = "\"[\" space ";
    std::string tail;
    const uint64_t fixed = std::min<uint64_t>(tuple.size(), max);
    if (fixed == 0) {
      if (max == 0) return rule(name, def + "\"]\" space");
      const uint64_t rmin = min > 0 ? min - 1 : 0;
      const uint64_t rmax = max == UINT64_MAX ? max : max - 1;
      const std::string more = rmax == 0 ? "" : " (\",\" space " + item + ")" + times(rmin, rmax);
      const std::string body = item + more;
      return rule(name, def + (min == 0 ? "(" + body + ")?" : body) + " \"]\" space");
    }
    // Tuples: element i (i < fixed) is optional past minItems, nesting the rest inside.
    std::string rest;
    if (max > fixed && !no_more) {
      const uint64_t rmin = min > fixed ? min - fixed : 0;
      const uint64_t rmax = max == UINT64_MAX ? max : max - fixed;
      rest = " (\",\" space " + item + ")" + times(rmin, rmax);
    }
    std::string inner = rest;
    for (uint64_t i = fixed; i-- > 0;) {
      const std::string el = (i ? "\",\" space " : "") + seq[i] + inner;
      inner = i + 1 > min ? " (" + el + ")?" : " " + el;
    }
    return rule(name, def + inner + " \"]\" space");
  }

  std::string object(const json& s, const std::string& name, const std::string& where) {
    std::vector<std::pair<std::string, bool>> props;  // kv rule, required
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) refuse(where, "required must be a list");
      for (const json& r : s["required"]) {
        if (!r.is_string()) refuse(where, "required must list strings");
        required.insert(r.get<std::string>());
      }
    }
    const bool has_props = s.contains("properties");
    if (has_props) {
      if (!s["properties"].is_object()) refuse(where, "properties must be an object");
      for (const auto& [k, v] : s["properties"].items()) {
        const std::string value = visit(v, name + "-" + k, where + "/properties/" + k);
        const std::string kv = rule(name + "-" + k + "-kv",
                                    gbnf_literal(json(k).dump()) + " space \":\" space " + value);
        props.emplace_back(kv, required.count(k) > 0);
      }
    }
    for (const std::string& r : required)
      if (!has_props || !s["properties"].contains(r))
        refuse(where, cat("required property '", r, "' is not in properties"));
    // Extra keys: absent additionalProperties allows them only where no property is named
    // (a model sticks to the named ones; what it writes stays valid).
    std::string extra;
    const json ap = s.contains("additionalProperties") ? s["additionalProperties"] : json(!has_props);
    if (!(ap.is_boolean() && !ap.get<bool>())) {
      const std::string value = ap.is_boolean() ? primitive("value") : visit(ap, name + "-additional", where + "/additionalProperties");
      extra = rule(name + "-extra-kv", primitive("string") + " \":\" space " + value);
    }
    primitive("space");
    // After the first key written, each is "," space kv. first_i: properties i.. with none
    // written yet, where an optional one may be skipped (a rule per optional property).
    auto after = [&](size_t from) {
      std::string t;
      for (size_t j = from; j < props.size(); ++j)
        t += props[j].second ? " \",\" space " + props[j].first : " (\",\" space " + props[j].first + ")?";
      if (!extra.empty()) t += " (\",\" space " + extra + ")*";
      return t;
    };
    std::string first = extra.empty() ? "" : "(" + extra + " (\",\" space " + extra + ")*)?";
    for (size_t i = props.size(); i-- > 0;) {
      const std::string with = props[i].first + after(i + 1);
      if (props[i].second)
        first = with;
      else
        // An empty alternative is written "": a line ending in '|' goes on to the next.
        first = rule(cat(name, "-from-", i), with + " | " + (first.empty() ? "\"\"" : first));
    }
    return rule(name, "\"{\" space " + (first.empty() ? "" : first + " ") + "\"}\" space");
  }

  const json& root_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> by_def_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) { return Converter(schema).run(); }

std::string json_object_gbnf() { return json_schema_to_gbnf(json{{"type", "object"}}); }

}  // namespace kvs::grammar
