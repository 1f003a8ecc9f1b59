// kvstream info: a model's metadata, shape, tensor types and memory needs.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "kvs/backend/cpu/isa.h"
#include "kvs/gguf/gguf.h"
#include "kvs/model/model.h"
#include "kvs/quant/types.h"
#include "kvs/util/error.h"

namespace kvs::cli {
namespace {

double mib(uint64_t b) {
  return static_cast<double>(b) / (1024.0 * 1024.0);
}

// Window layers keep n_swa positions whatever the context, so only Full layers grow per token.
size_t kv_bytes_per_token(const ModelConfig& c, DType tk, DType tv) {
  return static_cast<size_t>(c.n_layers_of(LayerKind::Full)) *
         (row_bytes(tk, c.kv_dim()) + row_bytes(tv, c.kv_dim()));
}

// "15 window (512 positions), 3 full (layers 5, 11, 17)" for a model with window layers.
std::string layer_kinds(const ModelConfig& c) {
  std::string full;
  for (int32_t il = 0; il < c.n_layer; ++il)
    if (c.kinds[static_cast<size_t>(il)] == LayerKind::Full)
      full += (full.empty() ? "" : ", ") + std::to_string(il);
  return cat(c.n_layers_of(LayerKind::Window), " window (", c.n_swa, " positions), ",
             c.n_layers_of(LayerKind::Full), " full", full.empty() ? "" : " (layers " + full + ")");
}

// The file's own description: header, metadata and tensors by type.
void print_file(const gguf::File& f) {
  std::printf("file: %s (GGUF v%u, %.1f MiB, alignment %llu)\n", f.name().c_str(), f.version(),
              mib(f.size()), static_cast<unsigned long long>(f.alignment()));
  std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
  for (const auto& [k, v] : f.metadata())
    std::printf("  %s = %s\n", k.c_str(), v.to_string().c_str());
  std::map<std::string, std::pair<size_t, uint64_t>> by_type;
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto& e = by_type[dtype_name(t.type)];
    e.first += 1;
    e.second += t.nbytes;
    total += t.nbytes;
  }
  std::printf("\ntensors (%zu, %.1f MiB):\n", f.tensors().size(), mib(total));
  for (const auto& [name, e] : by_type)
    std::printf("  %-6s %5zu tensors  %12llu bytes  (%.1f MiB)\n", name.c_str(), e.first,
                static_cast<unsigned long long>(e.second), mib(e.second));
}

void print_info(const std::string& spec, const std::string& ctk, const std::string& ctv) {
  const DType tk = parse_dtype(ctk, "-ctk"), tv = parse_dtype(ctv, "-ctv");
  std::unique_ptr<Model> m;
  if (spec.starts_with("synthetic:")) {
    m = Model::load(spec);
    print_file(*m->file);
  } else {
    // The file is described even when kvstream cannot run it (an architecture or a format it
    // does not know); the reason follows as the error.
    print_file(*gguf::File::open(spec));
    std::fflush(stdout);
    m = Model::load(spec);
  }
  const ModelConfig& c = m->config;

  std::printf("\nconfig:\n");
  std::printf("  arch            %s (%s)\n", arch_name(c.arch), c.name.c_str());
  std::printf("  layers          %d\n", c.n_layer);
  if (c.n_layers_of(LayerKind::Window) > 0) {
    std::printf("  layer kinds     %s\n", layer_kinds(c).c_str());
    std::printf("  window rope     base %g\n", static_cast<double>(c.rope_base_swa));
  }
  std::printf("  embd            %d\n", c.n_embd);
  std::printf("  ff              %d\n", c.n_ff);
  std::printf("  heads           %d\n", c.n_head);
  std::printf("  kv heads        %d\n", c.n_head_kv);
  std::printf("  head dim        %d (q dim %d, kv dim %d)\n", c.head_dim, c.q_dim(), c.kv_dim());
  std::printf("  vocab           %d\n", c.n_vocab);
  std::printf("  context (train) %d\n", c.n_ctx_train);
  std::printf("  norm eps        %g\n", static_cast<double>(c.norm_eps));
  std::printf("  rope            %s, base %g, dim %d, linear scale %g%s\n",
              c.rope_mode == RopeMode::Norm ? "norm" : "neox", static_cast<double>(c.rope_base),
              c.rope_dim, static_cast<double>(c.rope_linear_scale),
              c.has_rope_freqs ? ", rope_freqs" : "");
  std::printf("  qkv bias        %s\n", c.qkv_bias ? "yes" : "no");
  std::printf("  qk norm         %s\n", c.qk_norm ? "yes" : "no");
  std::printf("  tied embeddings %s\n", c.tied_embeddings ? "yes" : "no");
  std::printf("  ffn             %s\n",
              c.act == Activation::GeluTanh ? "gelu_tanh(gate) * up" : "silu(gate) * up");
  if (c.post_norms) std::printf("  post norms      yes (attention and ffn outputs)\n");
  if (c.embd_scale != 1.0f)
    std::printf("  embd scale      %g\n", static_cast<double>(c.embd_scale));
  std::printf("  attn scale      %g\n", static_cast<double>(c.attn_scale));

  std::printf("\ncpu: %s; CPU kernels: %s (%s)\n", cpu::cpu_brand().c_str(),
              cpu::isa_name(cpu::best_isa()), cpu::isa_origin());

  const size_t wb = m->weights.matrix_bytes();
  std::printf("\nweight matrices read per token: %zu bytes (%.1f MiB)\n", wb, mib(wb));

  std::printf("\nKV cache per token (K + V, %d layers x %d elements each):\n",
              c.n_layers_of(LayerKind::Full), c.kv_dim());
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    const size_t b = kv_bytes_per_token(c, t, t);
    std::printf("  %-6s %8zu bytes  (%.1f MiB per 1k tokens)\n", dtype_name(t), b,
                static_cast<double>(b) * 1024.0 / (1024.0 * 1024.0));
  }
  const size_t b = kv_bytes_per_token(c, tk, tv);
  std::printf("  -ctk %s -ctv %s: %zu bytes  (%.1f MiB per 1k tokens)\n", dtype_name(tk),
              dtype_name(tv), b, static_cast<double>(b) * 1024.0 / (1024.0 * 1024.0));
  if (const int32_t nw = c.n_layers_of(LayerKind::Window); nw > 0) {
    const size_t w = static_cast<size_t>(nw) * static_cast<size_t>(c.n_swa) *
                     (row_bytes(tk, c.kv_dim()) + row_bytes(tv, c.kv_dim()));
    std::printf("  and the %d window layers' %d positions: %zu bytes (%.1f MiB) a sequence\n", nw,
                c.n_swa, w, mib(w));
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto o = std::make_shared<SharedArgs>();
  CLI::App* sub = app.add_subcommand("info", "Print a model's metadata, shape and memory needs");
  add_shared(sub, *o, kModel);
  sub->add_option("--ctk,--cache-type-k", o->ctk, "K cache type, -ctk: f16, q8_0, q4_0")
      ->capture_default_str();
  sub->add_option("--ctv,--cache-type-v", o->ctv, "V cache type, -ctv: f16, q8_0, q4_0")
      ->capture_default_str();
  sub->callback([o] { print_info(o->model, o->ctk, o->ctv); });
}

}  // namespace kvs::cli
