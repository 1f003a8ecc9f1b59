// kvstream synth: writes a synthetic model (random weights, a real model's shape) as GGUF.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "kvs/gguf/gguf.h"
#include "kvs/model/synthetic.h"
#include "kvs/util/error.h"

namespace kvs::cli {

void register_synth(CLI::App& app) {
  struct Opts {
    std::string spec, out, type;
    bool zeros = false;
  };
  auto o = std::make_shared<Opts>();
  std::string presets;
  for (const std::string& p : synthetic_presets()) presets += (presets.empty() ? "" : ", ") + p;
  CLI::App* sub = app.add_subcommand(
      "synth", "Write a synthetic model (deterministic random weights) as a GGUF file");
  sub->add_option("spec", o->spec, "PRESET[:TYPE] (presets: " + presets + ")")->required();
  sub->add_option("-o,--output", o->out, "output .gguf path")->required();
  sub->add_option("--type", o->type, "weight type (overrides :TYPE; default q8_0)");
  sub->add_flag("--zeros", o->zeros,
                "matrices of zeros, never generated, a sparse file: any preset's metadata and "
                "tensor table at once, for checking that a tool loads them (it computes nothing)");
  sub->callback([o] {
    std::string spec = o->spec;
    if (!o->type.empty()) spec = spec.substr(0, spec.find(':')) + ":" + o->type;
    synthetic_writer(spec, !o->zeros).write(o->out);
    std::error_code ec;
    const auto size = std::filesystem::file_size(o->out, ec);
    std::fprintf(stderr, "kvstream synth: wrote %s (%s%s, %.1f MiB)\n", o->out.c_str(),
                 spec.c_str(), o->zeros ? ", zeros" : "",
                 ec ? 0.0 : static_cast<double>(size) / (1024.0 * 1024.0));
  });
}

}  // namespace kvs::cli
