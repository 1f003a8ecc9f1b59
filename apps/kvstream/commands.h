// Subcommands of the kvstream binary: one file each, registered by main.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace kvs::cli {

// Each adds its subcommand to `app` with a callback that runs it (errors as kvs::Error).
void register_run(CLI::App& app);
void register_info(CLI::App& app);
void register_synth(CLI::App& app);
void register_plan(CLI::App& app);
void register_bench(CLI::App& app, std::string command);  // command: the line, for the JSON

}  // namespace kvs::cli
