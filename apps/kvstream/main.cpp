// kvstream: command-line entry point. Subcommands are registered in this file.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "kvs/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kvstream: LLM inference with KV cache streaming"};
  app.set_version_flag("--version", KVS_VERSION);
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvs::Error& e) {
    std::fprintf(stderr, "kvstream: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
