#include "kvs/engine/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kvs/util/error.h"

namespace kvs {

namespace {

// Total order: higher logit first, lower id first on ties (so results never depend on how the
// standard library orders equal elements).
inline bool better(float la, int32_t ia, float lb, int32_t ib) {
  return la > lb || (la == lb && ia < ib);
}

uint64_t random_seed() {
  std::random_device rd;
  uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  s ^= static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  if (s == Sampler::kSeedRandom) s ^= 1;
  return s;
}

// The first id of the largest logit, NaNs skipped (a NaN compares false); n when every logit is
// NaN or -inf. Lanes of maxima, then the first eight holding it.
size_t first_max(const float* l, size_t n) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float mx = -kInf;
  size_t i = 0;
#if defined(__AVX2__)
  __m256 lane[4];  // four chains, so that each max waits on the one four before
  for (__m256& v : lane) v = _mm256_set1_ps(-kInf);
  for (; i + 32 <= n; i += 32)
    for (size_t j = 0; j < 4; ++j)  // a NaN loses: max_ps returns its second operand
      lane[j] = _mm256_max_ps(_mm256_loadu_ps(l + i + 8 * j), lane[j]);
  float m8[8];
  _mm256_storeu_ps(m8, _mm256_max_ps(_mm256_max_ps(lane[0], lane[1]),
                                     _mm256_max_ps(lane[2], lane[3])));
  for (float m : m8) mx = m > mx ? m : mx;
#endif
  for (; i < n; ++i) mx = l[i] > mx ? l[i] : mx;
  if (!(mx > -kInf)) return n;
  i = 0;
#if defined(__AVX2__)
  const __m256 want = _mm256_set1_ps(mx);
  for (; i + 8 <= n; i += 8)
    if (const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + i), want, _CMP_EQ_OQ)))
      return i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(hit)));
#endif
  while (l[i] != mx) ++i;
  return i;
}

}  // namespace

Sampler::Sampler(SamplerParams p) : p_(p) {
  KVS_CHECK(std::isfinite(p_.temp), "--temp: must be a finite number, got ", p_.temp);
  KVS_CHECK(p_.top_p > 0.0f && p_.top_p <= 1.0f, "--top-p: must be in (0, 1], got ", p_.top_p);
  KVS_CHECK(p_.min_p >= 0.0f && p_.min_p <= 1.0f, "--min-p: must be in [0, 1], got ", p_.min_p);
  KVS_CHECK(std::isfinite(p_.repeat_penalty) && p_.repeat_penalty > 0.0f,
            "--repeat-penalty: must be a finite number > 0, got ", p_.repeat_penalty);
  KVS_CHECK(p_.repeat_last_n >= -1, "--repeat-last-n: must be >= -1 (-1: all, 0: off), got ",
            p_.repeat_last_n);
  seed_ = p_.seed == kSeedRandom ? random_seed() : p_.seed;
  rng_.seed(seed_);
  if (p_.grammar) {
    KVS_CHECK(p_.grammar->grammar && p_.grammar->vocab, "sampler: a grammar without its vocab");
    matcher_.emplace(p_.grammar->grammar);
  }
}

void Sampler::reset() {
  history_.clear();
  rng_.seed(seed_);
  last_candidates_ = 0;
  if (matcher_) matcher_->reset();
}

void Sampler::accept(int32_t token) {
  history_.push_back(token);
  // Keep only what the penalty can look at, and what forget() may drop (amortised: trim in
  // batches).
  const size_t n = static_cast<size_t>(p_.repeat_last_n) + kMaxForget;
  if (p_.repeat_last_n >= 0 && history_.size() > 2 * n + 256) {
    history_.erase(history_.begin(), history_.end() - static_cast<std::ptrdiff_t>(n));
  }
}

