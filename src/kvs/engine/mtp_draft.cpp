#include "kvs/engine/mtp_draft.h"

#include <algorithm>

#include "kvs/gguf/gguf.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

// The MTP block as a model of one full-attention layer: its own embedding and head where the
// file has them, else the target's; shared_head_norm (else the target's output norm) as its
// output norm. Refuses other models, naming the file.
Model block_model(const Model& target) {
  const ModelConfig& c = target.config;
  const std::string file = target.file ? target.file->name() : c.name;
  KVS_CHECK(c.arch == Arch::Qwen35, "--spec mtp: ", file, " is a ", c.arch_name,
            " model; MTP drafts come from the nextn layer of qwen35 models");
  KVS_CHECK(c.n_nextn >= 1 && !target.weights.nextn.empty(), "--spec mtp: ", file,
            " has no MTP (nextn) layer (qwen35.nextn_predict_layers is 0); use --spec ngram or "
            "a draft model");
  const NextnWeights& n = target.weights.nextn[0];
  Model m;
  m.config = c;
  m.config.name = c.name + " (MTP block)";
  m.config.n_layer = 1;
  m.config.kinds = {LayerKind::Full};
  m.config.n_nextn = 0;
  Weights& w = m.weights;
  w.tok_embd = n.embed_tokens.n_out > 0 ? n.embed_tokens : target.weights.tok_embd;
  w.output = n.shared_head_head.n_out > 0 ? n.shared_head_head : target.weights.output;
  m.config.tied_embeddings = w.output.data == w.tok_embd.data;
  w.output_norm = n.shared_head_norm.empty() ? target.weights.output_norm : n.shared_head_norm;
  w.rope_freqs = target.weights.rope_freqs;
  w.layers = {n.block};
  return m;
}

// eh_proj as the device's kernels read it (placed as a model's only matrix).
Matrix place_matrix(Device& dev, const Matrix& m) {
  Weights w;
  w.tok_embd = w.output = m;
  return dev.place_weights(w).tok_embd;
}

// The block's engine: the target's shape, its KV resident. A step of it takes, per sequence, a
// target step's rows and the one before them, or the kept rows of the target's last verify step.
EngineOptions block_options(const EngineOptions& o) {
  EngineOptions b;
  b.n_ctx = o.n_ctx;
  b.n_batch = o.n_batch + o.n_seq * o.n_verify;
  b.page_size = o.page_size;
  b.k_type = o.k_type;
  b.v_type = o.v_type;
  b.n_seq = o.n_seq;
  b.kv_mode = KvMode::Resident;
  b.phase_arena = false;
  return b;
}

int32_t len(const std::vector<int32_t>& v) {
  return static_cast<int32_t>(v.size());
}

int32_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<int32_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first -
                              a.begin());
}

}  // namespace

MtpDrafter::MtpDrafter(const Model& target, Device& dev, const EngineOptions& o, int32_t draft_max,
                       double p_min)
    : Drafter("MTP", target.config.n_vocab, draft_max, p_min),
      cfg_(target.config),
      dev_(dev),
      keep_(o.n_verify),
      device_bytes_(dev.used()),
      block_(block_model(target)),
      eh_proj_(place_matrix(dev, target.weights.nextn[0].eh_proj)),
      eng_(block_, dev, block_options(o)),
      seqs_(static_cast<size_t>(o.n_seq)) {
  const size_t d = static_cast<size_t>(cfg_.n_embd), f = sizeof(float);
  const size_t rows = static_cast<size_t>(eng_.options().n_batch);
  const NextnWeights& n = target.weights.nextn[0];
  norms_ = dev.alloc(4 * d * f, "the MTP block's norms");
  const Vec* norms[] = {&n.enorm, &n.hnorm, &target.weights.output_norm,
                        &block_.weights.output_norm};
  for (size_t i = 0; i < 4; ++i) dev.upload(norms_.as<float>() + i * d, norms[i]->data(), d * f);
  kept_ = dev.alloc(seqs_.size() * static_cast<size_t>(keep_) * d * f, "the MTP block's states");
  in_ = dev.alloc(rows * d * f, "the MTP block's inputs");
  emb_ = dev.alloc(rows * d * f, "the MTP block's inputs");
  normed_ = dev.alloc(rows * d * f, "the MTP block's inputs");
  cat_ = dev.alloc(rows * 2 * d * f, "the MTP block's inputs");
  for (Seq& s : seqs_) s.mtp = eng_.open_sequence();
  device_bytes_ = dev.used() - device_bytes_;
}

void MtpDrafter::follow(Engine& target) {
  KVS_CHECK(target.options().n_seq == static_cast<int32_t>(seqs_.size()) &&
                target.options().n_verify <= keep_,
            "--spec mtp: the target's engine has other options than the MTP block's");
  target.observe(this);
}

void MtpDrafter::still_true(Seq& s, const std::vector<int32_t>& tokens) {
  s.n_true = std::max(0, std::min(s.n_true, common_prefix(s.basis, tokens) - 1));
  s.basis.resize(s.n_true > 0 ? static_cast<size_t>(s.n_true) + 1 : 0);
}

const float* MtpDrafter::kept_row(const Seq& s, int32_t q) const {
  const auto i = static_cast<size_t>(&s - seqs_.data()) * static_cast<size_t>(keep_) +
                 static_cast<size_t>(q - s.first);
  return kept_.as<float>() + i * static_cast<size_t>(cfg_.n_embd);
}

void MtpDrafter::add_row(int32_t t, const float* h, const float* norm) {
  row_tok_.push_back(t);
  row_h_.push_back(h);
  row_norm_.push_back(norm);
}

