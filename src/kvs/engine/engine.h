// The engine: runs the forward pass of a model on a Device over paged KV caches of several
// sequences, with the KV history resident in the device pool, streamed through the ring from
// the host store, or (host mode) kept and attended on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/cache_link.h"
#include "kvs/engine/pages.h"
#include "kvs/engine/prompt_cache.h"
#include "kvs/engine/recurrent.h"
#include "kvs/engine/split.h"
#include "kvs/kv/device_pool.h"
#include "kvs/kv/host_store.h"
#include "kvs/kv/planner.h"
#include "kvs/kv/ring.h"
#include "kvs/model/model.h"
#include "kvs/quant/kv_page.h"

namespace kvs {

// --kv-mode: auto (resident while everything fits, streaming after), resident (everything on
// the device or a clear error), stream (the ring always on), host (KV and attention on the host),
// unified (the whole KV in managed memory, paged by the driver: the baseline streaming beats),
// split (auto, and once pages stream the CPU attends to a share of them from the host store).
enum class KvMode { Auto, Resident, Stream, Host, Unified, Split };
KvMode parse_kv_mode(const char* text);
const char* kv_mode_name(KvMode m);

struct EngineOptions {
  int32_t n_ctx = 4096;                            // -c: positions per sequence
  int32_t n_batch = 512;                           // -b: tokens per forward pass
  int32_t page_size = 256;                         // --page-size
  DType k_type = DType::F16, v_type = DType::F16;  // -ctk, -ctv
  int32_t n_seq = 1;                               // --parallel: sequences live at once
  KvMode kv_mode = KvMode::Auto;
  size_t kv_arena = 0;         // --kv-arena; 0: what the device has left (all the KV if unbounded)
  double h2d_bytes_per_s = 0;  // assumed until measured (--h2d-gbps)
  double h2d_limit = 0;        // --h2d-limit: copies host-to-device at most this fast (0: none)
  size_t ring_chunk_bytes = size_t{16} << 20;  // --ring-chunk: the smallest efficient copy
  int32_t ring_slots = 0;                      // --ring-slots: the fewest ring slots (0: planner)
  // --no-phase-arena: false. Streaming (auto, stream), the prefill's workspace (activations of
  // -b tokens, the backend's prefill scratch) sits at the top of the KV arena and is lent to the
  // KV between prefills.
  bool phase_arena = true;
  // --cache-ram: host memory for the prompt cache (pages and recurrent checkpoints of closed
  // sequences, reused by the next sequences whose tokens begin alike); 0: none.
  size_t cache_ram = 0;
  // --ctx-checkpoints: with a prompt cache and recurrent layers, the most evenly spaced points
  // inside a prompt's prefill where the recurrent state is kept (besides its end and the
  // answer's), for prompts that later requests leave early.
  int32_t ctx_checkpoints = 8;
  // --cache-disk DIR (empty: none) and --cache-disk-size: the prompt cache's disk tier, which
  // takes what the RAM evicts (and all of it when the engine goes) and outlives the process.
  std::string cache_disk;
  size_t cache_disk_bytes = size_t{16} << 30;
  // Tokens of one sequence whose logits one step returns (BatchEntry::all_logits): 1 + the
  // longest draft that speculative decoding verifies at once. The windows keep n_verify - 1
  // positions more, so a verify step's rejected tail can be rolled back (Engine::truncate).
  int32_t n_verify = 1;
  // --kv-mode split: the CPU's threads (--split-threads; 0: all but one), the rate its
  // partials are assumed to read K and V at until measured (--cpu-gbps; 0: the planner's guess)
  // and, where given, the share of the pages that would stream that it takes whatever the
  // rates (--split-share: a fixed plan, for measurements and tests).
  int32_t split_threads = 0;
  double cpu_bytes_per_s = 0;
  double split_share = 0;
  // --split-cpus: the CPUs the split threads run on, one each (empty: place_split_threads's
  // choice, or none where split_pinned is off: --split-cpus none).
  std::vector<int> split_cpus;
  bool split_pinned = true;
};

// A handle to one sequence: its slot in the engine and its length.
struct Sequence {
  int32_t id = -1;
  int32_t n_past = 0;
};

// One sequence's part of a forward pass.
struct BatchEntry {
  Sequence* seq = nullptr;
  const int32_t* tokens = nullptr;
  int32_t n = 0;
  // Logits of every token (a speculative verify step, n <= n_verify), not just of the last;
  // recurrent layers then go token by token, as n one-token steps would.
  bool all_logits = false;
  // With all_logits: the step continues the sequence's last verify step instead of starting
  // one (a draft model's drafts, a token a step after the step that fed it the accepted
  // tokens), so that truncate() can roll back into any of them; at most n_verify tokens in all.
  bool extend_verify = false;
  // Rows [n][n_embd] in device memory that the pass takes instead of the tokens' embeddings
  // (the MTP block's inputs); the tokens are still what the sequence holds.
  const float* embd = nullptr;
};

class Engine;

// Told of each step of an engine before step() returns, while the rows of its last layer are
// readable (Engine::hidden): the MTP drafter, which needs the target's state at every position.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // batch: the step's entries; their sequences' n_past already count the step's tokens.
  virtual void stepped(const Engine& e, const std::vector<BatchEntry>& batch) = 0;
};