void Sampler::forget(int32_t n) {
  KVS_CHECK(n >= 0 && n <= kMaxForget && static_cast<size_t>(n) <= history_.size(),
            "sampler: cannot forget ", n, " of ", history_.size(), " tokens");
  history_.resize(history_.size() - static_cast<size_t>(n));
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::apply_penalty(int32_t n_vocab) {
  if (p_.repeat_penalty == 1.0f || p_.repeat_last_n == 0 || history_.empty()) return;
  size_t n = history_.size();
  if (p_.repeat_last_n > 0) n = std::min(n, static_cast<size_t>(p_.repeat_last_n));
  window_.assign(history_.end() - static_cast<std::ptrdiff_t>(n), history_.end());
  std::sort(window_.begin(), window_.end());
  window_.erase(std::unique(window_.begin(), window_.end()), window_.end());
  // Each distinct token is penalised once, however often it occurs (as llama.cpp).
  for (int32_t t : window_) {
    if (t < 0 || t >= n_vocab) continue;
    float& l = work_[static_cast<size_t>(t)];
    l = l <= 0.0f ? l * p_.repeat_penalty : l / p_.repeat_penalty;
  }
}

bool Sampler::ranks_before(const Cand& a, const Cand& b) {
  return better(a.logit, a.id, b.logit, b.id);
}


void Sampler::keep_top_k(size_t k) {
  const size_t n = work_.size();
  cand_.clear();
  if (k <= n / 16) {
    // One pass with a heap of the k best (front: the worst of them); almost every token is
    // rejected by one float compare. Ids come in increasing order, so a tie never displaces.
    for (size_t i = 0; i < k; ++i) cand_.push_back({work_[i], static_cast<int32_t>(i)});
    std::make_heap(cand_.begin(), cand_.end(), ranks_before);
    float worst = cand_.front().logit;
    for (size_t i = k; i < n; ++i) {
      const float l = work_[i];
      if (l > worst) {
        std::pop_heap(cand_.begin(), cand_.end(), ranks_before);
        cand_.back() = {l, static_cast<int32_t>(i)};
        std::push_heap(cand_.begin(), cand_.end(), ranks_before);
        worst = cand_.front().logit;
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) cand_.push_back({work_[i], static_cast<int32_t>(i)});
    std::nth_element(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k) - 1, cand_.end(),
                     ranks_before);
    cand_.resize(k);
  }
  std::sort(cand_.begin(), cand_.end(), ranks_before);
}

// The smallest prefix with cumulative probability >= top_p (at least one token). Sorted in
// growing chunks (nth_element + sort of the chunk), so a cut that comes early never pays for a
// full sort.
size_t Sampler::top_p_prefix(size_t size, bool sorted, double z, float max_l) {
  const auto first = cand_.begin();
  const double target = static_cast<double>(p_.top_p);
  double cum = 0.0;
  size_t done = 0, keep = size;
  size_t chunk = sorted ? size : std::min<size_t>(size, 256);
  while (done < size) {
    const auto lo = first + static_cast<std::ptrdiff_t>(done);
    const auto hi = first + static_cast<std::ptrdiff_t>(chunk);
    if (!sorted) {
      if (chunk < size)
        std::nth_element(lo, hi - 1, first + static_cast<std::ptrdiff_t>(size), ranks_before);
      std::sort(lo, hi, ranks_before);
    }
    for (size_t i = done; i < chunk; ++i) {
      cum += static_cast<double>(std::exp(cand_[i].logit - max_l)) / z;
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    if (keep < size) break;
    done = chunk;
    chunk = std::min(size, chunk * 4);
  }
  return keep;
}

int32_t Sampler::distribution(const float* logits, int32_t n_vocab) {
  KVS_CHECK(n_vocab > 0, "sampler: n_vocab must be > 0, got ", n_vocab);
  KVS_CHECK(logits != nullptr, "sampler: no logits");
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kMax = std::numeric_limits<float>::max();
  const auto n = static_cast<size_t>(n_vocab);

  // NaN -> -inf, +inf -> the largest float (keeps the softmax finite).
  work_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float l = logits[i];
    l = l != l ? -kInf : l;
    work_[i] = l > kMax ? kMax : l;
  }
  apply_penalty(n_vocab);
  const size_t best = first_max(work_.data(), n);
  KVS_CHECK(best < n, "sampler: no finite logit");
  const float max_l = work_[best];
  if (p_.temp <= 0.0f) {
    last_candidates_ = 1;
    n_cand_ = 0;
    return static_cast<int32_t>(best);
  }

  cand_.clear();        // keeps its capacity: no allocation once it has grown
  bool sorted = false;  // cand_ in rank order; otherwise in id order
  const size_t k = p_.top_k > 0 ? std::min(n, static_cast<size_t>(p_.top_k)) : n;
  if (k < n) {
    keep_top_k(k);
    sorted = true;
  }

  // top-p and min-p both keep a prefix of the top-k survivors in rank order, measured on their
  // temperature-1 softmax; so the result is the shorter prefix, whatever the order of the two.
  // Normaliser of that softmax, over all top-k survivors (before min-p removes any); float exp
  // (the cheaper one), double sums.
  double z = 0.0;
  if (p_.top_p < 1.0f) {
    if (sorted) {
      for (const Cand& c : cand_) z += static_cast<double>(std::exp(c.logit - max_l));
    } else {
      for (size_t i = 0; i < n; ++i) z += static_cast<double>(std::exp(work_[i] - max_l));
    }
  }

  // min-p first: one pass (or a prefix scan when sorted), and it shrinks what top-p sorts.
  // Tokens at -inf (masked) never count as candidates.
  const double thresh = p_.min_p > 0.0f
                            ? static_cast<double>(max_l) + std::log(static_cast<double>(p_.min_p))
                            : static_cast<double>(-kMax);
  if (sorted) {
    size_t j = 0;
    while (j < cand_.size() && static_cast<double>(cand_[j].logit) >= thresh) ++j;
    cand_.resize(j);
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<double>(work_[i]) >= thresh) {
        cand_.push_back({work_[i], static_cast<int32_t>(i)});
      }
    }
  }
  size_t size = cand_.size();
  if (p_.top_p < 1.0f && size > 1) size = top_p_prefix(size, sorted, z, max_l);

  // Temperature on the survivors, softmax. The draws walk the candidates' order (rank order or
  // id order), both independent of the standard library.
  const double inv_t = 1.0 / static_cast<double>(p_.temp);
  total_ = 0.0;
  for (size_t i = 0; i < size; ++i) {
    const double w = std::exp(static_cast<double>(cand_[i].logit - max_l) * inv_t);
    cand_[i].logit = static_cast<float>(w);
    total_ += static_cast<double>(cand_[i].logit);
  }
  last_candidates_ = static_cast<int32_t>(size);
  n_cand_ = size;
  return -1;
}

