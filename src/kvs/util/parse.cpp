#include "kvs/util/parse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kvs/util/error.h"

namespace kvs {
namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Splits "2.5G" into 2.5 and "g"; fails when there is no number.
double leading_number(std::string_view text, std::string_view flag, std::string* suffix) {
  std::string s(text);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0)
    fail(flag, ": '", text, "' is not a non-negative number");
  *suffix = lower(std::string_view(end));
  return v;
}

// Calls item(each comma-separated item of text), empty ones included.
template <class F>
void for_each_item(std::string_view text, F&& item) {
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    item(text.substr(start, comma - start));
    start = comma + 1;
  }
}

}  // namespace

uint64_t parse_size(std::string_view text, std::string_view flag) {
  std::string suf;
  double v = leading_number(text, flag, &suf);
  double mul = 1;
  if (!suf.empty()) {
    char c = suf[0];
    std::string rest = suf.substr(1);
    if (c == 'k')
      mul = 1024.0;
    else if (c == 'm')
      mul = 1024.0 * 1024;
    else if (c == 'g')
      mul = 1024.0 * 1024 * 1024;
    else if (c == 't')
      mul = 1024.0 * 1024 * 1024 * 1024;
    else if (c == 'b' && rest.empty())
      mul = 1;
    else
      fail(flag, ": unknown size suffix in '", text, "' (use K, M, G or T, powers of 1024)");
    if (c != 'b' && !(rest.empty() || rest == "b" || rest == "ib"))
      fail(flag, ": unknown size suffix in '", text, "' (use K, M, G or T, powers of 1024)");
  }
  double bytes = v * mul;
  if (bytes > 1.8e19) fail(flag, ": '", text, "' is too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

int64_t parse_count(std::string_view text, std::string_view flag) {
  std::string suf;
  double v = leading_number(text, flag, &suf);
  double mul = 1;
  if (suf == "k")
    mul = 1024;
  else if (suf == "m")
    mul = 1024.0 * 1024;
  else if (!suf.empty())
    fail(flag, ": '", text, "' is not a count (examples: 512, 4k, 128k)");
  double n = v * mul;
  if (n != std::floor(n) || n > 9e15) fail(flag, ": '", text, "' is not a whole count");
  return static_cast<int64_t>(n);
}

std::vector<int64_t> parse_count_list(std::string_view text, std::string_view flag) {
  std::vector<int64_t> out;
  for_each_item(text, [&](std::string_view item) {
    if (item.empty()) fail(flag, ": empty item in list '", text, "'");
    out.push_back(parse_count(item, flag));
  });
  return out;
}

std::vector<int32_t> parse_int_list(std::string_view text, std::string_view flag) {
  std::vector<int32_t> out;
  for_each_item(text, [&](std::string_view piece) {
    std::string item(piece);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    size_t lead = 0;
    while (lead < item.size() && std::isspace(static_cast<unsigned char>(item[lead]))) ++lead;
    item = item.substr(lead);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < INT32_MIN || v > INT32_MAX)
      fail(flag, ": '", item, "' is not an integer (in '", text, "')");
    out.push_back(static_cast<int32_t>(v));
  });
  return out;
}

std::vector<int> parse_cpu_list(std::string_view text, std::string_view flag) {
  std::vector<int> out;
  for_each_item(text, [&](std::string_view item) {
    const size_t dash = item.find('-');
    const auto number = [&](std::string_view s) {
      const std::string t(s);
      char* end = nullptr;
      const long v = std::strtol(t.c_str(), &end, 10);
      if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0])) || *end != '\0' || v > 65535)
        fail(flag, ": '", item, "' is not a CPU or a range of them like 4-7 (in '", text, "')");
      return static_cast<int>(v);
    };
    const int lo = number(item.substr(0, dash));
    const int hi = dash == std::string_view::npos ? lo : number(item.substr(dash + 1));
    if (hi < lo) fail(flag, ": the range '", item, "' ends before it starts");
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  });
  return out;
}

std::string cpu_list_name(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace kvs
