// Running the kvstream binary from a test: its exit status, stdout and stderr, with optional
// text on stdin; and tests/e2e/drive_tty.py for what needs a terminal or a Ctrl-C.
#pragma once

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common.h"

namespace kvs::test {

struct Outcome {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `kvstream ARGS` through the shell (ARGS quoted as needed by the caller), stdin from `input`.
inline Outcome kvstream(const std::string& args, const std::string& input = "") {
  static std::atomic<int> counter{0};
  const auto dir = temp_dir("cli");
  const std::string n = std::to_string(counter++);
  const auto in = dir / ("in" + n), out = dir / ("out" + n), err = dir / ("err" + n);
  std::ofstream(in, std::ios::binary) << input;
  const std::string cmd =
      binary() + " " + args + " <" + in.string() + " >" + out.string() + " 2>" + err.string();
  const int rc = std::system(cmd.c_str());
  Outcome o;
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  o.out = slurp(out);
  o.err = slurp(err);
  return o;
}

// tests/e2e/drive_tty.py MODE BINARY ARGS: its JSON report.
inline nlohmann::json drive_tty(const std::string& mode, const std::string& args) {
  const std::string cmd = python() + " " + source_dir() + "/tests/e2e/drive_tty.py " + mode + " " +
                          binary() + " " + args;
  const auto out = temp_dir("cli") / ("drive_" + mode + ".json");
  const int rc = std::system((cmd + " >" + out.string()).c_str());
  if (rc != 0) return nlohmann::json{{"status", -2}, {"error", "drive_tty.py failed"}};
  return nlohmann::json::parse(slurp(out));
}

inline bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

}  // namespace kvs::test