struct StepStats {
  int32_t n_tokens = 0, n_seqs = 0;
  double seconds = 0;
  size_t bytes_in = 0;      // streamed host-to-device
  size_t bytes_out = 0;     // written back device-to-host
  int64_t chunks = 0;       // ring chunks consumed
  double ready_wait_s = 0;  // the compute stream stalled on ready fences (on the device)
  double copy_busy_s = 0;   // time the host-to-device copy stream was busy
  double issue_s = 0;       // host time to issue the step (before waiting for its logits)
  double occupancy = 0;     // mean fraction of ring slots in flight when a chunk was needed
  bool repartitioned = false;
  bool decode = false;  // every entry a decode or verify step's: the steps the plan is for
  // Split: the pages the CPU attended (all layers), again for each draft row of a verify step
  // (cpu_draft_pages), the bytes it read for every row, the CPU's time on them and the time the
  // device waited for its partials; the pages the device attended (all layers).
  int64_t cpu_pages = 0, cpu_draft_pages = 0;
  size_t cpu_bytes = 0;
  double cpu_s = 0, cpu_wait_s = 0;
  int64_t gpu_pages = 0;
};

// Which bound held in a step (or a mean step) of step_s: "pcie" or "cpu" where the copy
// engine's busy time or the CPU's is the larger and near the step's, else "gpu" (the device's
// compute and the host issuing it).
const char* step_bound(double step_s, double copy_s, double cpu_s);

struct EngineStats {
  int64_t steps = 0, tokens = 0, chunks = 0, repartitions = 0;
  int64_t prefetch_kept = 0, prefetch_dropped = 0;
  int64_t workspace_taken = 0;  // prefills that took the workspace back from the KV
  double seconds = 0, ready_wait_s = 0, copy_busy_s = 0, issue_s = 0, cpu_s = 0, cpu_wait_s = 0;
  size_t bytes_in = 0, bytes_out = 0, cpu_bytes = 0;
  int64_t cpu_pages = 0, cpu_draft_pages = 0, gpu_pages = 0;
};

// The KV cache's shape by layer kind, for planning without building an engine.
struct KvShape {
  int32_t n_full = 0, n_window = 0, n_recurrent = 0;  // layers of each kind
  int32_t max_pages = 0;     // pages of one sequence's whole history in a full layer
  int32_t window_pages = 0;  // frames one sequence's window takes in a window layer
  size_t page_bytes = 0;
  size_t full_bytes = 0;    // every full layer's history of every sequence
  size_t window_bytes = 0;  // every window layer's frames of every sequence
  // A recurrent layer's state of one sequence (f32: the conv tail, then the delta-rule state
  // of every value head), and every recurrent layer's of every sequence: resident, beside the
  // arena.
  size_t recurrent_layer_bytes = 0;
  size_t recurrent_bytes = 0;
};