void MtpDrafter::make_inputs() {
  const int64_t d = cfg_.n_embd;
  const auto n = static_cast<int32_t>(row_tok_.size());
  const float *enorm = norms_.as<float>(), *hnorm = enorm + d;
  float *emb = emb_.as<float>(), *normed = normed_.as<float>(), *cat = cat_.as<float>();
  dev_.embed(eng_.weights().tok_embd, row_tok_.data(), n, emb);
  // Row by row: the states come from several places, and the halves of a row of cat_ are not
  // rows of their own.
  for (int64_t r = 0; r < n; ++r) {
    const auto u = static_cast<size_t>(r);
    dev_.rmsnorm(emb + r * d, enorm, cat + 2 * r * d, 1, d, cfg_.norm_eps);
    dev_.rmsnorm(row_h_[u], row_norm_[u], normed + r * d, 1, d, cfg_.norm_eps);
    dev_.rmsnorm(normed + r * d, hnorm, cat + (2 * r + 1) * d, 1, d, cfg_.norm_eps);
  }
  dev_.matmul(eh_proj_, cat, in_.as<float>(), n, nullptr);
  row_tok_.clear();
  row_h_.clear();
  row_norm_.clear();
}

void MtpDrafter::stepped(const Engine& e, const std::vector<BatchEntry>& batch) {
  const int64_t d = cfg_.n_embd;
  const float* out_norm = norms_.as<float>() + 2 * d;
  batch_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& b = batch[i];
    Seq& s = seqs_.at(static_cast<size_t>(b.seq->id));
    const int32_t p = b.seq->n_past - b.n;
    s.seen.resize(static_cast<size_t>(p), -1);  // -1: positions it was not told of
    s.seen.insert(s.seen.end(), b.tokens, b.tokens + b.n);
    still_true(s, s.seen);
    // Entries [n_true, end) have their next token now; those before p take the kept rows.
    const int32_t end = p + b.n - 1, q0 = s.n_true;
    if (q0 >= end || (q0 < p && (q0 < s.first || q0 >= s.first + s.kept))) continue;
    const float* rows = e.hidden(static_cast<int32_t>(i));
    const auto at = static_cast<int64_t>(row_tok_.size());
    for (int32_t q = q0; q < end; ++q)
      add_row(s.seen[static_cast<size_t>(q) + 1], q >= p ? rows + (q - p) * d : kept_row(s, q),
              out_norm);
    if (s.mtp.n_past > q0) eng_.truncate(s.mtp, q0);
    batch_.push_back(
        {&s.mtp, s.seen.data() + q0 + 1, end - q0, false, false, in_.as<float>() + at * d});
    s.n_true = end;
    s.basis.assign(s.seen.begin(), s.seen.begin() + end + 1);
  }
  if (!batch_.empty()) {
    make_inputs();
    eng_.step(batch_);
  }
  // The rows later entries may need, once the inputs above have read the ones they replace: a
  // verify step's rows (the target keeps some of them), or a prefill's last.
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& b = batch[i];
    Seq& s = seqs_.at(static_cast<size_t>(b.seq->id));
    const int32_t k = std::min(b.n, keep_);
    s.first = b.seq->n_past - k;
    s.kept = k;
    dev_.copy(Stream::Compute, const_cast<float*>(kept_row(s, s.first)),
              e.hidden(static_cast<int32_t>(i)) + (b.n - k) * d,
              static_cast<size_t>(k * d) * sizeof(float));
  }
}

void MtpDrafter::propose(const std::vector<Ask>& asks) {
  const int64_t d = cfg_.n_embd;
  const float *out_norm = norms_.as<float>() + 2 * d, *own_norm = out_norm + d;
  struct Live {
    const Ask* ask;
    Seq* seq;
  };
  std::vector<Live> live;
  batch_.clear();
  for (const Ask& a : asks) {
    if (!begin(a)) continue;
    Seq& s = seqs_.at(static_cast<size_t>(a.seq));
    // The target read up to q; it reads t_{q+1} next: entry q starts the drafts.
    const int32_t q = len(s.tokens) - 2;
    still_true(s, s.tokens);
    if (q < 0 || s.n_true < q || q < s.first || q >= s.first + s.kept ||
        common_prefix(s.seen, s.tokens) <= q)
      continue;
    if (s.mtp.n_past > q) eng_.truncate(s.mtp, q);
    s.n_true = q + 1;
    s.basis.assign(s.tokens.begin(), s.tokens.begin() + q + 2);
    const auto at = static_cast<int64_t>(row_tok_.size());
    add_row(s.tokens.back(), kept_row(s, q), out_norm);
    batch_.push_back({&s.mtp, &s.tokens.back(), 1, false, false, in_.as<float>() + at * d});
    a.out->tokens.reserve(static_cast<size_t>(a.max));
    live.push_back({&a, &s});
  }
  while (!batch_.empty()) {
    make_inputs();
    eng_.step(batch_);
    batch_.clear();
    std::vector<Live> next;
    for (size_t i = 0; i < live.size(); ++i) {
      const auto [a, s] = live[i];
      if (!next_draft(*s, *a, eng_.logits(static_cast<int32_t>(i)))) continue;
      const int32_t& t = a->out->tokens.back();
      const auto at = static_cast<int64_t>(row_tok_.size());
      add_row(t, eng_.hidden(static_cast<int32_t>(i)), own_norm);
      batch_.push_back({&s->mtp, &t, 1, false, false, in_.as<float>() + at * d});
      next.push_back(live[i]);
    }
    live = std::move(next);
  }
}

}  // namespace kvs
