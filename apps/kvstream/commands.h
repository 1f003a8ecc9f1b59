// Subcommands of the kvstream binary: one file each, registered by main.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat_flags.h"
#include "kvs/backend/device.h"
#include "options.h"

namespace kvs::cli {

// The device of --backend (cpu or cuda) with --vram-limit (0: unbounded / the GPU's free memory).
std::unique_ptr<Device> make_device(const std::string& backend, size_t vram_limit);
// Writes j to the file of --json, indented; fails naming the path.
void write_json(const std::string& path, const nlohmann::json& j);

// Each adds its subcommand to `app` with a callback that runs it (errors as kvs::Error).
void register_run(CLI::App& app);
void register_info(CLI::App& app);
void register_synth(CLI::App& app);
void register_plan(CLI::App& app);
void register_chat(CLI::App& app);
void register_bench(CLI::App& app, std::string command);  // command: the line, for the JSON
#ifdef KVS_HAVE_HTTPLIB
void register_serve(CLI::App& app);
#endif

// The interactive chat of `chat` and `run -cnv`; `first`, when not empty, is the first message.
void chat_session(const SharedArgs& s, const GenArgs& g, const SpecArgs& spec,
                  const ChatTemplateArgs& tmpl, const std::string& first,
                  const std::string& json_out);

}  // namespace kvs::cli
