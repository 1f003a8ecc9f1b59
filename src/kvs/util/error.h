// Errors: library code throws kvs::Error with a message naming the bad input; the CLI and the
// server decide how to show it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kvs {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

template <class... A>
[[noreturn]] void fail(const A&... a) {
  throw Error(cat(a...));
}

}  // namespace kvs

// Always on, also in release builds.
#define KVS_CHECK(cond, ...)                   \
  do {                                         \
    if (!(cond)) ::kvs::fail(__VA_ARGS__);     \
  } while (0)
