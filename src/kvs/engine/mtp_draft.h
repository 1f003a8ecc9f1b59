// The MTP drafter: drafts for speculative decoding from the model's own multi-token-prediction
// block (qwen35's nextn layer, blk.n_layer), as DeepSeek-V3 and Qwen3-Next define it. Entry q
// pairs the target's final state at position q, h_q (its last layer's output after the output
// norm), with the token after it, t_{q+1}: the block reads eh_proj [enorm(embed(t_{q+1}));
// hnorm(h_q)] at position q, runs a gated full-attention layer over its own KV of the entries
// before and its FFN, and its shared_head_norm and the model's LM head predict t_{q+2}. It runs
// as an Engine of one layer, its KV resident, whose steps take those rows instead of embeddings;
// built before the target's engine, so that the target's arena takes what it leaves.
//
// It follows the target's steps (StepObserver): a step's rows give the entries of the positions
// whose next token the step holds, from the target's true states; its last rows are kept for
// the entries whose next token comes later. Drafting k tokens reads the kept state of the last
// position the target read with the token it reads next, then k - 1 times the block's own output
// (after shared_head_norm) with its own draft. Entries made from drafts or from the block's own
// state are speculative: the target's next step makes them again from its true states, the
// block's KV rolled back to the last entry whose tokens the target kept.
#pragma once

#include <cstdint>
#include <vector>

#include "kvs/engine/engine.h"
#include "kvs/engine/drafter.h"

namespace kvs {

class MtpDrafter final : public Drafter, public StepObserver {
 public:
  // o: the target's options (-c, -b, --parallel, --page-size, -ctk, -ctv, n_verify). Fails,
  // naming the model's file, unless it is a qwen35 model with an MTP block (before allocating
  // anything). p_min as ModelDrafter's.
  MtpDrafter(const Model& target, Device& dev, const EngineOptions& o, int32_t draft_max,
             double p_min);
  MtpDrafter(const MtpDrafter&) = delete;
  MtpDrafter& operator=(const MtpDrafter&) = delete;

  // The target's engine, whose steps it is told of from now on; the sequence numbers of the
  // calls below are that engine's Sequence ids. The drafter must outlive its steps.
  void follow(Engine& target);
  // The drafts of several sequences, the block's steps batched; none for a sequence whose
  // target state it does not have (a position the target read without a step it saw).
  void propose(const std::vector<Ask>& asks) override;

  void stepped(const Engine& e, const std::vector<BatchEntry>& batch) override;

  // The block's engine: after a target step, logits(i) are the block's of the last entry made
  // for that step's i-th sequence that made any (tests compare them with the reference).
  const Engine& engine() const { return eng_; }
  size_t device_bytes() const { return device_bytes_; }  // weights, buffers and KV

 private:
  struct Seq : Track {
    Sequence mtp;               // in eng_: position q holds entry q
    std::vector<int32_t> seen;  // what the target's KV held after the last step it was told of
    // Entries [0, n_true) come from the target's states and the tokens basis[0 .. n_true]; they
    // hold while those begin the target's tokens. The KV may hold drafted entries after them.
    int32_t n_true = 0;
    std::vector<int32_t> basis;
    int32_t first = 0, kept = 0;  // the positions of the target's last step whose rows are kept
  };
  Track& track(int32_t seq) override { return seqs_.at(static_cast<size_t>(seq)); }
  // Keeps the true entries while their tokens begin `tokens`.
  static void still_true(Seq& s, const std::vector<int32_t>& tokens);
  // Row i of the target's state at position q kept for s (q in [first, first + kept)).
  const float* kept_row(const Seq& s, int32_t q) const;
  // One row of the block's next step: token t after a state h (norm: its final norm).
  void add_row(int32_t t, const float* h, const float* norm);
  // in_ from the rows added: eh_proj [enorm(embed(t)); hnorm(norm(h))]; then no rows.
  void make_inputs();

  const ModelConfig& cfg_;
  Device& dev_;
  const int32_t keep_;  // rows kept per sequence: n_verify
  size_t device_bytes_ = 0;
  Model block_;     // the MTP block as a one-layer model over the target's embedding and head
  Matrix eh_proj_;  // [n_embd x 2 n_embd], placed on the device
  // [enorm; hnorm; the target's output norm; the block's final norm], [n_embd] each
  DeviceBuffer norms_;
  Engine eng_;
  // Rows of a step of the block: [rows][n_embd] the target's kept states, then the block's input,
  // embeddings and final-normed states; [rows][2 n_embd] their concatenation.
  DeviceBuffer kept_, in_, emb_, normed_, cat_;
  std::vector<Seq> seqs_;
  std::vector<BatchEntry> batch_;  // scratch: the block's step
  std::vector<int32_t> row_tok_;
  std::vector<const float*> row_h_, row_norm_;
};

}  // namespace kvs
