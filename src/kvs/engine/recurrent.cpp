#include "kvs/engine/recurrent.h"

#include <algorithm>
#include <cstring>

#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs {

RecurrentState::RecurrentState(Device& dev, const ModelConfig& c, int32_t n_recurrent,
                               size_t layer_bytes, int32_t n_seq, int32_t n_verify)
    : dev_(dev),
      cfg_(c),
      n_recurrent_(n_recurrent),
      n_verify_(n_verify),
      layer_bytes_(layer_bytes),
      seq_bytes_(layer_bytes * static_cast<size_t>(n_recurrent)),
      index_(static_cast<size_t>(c.n_layer), -1),
      verified_(static_cast<size_t>(n_seq), 0) {
  for (int32_t il = 0, r = 0; il < c.n_layer; ++il)
    if (c.kinds[static_cast<size_t>(il)] == LayerKind::Recurrent)
      index_[static_cast<size_t>(il)] = r++;
  const size_t all = seq_bytes_ * static_cast<size_t>(n_seq);
  if (all == 0) return;
  state_ = dev.alloc(all, "recurrent state");
  if (n_verify == 1) return;
  snap_ = dev.alloc(all, "recurrent state before a verify step");
  row_ = c.ssm_conv_dim() + c.ssm_value_dim() + 2 * int64_t{c.ssm_v_heads};
  inputs_ = dev.alloc(static_cast<size_t>(n_recurrent) * static_cast<size_t>(n_seq) *
                          static_cast<size_t>(n_verify) * static_cast<size_t>(row_) * sizeof(float),
                      "recurrent inputs of a verify step");
}

void RecurrentState::reset(int32_t s) {
  verified_[static_cast<size_t>(s)] = 0;
  if (n_recurrent_ == 0) return;
  std::memset(staging(), 0, seq_bytes_);
  dev_.upload(state_.as() + static_cast<size_t>(s) * seq_bytes_, staging(), seq_bytes_);
}

void RecurrentState::begin_step(int32_t s, int32_t n, bool all_logits, bool extend_verify) {
  int32_t& verified = verified_[static_cast<size_t>(s)];
  if (!all_logits || !snap_.as()) {
    verified = 0;
    return;
  }
  if (extend_verify) {  // its inputs go after those of the steps it extends
    KVS_CHECK(verified > 0 && verified + n <= n_verify_, "step: ", n,
              " tokens extend a verify step of ", verified, ", more than n_verify ", n_verify_,
              " in all, or the sequence's last step was no verify step");
    verified += n;
    return;
  }
  verified = n;
  const size_t at = static_cast<size_t>(s) * seq_bytes_;
  dev_.copy(Stream::Compute, snap_.as() + at, state_.as() + at, seq_bytes_);
}

size_t RecurrentState::slot_layer(int32_t s, int32_t il) const {
  return static_cast<size_t>(s) * static_cast<size_t>(n_recurrent_) +
         static_cast<size_t>(index_[static_cast<size_t>(il)]);
}

float* RecurrentState::state(int32_t s, int32_t il) const {
  return reinterpret_cast<float*>(state_.as() + slot_layer(s, il) * layer_bytes_);
}

DeltaNetArgs RecurrentState::args(int32_t s, int32_t il, int32_t n_tok,
                                  const LayerWeights& L) const {
  const ModelConfig& c = cfg_;
  DeltaNetArgs a;
  a.conv_state = state(s, il);
  a.state = a.conv_state + int64_t{c.ssm_conv - 1} * c.ssm_conv_dim();
  a.conv_w = L.ssm_conv1d.data();
  a.dt_bias = L.ssm_dt.data();
  a.a = L.ssm_a.data();
  a.norm = L.ssm_norm.data();
  a.n_tok = n_tok;
  a.conv = c.ssm_conv;
  a.k_heads = c.ssm_k_heads;
  a.v_heads = c.ssm_v_heads;
  a.head = c.ssm_state;
  a.eps = c.norm_eps;
  return a;
}

std::array<float*, 4> RecurrentState::saved_inputs(int32_t s, int32_t il) const {
  const ModelConfig& c = cfg_;
  const int64_t V = n_verify_, vd = c.ssm_value_dim();
  float* in = reinterpret_cast<float*>(inputs_.as()) +
              slot_layer(s, il) * static_cast<size_t>(V) * static_cast<size_t>(row_);
  return {in, in + V * c.ssm_conv_dim(), in + V * (c.ssm_conv_dim() + vd),
          in + V * (c.ssm_conv_dim() + vd + c.ssm_v_heads)};
}

void RecurrentState::roll_back(int32_t s, int32_t back, const Weights& w, float* y) {
  int32_t& verified = verified_[static_cast<size_t>(s)];
  KVS_CHECK(back < verified, "truncate: recurrent layers roll back only within ",
            "the last step, a verify step, and the steps that extended it, but its first token (",
            verified, " tokens); asked for ", back, " positions");
  const int32_t kept = verified - back;
  const size_t at = static_cast<size_t>(s) * seq_bytes_;
  dev_.copy(Stream::Compute, state_.as() + at, snap_.as() + at, seq_bytes_);
  for (int32_t il = 0; il < cfg_.n_layer; ++il) {
    if (index_[static_cast<size_t>(il)] < 0) continue;
    const auto [qkv, z, alpha, beta] = saved_inputs(s, il);
    DeltaNetArgs a = args(s, il, kept, w.layers[static_cast<size_t>(il)]);
    a.qkv = qkv;
    a.z = z;
    a.alpha = alpha;
    a.beta = beta;
    a.y = y;  // the outputs went into the verify step already
    a.chunk = 1;
    dev_.gated_delta_net(a);
  }
  verified = 0;
}

uint8_t* RecurrentState::staging() const {
  if (!staging_.as()) staging_ = dev_.alloc_host(seq_bytes_, "recurrent state staging");
  return staging_.as();
}

namespace {

// A state's bytes between the staging and a checkpoint in pieces on the thread pool: the
// checkpoint's memory is fresh, and one thread's first touches of its pages would take longer
// than the link.
void copy_state(uint8_t* to, const uint8_t* from, size_t n) {
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<PoolCopy> pieces;
  for (size_t at = 0; at < n; at += kPiece)
    pieces.push_back({to + at, from + at, std::min(kPiece, n - at)});
  copy_on_pool(pieces);
}

}  // namespace

void RecurrentState::download(int32_t s, uint8_t* to) const {
  dev_.download(staging(), state_.as() + static_cast<size_t>(s) * seq_bytes_, seq_bytes_);
  copy_state(to, staging(), seq_bytes_);
}

void RecurrentState::upload(int32_t s, const uint8_t* from) {
  copy_state(staging(), from, seq_bytes_);
  dev_.upload(state_.as() + static_cast<size_t>(s) * seq_bytes_, staging(), seq_bytes_);
}

}  // namespace kvs