std::vector<std::pair<int32_t, float>> Sampler::last_distribution(size_t n) const {
  std::vector<std::pair<int32_t, float>> out;
  for (size_t i = 0; i < n_cand_; ++i)
    if (cand_[i].logit > 0.0f)
      out.emplace_back(cand_[i].id, static_cast<float>(static_cast<double>(cand_[i].logit) / total_));
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (out.size() > n) out.resize(n);
  return out;
}

int32_t Sampler::draw(double total) {
  const double r = uniform() * total;
  double acc = 0.0;
  for (size_t i = 0; i < n_cand_; ++i) {
    acc += static_cast<double>(cand_[i].logit);
    if (r < acc) return cand_[i].id;
  }
  return cand_[n_cand_ - 1].id;
}

int32_t Sampler::pick(const float* logits, int32_t n_vocab) {
  const bool penalty = p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0 && !history_.empty();
  if (p_.temp > 0.0f || penalty || n_vocab <= 0 || logits == nullptr)
    return distribution(logits, n_vocab);
  // Greedy without penalties needs no sanitised copy: the first largest logit, +inf included.
  const size_t best = first_max(logits, static_cast<size_t>(n_vocab));
  KVS_CHECK(best < static_cast<size_t>(n_vocab), "sampler: no finite logit");
  last_candidates_ = 1;
  n_cand_ = 0;
  return static_cast<int32_t>(best);
}