class Engine {
 public:
  // shared: an engine on dev whose model has the same embedding or output matrix (the MTP
  // block's, built first): this one reads its copies instead of placing its own.
  Engine(const Model& model, Device& dev, const EngineOptions& opt, const Engine* shared = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Sizes the engine will use, for planning without building it: the activations of a pass of
  // -b tokens and the logits; those of a pass of `rows` tokens (without the logits).
  static size_t activation_bytes(const ModelConfig& c, const EngineOptions& o);
  static size_t pass_bytes(const ModelConfig& c, int64_t rows);
  // Whether o has a phase arena: a streaming mode with full layers and -b above --parallel.
  static bool phase_arena(const ModelConfig& c, const EngineOptions& o);
  // Rows of a decode step at most: a token of every sequence, or n_verify of each.
  static int32_t decode_rows(const EngineOptions& o) { return o.n_seq * o.n_verify; }
  // What the engine has its device set aside (reserve(), prefill_scratch()).
  static ScratchArgs scratch_args(const ModelConfig& c, const EngineOptions& o);
  static int32_t fixed_frames(const ModelConfig& c, const EngineOptions& o);
  static KvShape kv_shape(const ModelConfig& c, const EngineOptions& o);

  Sequence open_sequence();
  // Returns its pages to the pool; with a prompt cache, its completed pages go into it first.
  void close_sequence(Sequence& s);
  // With a prompt cache: gives s (just opened) copies of the cached pages that begin `tokens`
  // (n of them) up to the last matching token (for recurrent layers, the last checkpoint at or
  // before it, whose state it takes), leaving at least one token to evaluate, and returns the
  // positions they hold (s.n_past); 0 without a cache or a hit. Their logits are then those of
  // evaluating the whole prompt, bit for bit, where the backend's arithmetic per token does not
  // depend on the batch (the CPU's does).
  int32_t reuse_prefix(Sequence& s, const int32_t* tokens, int32_t n);
  // With a prompt cache and recurrent layers: keeps s's recurrent state at its length, to go
  // into the cache with its pages when it closes. step() takes one where a prefill ends (before
  // the step after it) and close_sequence() at the end; the points of checkpoint_due are the
  // caller's, which knows the prompt.
  void checkpoint(const Sequence& s);
  // With a prompt cache: puts s's pages so far (and a checkpoint at its end) into it now, as
  // closing it would, for other sequences to reuse while s goes on.
  void publish(const Sequence& s);
  // Whether checkpoints are kept: a prompt's last token is then read in a step of its own, so
  // that the state before it is a checkpoint (eval() does; so must other callers).
  bool keeps_checkpoints() const { return cache_ && shape_.n_recurrent > 0; }
  // nullptr without a prompt cache.
  const PromptCacheStats* prompt_cache_stats() const {
    return cache_ ? &cache_->cache().stats() : nullptr;
  }
  // The prompt cache's warnings since the last call (its disk tier's refused files and failed
  // writes), for the caller to show.
  std::vector<std::string> prompt_cache_warnings() {
    return cache_ ? cache_->cache().take_warnings() : std::vector<std::string>{};
  }
  // Slot files (serve --slot-save-path, chat /save): the prompt cache's pages of the longest
  // cached prefix of `tokens` written to `path` (under a temporary name, then renamed), with the
  // cache's fingerprint of the model and KV types and a checksum; returns the positions saved.
  // Fails (naming the path) without a prompt cache or where nothing of `tokens` is cached.
  int32_t save_prefix(const std::vector<int32_t>& tokens, const std::string& path,
                      size_t* bytes = nullptr);
  // Reads a slot file into the prompt cache, so that a prompt it begins reuses its pages; its
  // tokens into `tokens`. A file that is partial, corrupt or of another model, KV type or page
  // size is refused by name and nothing is loaded.
  void load_prefix(const std::string& path, std::vector<int32_t>& tokens, size_t* bytes = nullptr);
  // Drops the prompt cache's pages of `tokens` that no other cached sequence goes on from;
  // returns the positions dropped (0 without a cache).
  int32_t erase_prefix(const std::vector<int32_t>& tokens) {
    return cache_ ? cache_->cache().erase(tokens.data(), static_cast<int32_t>(tokens.size())) : 0;
  }
  // Appends n tokens to one sequence (in chunks of n_batch) and returns the logits of the last
  // one [n_vocab], valid until the next call. Fails when the sequence would pass n_ctx.
  const float* eval(Sequence& s, const int32_t* tokens, int32_t n);
  // One forward pass over several sequences (at most n_batch tokens in all); logits(i) are
  // those of entry i's last token.
  void step(const std::vector<BatchEntry>& batch);
  const float* logits(int32_t i) const;
  // Of entry i's token j (entries with all_logits; j = 0 otherwise).
  const float* logits(int32_t i, int32_t j) const;
  // Entry i's rows of the last step [n][n_embd] as the last layer left them (before the output
  // norm), in device memory, valid until the next step.
  const float* hidden(int32_t i) const {
    return hidden_ + static_cast<size_t>(offs_[static_cast<size_t>(i)]) * cfg_.n_embd;
  }
  // Tells o of every step from now on (null: no one).
  void observe(StepObserver* o) { observer_ = o; }
  // The weights as the device's kernels read them.
  const Weights& weights() const { return w_; }
  // Forgets the sequence's positions from n_past on (the rejected drafts of a verify step):
  // their pages go back, the tail page is writable again. With window layers at most
  // n_verify - 1 positions can go; with recurrent layers only those of the last step, when it
  // was a verify step, and of the steps that extended it, but never its first token (their
  // states are recomputed from the steps' inputs).
  void truncate(Sequence& s, int32_t n_past);
  // Appends n positions of random K and V rows (uniform in [-1, 1), from `seed`) to s in every
  // layer without running the model: a benchmark's fill to a depth, whose decode and prefill
  // speed depend on how much the cache holds, not on its values. The pages go where a prefill
  // would put them (resident frames, write-backs to the host store, managed or host memory).
  void fill_random(Sequence& s, int32_t n, uint32_t seed);

  const KvLayout& kv_layout() const { return kv_; }
  const KvShape& kv_shape() const { return shape_; }
  size_t kv_bytes_per_token() const;  // what the history grows by (full layers)
  const EngineOptions& options() const { return opt_; }
  const Plan& plan() const { return plan_; }
  // The decode's arena.
  size_t arena_bytes() const { return pages_->pool() ? pages_->pool()->bytes() : 0; }
  // The frames a prefill takes back for its workspace (0: no phase arena); whether it has them.
  size_t workspace_bytes() const { return static_cast<size_t>(work_frames_) * kv_.page_bytes(); }
  bool in_prefill_phase() const { return pages_->pool() && pages_->pool()->top() > 0; }
  int32_t fixed_frames() const { return fixed_frames_; }
  size_t host_bytes() const { return pages_->host() ? pages_->host()->bytes() : 0; }
  // Split mode: its threads, and the CPUs they run on (empty: not pinned).
  int32_t split_threads() const { return split_ ? split_->placed().threads : 0; }
  const std::vector<int>& split_cpus() const;
  const StepStats& last_step() const { return last_; }
  const EngineStats& totals() const { return totals_; }

 private:
  // A layer's spans as the last attend() built them, while every page had a frame: a decode
  // step only lengthens the last one, so it is kept instead of rebuilt, which at long contexts
  // would take much of the host's time for a step.
  struct SpanCache {
    uint64_t epoch = 0;  // pages_->epoch() when built; 0: never
    int32_t pages = 0;   // the sequence's pages then
    bool resident = false;
    std::vector<Span> spans;
  };
  struct Slot {
    bool live = false;
    int32_t n_past = 0;
    std::vector<SpanCache> spans;  // [layer]
    bool reading = false;          // its last step read a prompt chunk
  };
  // One forward pass: the batch, where each entry's rows start, the next ring item.
  struct Pass {
    const std::vector<BatchEntry>& batch;
    std::vector<int32_t> offs;
    int32_t n_tok = 0;
    int32_t cursor = 0;
  };
  // The resident cap of a full layer's pages (il: the model's layer).
  int32_t cap(int32_t seq, int32_t il) const {
    return resident_cap(plan_, static_cast<size_t>(seq), kv_index_[static_cast<size_t>(il)]);
  }
  // Host mode: K/V rows and attention on the host, the host store holding every page.
  bool host_mode() const { return opt_.kv_mode == KvMode::Host; }
  bool full(int32_t il) const { return cfg_.kinds[static_cast<size_t>(il)] == LayerKind::Full; }
  bool recurrent(int32_t il) const {
    return cfg_.kinds[static_cast<size_t>(il)] == LayerKind::Recurrent;
  }
  // The layer's index in the host store and the ring: among the full layers, or (host mode,
  // where the host keeps every attention layer) among the full and window layers.
  int32_t store_layer(int32_t il) const {
    return (host_mode() ? attn_index_ : kv_index_)[static_cast<size_t>(il)];
  }

  void place(const Model& model, const Engine* shared);  // the weights on the device
  // The forward pass of each architecture family (engine/forward_*.cpp) over the blocks below.
  void forward_llama(Pass& p);
  void forward_gemma3(Pass& p);
  // h_ (the normed rows) -> q, k, v -> the layer's pages -> att_: every entry's attention.
  void self_attention(Pass& p, int32_t il);
  // x_ -> ffn_norm -> down(silu(gate) * up) of n rows -> x_ += it.
  void swiglu_ffn(int32_t il, int32_t n);
  // h_ -> a Gated DeltaNet layer of every entry, each over its sequence's state -> x_ += it.
  void gated_delta_net(Pass& p, int32_t il);
  // Each entry's last row of x_ -> logits_.
  void output_logits(Pass& p);
  // The tokens' embeddings, or the entries' own rows (BatchEntry::embd) -> x_.
  void embed_inputs(const Pass& p);

  void replan(const std::vector<BatchEntry>& batch);
  // Points the activations at the decode buffers, or at the workspace, and lends the backend
  // its part of it.
  void set_phase(bool prefill);
  // Lends the workspace's scratch to the device for this pass: another engine on the device (a
  // draft model's, the MTP block's) may have lent its own, of its own geometry, since.
  void lend_scratch();
  // The ring's schedule of a pass (pages.cpp).
  std::vector<RingItem> ring_items(const std::vector<BatchEntry>& batch, bool next) const;
  // The page frames of the batch's tokens at layer il, in batch order (in dst_).
  uint8_t* const* kv_pages(int32_t il, const std::vector<BatchEntry>& batch);
  void attend(int32_t il, const BatchEntry& e, int32_t entry, int32_t off, int32_t& cursor);
  void attend_host(int32_t il, const BatchEntry& e, int32_t off);
  void measure(const StepStats& st);
  // Split (engine/attend.cpp): pages [first, second) of entry e at full layer il go to the CPU
  // this step (with `next`, the step after it); the layer's queries and pages to the worker.
  std::pair<int32_t, int32_t> cpu_pages(int32_t il, const BatchEntry& e, bool next) const;
  // Whether the CPU takes a share of e's pages: an entry of a decode or verify step's size.
  bool cpu_serves(const BatchEntry& e) const { return e.n <= opt_.n_verify; }
  void post_split(int32_t il, const Pass& p);

  const ModelConfig& cfg_;
  Device& dev_;
  EngineOptions opt_;
  Weights w_;
  const uint8_t *host_embd_ = nullptr, *host_output_ = nullptr;  // the model's, as loaded
  KvLayout kv_;
  KvShape shape_;
  std::vector<int32_t> kv_index_;    // [layer]: index among the full layers, -1 for the others
  std::vector<int32_t> attn_index_;  // [layer]: index among the others, -1 for the recurrent
  // qwen35: attn_q's rows regrouped [q of every head; gate of every head] (the file has them
  // per head), so that each is one product: [layer], empty for the others.
  std::vector<std::vector<uint8_t>> gated_q_;
  std::unique_ptr<RecurrentState> rec_;  // the recurrent layers' states and their rollback
  RopeParams rope_, rope_swa_;           // full and window layers
  int32_t max_pages_ = 0;                // per layer and sequence
  int32_t fixed_frames_ = 0;
  std::vector<Slot> slots_;

  std::unique_ptr<PagePlacement> pages_;
  Plan plan_;
  bool plan_dirty_ = true;
  bool ring_check_ = false;  // decode steps found the ring too small: replan to grow it
  int32_t short_ring_steps_ = 0;
  double ring_stall_s_ = 0;  // the last decode step's wait, which sizes such a growth
  bool relayout_ = false;    // the next plan is applied even if unchanged (pages were adopted)
  std::unique_ptr<PromptCacheLink> cache_;  // null: no prompt cache
  // Measured figures for the planner (exponential averages; 0: not measured yet), and the
  // rate it assumes until it is: --h2d-gbps (capped by --h2d-limit). The CPU's are split_'s.
  double h2d_ = 0, layer_s_ = 0, stall_s_ = 0;
  double h2d_assumed_ = 0;

  std::unique_ptr<SplitAttention> split_;  // split mode

  // Activations of a pass (rows: its tokens), carved from one region by carve().
  struct Activations {
    float *x, *h, *q, *k, *v, *att;  // [rows][n_embd], [rows][max(n_embd, q_dim)], [rows][q_dim],
                                     // [rows][kv_dim] x 2, [rows][q_dim]
    float* acc;                      // [rows][n_head][2]
    float *gate, *up;                // [rows][n_ff]
    // qwen35 (0 wide for the others): the attention's output gate [rows][q_dim]; a Gated
    // DeltaNet layer's [q, k, v] projection [rows][conv_dim], z and output [rows][value_dim],
    // alpha and beta [rows][v_heads].
    float *attn_gate, *mix, *z, *alpha, *beta, *y;
  };
  static size_t carve(const ModelConfig& c, int64_t rows, uint8_t* base, Activations* a);
  // The activations in use: act_mem_'s (n_batch rows; n_seq with a phase arena) or, during a
  // prefill, the workspace's (n_batch rows, followed by the backend's prefill scratch).
  Activations act_{};
  DeviceBuffer act_mem_, logits_;
  int32_t work_frames_ = 0;        // the workspace's frames at the top of the arena (0: none)
  size_t work_scratch_ = 0;        // the backend's part of it
  uint8_t* scratch_at_ = nullptr;  // where it is, while a prefill holds the workspace
  int64_t max_spans_ = 0;          // the most spans a pass attends over (reserve()'s)
  std::vector<int32_t> ids_, pos_, page_slot_;
  std::vector<uint8_t*> dst_;
  std::vector<Span> spans_;
  // Host mode: the queries, K/V rows and attention's output on the host, where the CPU
  // writes and attends over the host store (cpu/host_attention.h) whatever dev_ is.
  std::vector<float> hq_, hk_, hv_, hatt_, hacc_;
  std::vector<std::pair<int32_t, int32_t>> lrows_;  // per entry of the last step: first row, rows
  // The last step's activations x (hidden()) and each entry's first row in them.
  const float* hidden_ = nullptr;
  std::vector<int32_t> offs_;
  StepObserver* observer_ = nullptr;
  DeviceBuffer hlogits_;  // the logits, on the host (pinned: [n_seq][n_vocab])

  StepStats last_;
  EngineStats totals_;
};

}  // namespace kvs
