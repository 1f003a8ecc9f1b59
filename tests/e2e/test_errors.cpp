// Bad input to the kvstream binary: a clear message naming what is wrong and exit status 1,
// never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common.h"
#include "kvs/gguf/gguf.h"

namespace kvs {
namespace {

struct Outcome {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string err;
};

Outcome kvstream(const std::string& args) {
  auto errf = test::temp_dir("errors") / "stderr.txt";
  std::string cmd = test::binary() + " " + args + " >/dev/null 2>" + errf.string();
  int rc = std::system(cmd.c_str());
  Outcome o;
  o.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream f(errf);
  std::stringstream ss;
  ss << f.rdbuf();
  o.err = ss.str();
  return o;
}

void expect_error(const std::string& args, const std::string& needle) {
  Outcome o = kvstream(args);
  EXPECT_EQ(o.status, 1) << args << "\n" << o.err;
  EXPECT_NE(o.err.find(needle), std::string::npos) << args << "\nstderr: " << o.err;
}

std::string synth_tiny() {
  static const std::string path = [] {
    auto p = (test::temp_dir("errors") / "tiny.gguf").string();
    EXPECT_EQ(kvstream("synth tiny -o " + p).status, 0);
    return p;
  }();
  return path;
}

TEST(CliErrors, BadModelFiles) {
  expect_error("run -m /nonexistent/model.gguf -p hi -n 1", "/nonexistent/model.gguf");
  auto dir = test::temp_dir("errors");
  auto text = (dir / "text.gguf").string();
  std::ofstream(text) << "this is not a gguf file at all, just some text";
  expect_error("run -m " + text + " -p hi -n 1", "text.gguf");
  // Truncated copies of a valid file.
  std::ifstream in(synth_tiny(), std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  for (size_t cut :
       {size_t{3}, size_t{100}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 9}) {
    auto p = (dir / ("cut" + std::to_string(cut) + ".gguf")).string();
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    expect_error("run -m " + p + " -p hi -n 1", p);
  }
}

TEST(CliErrors, UnknownArchitecture) {
  auto f = gguf::File::open(synth_tiny());
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  w.set("general.architecture", gguf::Value::str("gptx"));
  for (const auto& t : f->tensors()) w.add_tensor(t.name, t.type, t.dims, t.data, t.nbytes);
  auto p = (test::temp_dir("errors") / "gptx.gguf").string();
  w.write(p);
  expect_error("run -m " + p + " -p hi -n 1", "gptx");
  expect_error("info -m " + p, "gptx");
  // info still describes the file it cannot run: its metadata and tensors reach stdout.
  const auto out = test::temp_dir("errors") / "info.txt";
  const int rc = std::system(
      (test::binary() + " info -m " + p + " >" + out.string() + " 2>/dev/null").c_str());
  EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 1);
  std::ifstream listing(out);
  std::stringstream ss;
  ss << listing.rdbuf();
  EXPECT_NE(ss.str().find("general.architecture = gptx"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("tensors ("), std::string::npos) << ss.str();
}

TEST(CliErrors, BadFlags) {
  expect_error("run -m synthetic:tiny --tokens 1,2,3,4,5 -c 4 -n 0", "-c");
  expect_error("run -m synthetic:tiny --tokens 1,2,3 -c 8 -n 100", "-c");
  expect_error("run -m synthetic:tiny --tokens 1,2,3 -ctk q3_k -n 1", "q8_0");
  expect_error("run -m synthetic:tiny --tokens 1,99999 -n 1", "99999");
  expect_error("run -m synthetic:tiny --tokens 1,x -n 1", "--tokens");
  expect_error("run -m synthetic:tiny --tokens 1 -p hi -n 1", "exactly one");
  expect_error("run -m synthetic:tiny --tokens 1 --top-p 2 -n 1", "--top-p");
  expect_error("run -m synthetic:tiny --tokens 1 --page-size 0 -n 1", "--page-size");
  expect_error("run -m synthetic:nosuch --tokens 1 -n 1", "tiny");
  expect_error("run -m synthetic:tiny --tokens 1 -n 1 --kv-mode split --split-cpus 2-1",
               "--split-cpus: the range '2-1' ends before it starts");
  expect_error("run -m synthetic:tiny --tokens 1 -n 1 --kv-mode split --split-cpus 65000",
               "--split-cpus: CPU 65000 is not one this process may run on");
  expect_error("synth nosuch -o /tmp/x.gguf", "smollm2-135m");
}

TEST(CliErrors, GoodRunsStillWork) {
  auto dir = test::temp_dir("errors");
  auto npy = (dir / "l.npy").string();
  Outcome o = kvstream("run -m synthetic:tiny --tokens 1,2,3 -n 0 --logits-out " + npy);
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(std::filesystem::exists(npy));
  o = kvstream("run -m " + synth_tiny() +
               " --tokens 1,2,3 -n 8 -ctk q8_0 -ctv q4_0 --page-size 4 --temp 0.8 -s 5");
  EXPECT_EQ(o.status, 0) << o.err;
  o = kvstream("info -m synthetic:tiny -ctk q4_0");
  EXPECT_EQ(o.status, 0) << o.err;
}

// info describes a gemma3 file: its window and full layers, and the window's fixed KV.
TEST(CliErrors, InfoDescribesGemma3) {
  const auto out = test::temp_dir("errors") / "gemma_info.txt";
  auto info = [&](const std::string& model) {
    const int rc = std::system(
        (test::binary() + " info -m " + model + " >" + out.string() + " 2>/dev/null").c_str());
    EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0) << model;
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  std::string s = info("synthetic:tiny-gemma3");
  EXPECT_NE(s.find("layer kinds     6 window (32 positions), 1 full (layers 5)"), std::string::npos)
      << s;
  EXPECT_NE(s.find("gelu_tanh"), std::string::npos) << s;
  const std::string real = test::model_dir() + "/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(real)) GTEST_SKIP() << real << " is missing";
  s = info(real);
  EXPECT_NE(s.find("general.architecture = gemma3"), std::string::npos) << s;
  EXPECT_NE(s.find("15 window (512 positions), 3 full (layers 5, 11, 17)"), std::string::npos) << s;
  EXPECT_NE(s.find("KV cache per token (K + V, 3 layers x 256 elements each)"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace kvs
