// kvstream plan: the partition of the KV arena at a context, the bytes streamed per token and
// the predicted decode bound max(T_gpu, S/B), without running the model.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kvs/engine/engine.h"
#include "kvs/gguf/gguf.h"
#include "kvs/kv/planner.h"
#include "kvs/model/config.h"
#include "kvs/model/synthetic.h"
#include "kvs/model/weights.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs::cli {
namespace {

struct PlanArgs {
  SharedArgs s;
  std::string json_out;
  double hbm_gbps = 4400;
};

void plan_cmd(const PlanArgs& pa) {
  const SharedArgs& a = pa.s;
  KVS_CHECK(a.h2d_gbps > 0 && pa.hbm_gbps > 0, "--h2d-gbps and --hbm-gbps must be more than 0");
  KVS_CHECK(a.kv_arena.empty() || a.vram_limit.empty(),
            "give --kv-arena or --vram-limit, not both");
  // The shape and the bytes of the weights, from the file's header or the synthetic preset.
  ModelConfig c;
  size_t weights = 0;
  constexpr std::string_view kSynth = "synthetic:";
  if (a.model.rfind(kSynth, 0) == 0) {
    const std::string spec = a.model.substr(kSynth.size());
    c = synthetic_config(spec);
    weights = synthetic_matrix_bytes(spec);
  } else {
    auto f = gguf::File::open(a.model);
    c = ModelConfig::from_gguf(*f);
    weights = Weights::from_gguf(*f, c).matrix_bytes();
  }
  const EngineOptions o = engine_options(a, c);
  const int64_t ctx = o.n_ctx;
  const int32_t parallel = o.n_seq;
  KVS_CHECK(o.kv_mode == KvMode::Auto || o.kv_mode == KvMode::Stream,
            "kvstream plan: --kv-mode is auto or stream");
  const KvLayout kv = KvLayout::make(o.k_type, o.v_type, o.page_size, c.n_head_kv, c.head_dim);
  const KvShape shape = Engine::kv_shape(c, o);
  const int32_t fixed = Engine::fixed_frames(c, o), L = shape.n_full;
  const size_t page = kv.page_bytes();
  const int32_t pages = shape.max_pages;
  const size_t kv_token = static_cast<size_t>(L) * (kv.k_row + kv.v_row);
  const size_t kv_all = shape.full_bytes;
  // With the phase arena the prefill's activations are the arena's top, lent to the KV while
  // decoding; the decode's rows are buffers of their own.
  const bool phase = Engine::phase_arena(c, o);
  const size_t pass = Engine::pass_bytes(c, o.n_batch);
  const size_t work = phase ? (pass + 256 + page - 1) / page * page : 0;
  // The recurrent layers' states are buffers of their own beside the arena.
  const size_t buffers = Engine::activation_bytes(c, o) + shape.recurrent_bytes -
                         (phase ? pass - Engine::pass_bytes(c, o.n_seq) : 0);
  // What a step reads of the windows: their last n_swa positions, or all there are.
  const size_t window_read = static_cast<size_t>(shape.n_window) * (kv.k_row + kv.v_row) *
                             static_cast<size_t>(std::min<int64_t>(ctx, c.n_swa)) *
                             static_cast<size_t>(parallel);

  size_t arena = kv_all + static_cast<size_t>(fixed) * page;
  std::string arena_from = "everything fits (no --kv-arena or --vram-limit)";
  if (!a.kv_arena.empty()) {
    arena = parse_size(a.kv_arena, "--kv-arena");
    arena_from = "--kv-arena";
  } else if (!a.vram_limit.empty()) {
    const size_t limit = parse_size(a.vram_limit, "--vram-limit");
    KVS_CHECK(limit > weights + buffers, "--vram-limit ", format_bytes(limit),
              " does not hold the weights (", format_bytes(weights), ") and buffers (",
              format_bytes(buffers), ")");
    arena = limit - weights - buffers;
    arena_from = cat("--vram-limit ", format_bytes(limit), " less weights and buffers");
    KVS_CHECK(arena > work, "--vram-limit ", format_bytes(limit),
              " does not hold the prefill's workspace (", format_bytes(work), ")");
    arena -= work;
  }
  // `arena`: the KV's while prefilling; the decode's has the workspace too.
  const size_t prefill_arena = arena;
  arena += work;
  // T_gpu: a decode step reads every weight once, each sequence's whole KV, and reads and
  // writes every recurrent state.
  const double hbm = pa.hbm_gbps * 1e9, h2d = a.h2d_gbps * 1e9;
  const double gpu_s = (static_cast<double>(weights) + static_cast<double>(window_read) +
                        2 * static_cast<double>(shape.recurrent_bytes) +
                        static_cast<double>(kv_token) * static_cast<double>(ctx) * parallel) /
                       hbm;
  const auto plan_of = [&](size_t arena_bytes) {
    Plan p;  // without full layers: everything resident
    p.resident.assign(static_cast<size_t>(parallel), kUnlimited);
    p.extra.assign(static_cast<size_t>(parallel), 0);
    p.gpu_s = p.predicted_step_s = gpu_s;
    if (L == 0) return p;
    PlanInput in;
    in.arena_bytes = arena_bytes;
    in.page_bytes = page;
    in.n_layer = L;
    in.fixed_frames = fixed;
    in.seq_pages.assign(static_cast<size_t>(parallel), pages);
    in.h2d_bytes_per_s = h2d;
    in.layer_s = gpu_s / L;
    in.min_chunk_bytes = o.ring_chunk_bytes;
    in.min_slots = a.ring_slots;
    in.force_ring = o.kv_mode == KvMode::Stream;
    return plan(in);
  };
  const auto resident_of = [&](const Plan& p) {
    int64_t n = 0;
    for (size_t s = 0; s < p.resident.size(); ++s)
      for (int32_t l = 0; l < L; ++l) n += std::min(pages, resident_cap(p, s, l));
    return L == 0 ? 1.0 : static_cast<double>(n) / (static_cast<double>(pages) * L * parallel);
  };
  const Plan p = plan_of(arena), pp = plan_of(prefill_arena);

  const double tok_s = parallel / p.predicted_step_s;
  const size_t per_token = p.streamed_bytes / static_cast<size_t>(parallel);
  const double resident_frac = resident_of(p), prefill_frac = resident_of(pp);
  std::printf("model      %s: %d layers, weights %s, KV %s/%s %s per token\n", a.model.c_str(),
              c.n_layer, format_bytes(weights).c_str(), a.ctk.c_str(), a.ctv.c_str(),
              format_bytes(kv_token).c_str());
  std::printf("layers     %d full (paged, may stream)", L);
  if (shape.n_window > 0)
    std::printf(", %d window of %d positions (resident, %d pages each: %s)", shape.n_window,
                c.n_swa, shape.window_pages, format_bytes(shape.window_bytes).c_str());
  if (shape.n_recurrent > 0)
    std::printf(", %d recurrent (resident state beside the arena: %s)", shape.n_recurrent,
                format_bytes(shape.recurrent_bytes).c_str());
  std::printf("\n");
  std::printf("context    %lld tokens x %d sequence(s): KV %s in %d pages of %s per full layer\n",
              static_cast<long long>(ctx), parallel, format_bytes(kv_all).c_str(), pages,
              format_bytes(page).c_str());
  std::printf("arena      %s (%s); %d fixed frames (pages being written%s)\n",
              format_bytes(arena).c_str(), arena_from.c_str(), fixed,
              shape.n_window > 0 ? ", windows" : "");
  if (phase)
    std::printf(
        "phase      a prefill takes %s back for its workspace (activations of -b %d; on CUDA "
        "also its f16 scratch): %s and %.1f %% of the KV resident while prefilling\n",
        format_bytes(work).c_str(), o.n_batch, format_bytes(prefill_arena).c_str(),
        100 * prefill_frac);
  if (!p.streams()) {
    std::printf("partition  everything resident, ring empty\n");
  } else {
    std::printf("partition  %.1f %% of the KV resident (%d pages per layer and sequence",
                100 * resident_frac, p.resident[0]);
    if (p.extra[0] > 0) std::printf(", %d more in the first %d layers", 1, p.extra[0]);
    std::printf("); ring %d slots x %d pages (%s)\n", p.n_slots, p.slot_pages,
                format_bytes(static_cast<size_t>(p.ring_frames()) * page).c_str());
  }
  std::printf("streamed   %s per step, %s per token\n", format_bytes(p.streamed_bytes).c_str(),
              format_bytes(per_token).c_str());
  std::printf(
      "bound      T_gpu %.3f ms (at %.0f GB/s), S/B %.3f ms (at %.1f GB/s): %.3f ms per "
      "step, %.1f tokens/s\n",
      p.gpu_s * 1e3, pa.hbm_gbps, p.copy_s * 1e3, a.h2d_gbps, p.predicted_step_s * 1e3, tok_s);
  if (!pa.json_out.empty()) {
    nlohmann::json j;
    j["model"] = a.model;
    j["ctx"] = ctx;
    j["parallel"] = parallel;
    j["weights_bytes"] = weights;
    j["kv_bytes_per_token"] = kv_token;
    j["kv_bytes"] = kv_all;
    j["page_bytes"] = page;
    j["arena_bytes"] = arena;
    j["phase_arena"] = phase;
    j["workspace_bytes"] = work;
    j["prefill_arena_bytes"] = prefill_arena;
    j["prefill_resident_fraction"] = prefill_frac;
    j["fixed_frames"] = fixed;
    j["full_layers"] = L;
    j["window_layers"] = shape.n_window;
    j["window"] = c.n_swa;
    j["window_bytes"] = shape.window_bytes;
    j["recurrent_layers"] = shape.n_recurrent;
    j["recurrent_bytes"] = shape.recurrent_bytes;
    j["resident_fraction"] = resident_frac;
    j["resident_pages"] = p.resident;
    j["resident_extra_layers"] = p.extra;
    j["slot_pages"] = p.slot_pages;
    j["n_slots"] = p.n_slots;
    j["streamed_bytes_per_step"] = p.streamed_bytes;
    j["streamed_bytes_per_token"] = per_token;
    j["t_gpu_s"] = p.gpu_s;
    j["copy_s"] = p.copy_s;
    j["predicted_step_s"] = p.predicted_step_s;
    j["predicted_tokens_per_s"] = tok_s;
    j["h2d_gbps"] = a.h2d_gbps;
    j["hbm_gbps"] = pa.hbm_gbps;
    write_json(pa.json_out, j);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  a->s.h2d_gbps = 55;
  CLI::App* c =
      app.add_subcommand("plan", "Show the KV partition and predicted decode speed at a context");
  add_shared(c, a->s, kModel | kContext | kParallel | kCache | kMemory | kKvMode);
  c->add_option("--hbm-gbps", a->hbm_gbps, "Device memory bandwidth for T_gpu, GB/s")
      ->capture_default_str();
  c->add_option("--json", a->json_out, "Also write the plan as JSON to this file");
  c->callback([a] { plan_cmd(*a); });
}

}  // namespace kvs::cli
