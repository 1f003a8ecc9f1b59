// kvstream: command-line entry point.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "commands.h"
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
  CLI::App app{"kvstream: LLM inference with KV cache streaming"};
  app.set_version_flag("--version", KVS_VERSION);
  app.require_subcommand(1);
  kvs::cli::register_run(app);
  kvs::cli::register_info(app);
  kvs::cli::register_synth(app);
  kvs::cli::register_plan(app);
  std::string line;
  for (int i = 0; i < argc; ++i) line += (i ? " " : "") + std::string(argv[i]);
  kvs::cli::register_bench(app, line);
  // llama.cpp's multi-letter short flags, which CLI11 cannot declare, become their long names.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {
    std::string s = argv[i];
    if (s == "-ctk")
      s = "--cache-type-k";
    else if (s == "-ctv")
      s = "--cache-type-v";
    args.push_back(s);
  }
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvstream: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
