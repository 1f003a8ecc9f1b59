// kvstream: command-line entry point.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "commands.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/util/error.h"

namespace kvs::cli {

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  KVS_CHECK(f.good(), "--json: cannot write '", path, "'");
  f << j.dump(2) << "\n";
  KVS_CHECK(f.good(), "--json: writing '", path, "' failed");
}

std::unique_ptr<Device> make_device(const std::string& backend, size_t vram_limit) {
  KVS_CHECK(backend == "cpu" || backend == "cuda", "--backend ", backend,
            ": not a backend (cpu, cuda)");
#ifdef KVS_HAVE_CUDA
  if (backend == "cuda") return make_cuda_device(vram_limit, CudaOptions::from_env());
#else
  KVS_CHECK(backend == "cpu",
            "--backend cuda: this build has no CUDA backend (build with cmake "
            "--preset cuda)");
#endif
  return make_cpu_device(vram_limit);
}

}  // namespace kvs::cli

int main(int argc, char** argv) {
  CLI::App app{"kvstream: LLM inference with KV cache streaming", "kvstream"};
  app.set_version_flag("--version", KVS_VERSION);
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("kvstream: error: ") + e.what() + "\nRun with --help for the options.\n";
  });
  kvs::cli::register_run(app);
  kvs::cli::register_chat(app);
  kvs::cli::register_info(app);
  kvs::cli::register_synth(app);
  kvs::cli::register_plan(app);
#ifdef KVS_HAVE_HTTPLIB
  kvs::cli::register_serve(app);
#endif
  std::string line;
  for (int i = 0; i < argc; ++i) line += (i ? " " : "") + std::string(argv[i]);
  kvs::cli::register_bench(app, line);
  if (argc > 1 && argv[1][0] != '-') {  // CLI11 would only say that a subcommand is required
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known |= sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
#ifndef KVS_HAVE_HTTPLIB
    if (std::strcmp(argv[1], "serve") == 0) {
      std::fprintf(stderr,
                   "kvstream: error: this build has no 'serve': it needs cpp-httplib (Debian: "
                   "apt-get install libcpp-httplib-dev, then configure and build again)\n");
      return 1;
    }
#endif
    if (!known) {
      std::fprintf(stderr, "kvstream: error: '%s' is not a command (%s)\n", argv[1], names.c_str());
      return 1;
    }
  }
  // CLI11 takes the arguments in reverse order.
  std::vector<std::string> args = kvs::cli::rewrite_llama_flags(argc, argv);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every parse error is a user error, status 1.
    if (app.exit(e) == 0) return 0;
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvstream: error: %s\n", e.what());
    return 1;
  }
  return kvs::cli::interrupted() ? 130 : 0;
}