const float* Sampler::constrain(const float* logits, int32_t n_vocab) {
  if (!matcher_ || n_vocab <= 0 || logits == nullptr) return logits;
  const grammar::Vocab& v = *p_.grammar->vocab;
  const bool penalty = p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0 && !history_.empty();
  if (p_.temp <= 0.0f && !penalty) {
    const size_t best = first_max(logits, static_cast<size_t>(n_vocab));
    if (best < static_cast<size_t>(n_vocab) && matcher_->allows(v, static_cast<int32_t>(best)))
      return logits;
  }
  masked_.assign(logits, logits + n_vocab);
  matcher_->mask(v, masked_.data(), n_vocab);
  return masked_.data();
}

int32_t Sampler::follow(int32_t token) {
  if (matcher_) matcher_->accept(*p_.grammar->vocab, token);
  return token;
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
  int32_t token = pick(constrain(logits, n_vocab), n_vocab);
  if (token < 0) token = draw(total_);
  accept(token);
  return follow(token);
}

int32_t Sampler::draft(const float* logits, int32_t n_vocab, double p_min, float* q) {
  int32_t token = distribution(logits, n_vocab);
  if (token >= 0) {
    const float max_l = work_[static_cast<size_t>(token)];
    double z = 0.0;
    for (float l : work_) z += static_cast<double>(std::exp(l - max_l));
    if (1.0 / z < p_min) return -1;
  } else {
    double top = 0.0;
    for (size_t i = 0; i < n_cand_; ++i) top = std::max(top, static_cast<double>(cand_[i].logit));
    if (top / total_ < p_min) return -1;
    token = draw(total_);
    if (q) {
      std::fill(q, q + n_vocab, 0.0f);
      for (size_t i = 0; i < n_cand_; ++i)
        q[cand_[i].id] = static_cast<float>(static_cast<double>(cand_[i].logit) / total_);
    }
  }
  accept(token);
  return token;
}

int32_t Sampler::verify(const float* logits, int32_t n_vocab, int32_t draft, const float* q,
                        bool* accepted) {
  return follow(verify_token(constrain(logits, n_vocab), n_vocab, draft, q, accepted));
}

int32_t Sampler::verify_token(const float* logits, int32_t n_vocab, int32_t draft, const float* q,
                              bool* accepted) {
  int32_t token = pick(logits, n_vocab);
  if (token >= 0) {
    *accepted = token == draft;
    accept(token);
    return token;
  }
  double px = 0.0;  // p(draft)
  for (size_t i = 0; i < n_cand_; ++i)
    if (cand_[i].id == draft) px = static_cast<double>(cand_[i].logit) / total_;
  const double qx = q ? static_cast<double>(q[draft]) : 1.0;
  *accepted = qx > 0.0 && uniform() * qx < px;
  if (*accepted) {
    accept(draft);
    return draft;
  }
  // Rejected: the residual max(0, p - q), renormalised, so that the token's law is p's.
  double residual = 0.0;
  for (size_t i = 0; i < n_cand_; ++i) {
    const int32_t id = cand_[i].id;
    const double qi = q ? static_cast<double>(q[id]) : id == draft ? 1.0 : 0.0;
    const double r = std::max(0.0, static_cast<double>(cand_[i].logit) / total_ - qi);
    cand_[i].logit = static_cast<float>(r);
    residual += static_cast<double>(cand_[i].logit);
  }
  KVS_CHECK(residual > 0.0, "sampler: a rejected draft left no residual");
  token = draw(residual);
  accept(token);
  return token;
}

}  // namespace kvs
