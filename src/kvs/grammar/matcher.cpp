#include "kvs/grammar/matcher.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>

#include "kvs/tokenizer/tokenizer.h"

namespace kvs::grammar {

namespace {

constexpr size_t kCompactAt = size_t{1} << 20;  // interned stacks kept before a clean-up

}  // namespace

Vocab::Vocab(std::vector<std::string> p, std::vector<uint8_t> e)
    : pieces(std::move(p)), eog(std::move(e)) {
  eog.resize(pieces.size(), 0);
  for (size_t i = 0; i < pieces.size(); ++i)
    if (!pieces[i].empty() && !eog[i]) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces[static_cast<size_t>(a)] < pieces[static_cast<size_t>(b)];
  });
  lcp.assign(order.size(), 0);
  for (size_t i = 1; i < order.size(); ++i) {
    const std::string& a = pieces[static_cast<size_t>(order[i - 1])];
    const std::string& b = pieces[static_cast<size_t>(order[i])];
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    lcp[i] = static_cast<uint32_t>(k);
  }
}

std::shared_ptr<const Vocab> Vocab::of(const Tokenizer& tok) {
  // Weak entries: a vocab lives while some request uses it and is rebuilt after (tens of ms).
  static std::mutex mu;
  static std::map<const Tokenizer*, std::weak_ptr<const Vocab>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto v = cache[&tok].lock(); v && v->pieces.size() == static_cast<size_t>(tok.n_vocab()))
    return v;
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
  std::vector<uint8_t> eog(pieces.size());
  for (int32_t i = 0; i < tok.n_vocab(); ++i) {
    pieces[static_cast<size_t>(i)] = tok.token_to_piece(i, false);
    eog[static_cast<size_t>(i)] = tok.is_eog(i);
  }
  auto v = std::make_shared<const Vocab>(std::move(pieces), std::move(eog));
  cache[&tok] = v;
  return v;
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  KVS_CHECK(g_ != nullptr, "grammar: no grammar");
  reset();
}

void Matcher::reset() {
  if (nodes_.size() > kCompactAt) {
    nodes_.clear();
    ids_.clear();
    expanded_.clear();
    initial_.clear();
  }
  if (initial_.empty()) {
    for (uint32_t a : g_->alts[g_->root])
      expand(g_->code[a].op == Grammar::kEnd ? kDone : intern(a, kDone), initial_);
    std::sort(initial_.begin(), initial_.end());
    initial_.erase(std::unique(initial_.begin(), initial_.end()), initial_.end());
  }
  stacks_ = initial_;
  partial_ = {};
}

int32_t Matcher::intern(uint32_t pos, int32_t parent) {
  const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent + 1);
  const auto [it, added] = ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

void Matcher::expand(int32_t s, std::vector<int32_t>& out) {
  if (const auto it = expanded_.find(s); it != expanded_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> res;
  todo_.assign(1, s);
  seen_.clear();
  while (!todo_.empty()) {
    const int32_t t = todo_.back();
    todo_.pop_back();
    // Seen before: two derivations reach the same stack (an ambiguous or cyclic grammar).
    if (std::find(seen_.begin(), seen_.end(), t) != seen_.end()) continue;
    seen_.push_back(t);
    if (t == kDone) {
      res.push_back(t);
      continue;
    }
    const Node n = nodes_[static_cast<size_t>(t)];
    const Grammar::Elem e = g_->code[n.pos];
    if (e.op == Grammar::kChars) {
      res.push_back(t);
      continue;
    }
    // A rule reference: its continuation (dropped where the alternative ends there, so right
    // recursion does not grow the stack) under each of the rule's alternatives.
    const int32_t rest =
        g_->code[n.pos + 1].op == Grammar::kEnd ? n.parent : intern(n.pos + 1, n.parent);
    for (uint32_t a : g_->alts[e.arg])
      todo_.push_back(g_->code[a].op == Grammar::kEnd ? rest : intern(a, rest));
  }
  std::sort(res.begin(), res.end());
  out.insert(out.end(), res.begin(), res.end());
  expanded_.emplace(s, std::move(res));
}

void Matcher::step(const std::vector<int32_t>& in, uint32_t c, std::vector<int32_t>& out) {
  out.clear();
  for (int32_t s : in) {
    if (s == kDone) continue;
    const Node n = nodes_[static_cast<size_t>(s)];
    if (!g_->sets[g_->code[n.pos].arg].contains(c)) continue;
    const uint32_t next = n.pos + 1;
    expand(g_->code[next].op == Grammar::kEnd ? n.parent : intern(next, n.parent), out);
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

bool Matcher::partial_ok(const std::vector<int32_t>& stacks, const Utf8& u) const {
  if (u.remain <= 0) return u.remain == 0;
  if (u.remain == 1 && u.value < 2) return false;  // an overlong 2-byte form of ASCII
  uint32_t lo = u.value << (6 * u.remain);
  const uint32_t hi = lo | ((1u << (6 * u.remain)) - 1);
  if (lo == 0) lo = u.remain == 2 ? 0x800 : u.remain == 3 ? 0x10000 : lo;  // shortest forms
  for (int32_t s : stacks)
    if (s != kDone && g_->sets[g_->code[nodes_[static_cast<size_t>(s)].pos].arg].intersects(lo, hi))
      return true;
  return false;
}

bool Matcher::feed(const Level& from, unsigned char b, Level& to) {
  Utf8 u = from.partial;
  if (u.remain > 0) {
    if ((b & 0xC0) != 0x80) return false;
    u.value = (u.value << 6) | (b & 0x3Fu);
    --u.remain;
  } else if (b < 0x80) {
    u.value = b;
  } else {
    const int n = (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    if (n < 0) return false;
    u.value = b & (0x3Fu >> n);
    u.remain = n;
  }
  to.partial = u;
  if (u.remain > 0) {  // mid-character: the stacks wait, and die early where nothing fits
    to.stacks = from.stacks;
    return partial_ok(to.stacks, u);
  }
  step(from.stacks, u.value, to.stacks);
  return !to.stacks.empty();
}

bool Matcher::ends_ok(const Level& l) const {
  return l.partial.remain == 0 ? !l.stacks.empty() : partial_ok(l.stacks, l.partial);
}

bool Matcher::walk(std::string_view bytes) {
  if (lv_.size() < bytes.size() + 1) lv_.resize(bytes.size() + 1);
  lv_[0].stacks = stacks_;
  lv_[0].partial = partial_;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (!feed(lv_[i], static_cast<unsigned char>(bytes[i]), lv_[i + 1])) return false;
  return ends_ok(lv_[bytes.size()]);
}

bool Matcher::allows_text(std::string_view bytes) { return walk(bytes); }

bool Matcher::accept_text(std::string_view bytes) {
  if (!walk(bytes)) return false;
  stacks_ = lv_[bytes.size()].stacks;
  partial_ = lv_[bytes.size()].partial;
  if (nodes_.size() > kCompactAt) compact();
  return true;
}

bool Matcher::can_end() const {
  return partial_.remain == 0 && !stacks_.empty() && stacks_[0] == kDone;  // kDone sorts first
}

bool Matcher::allows(const Vocab& v, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= v.pieces.size()) return false;
  if (v.eog[static_cast<size_t>(id)]) return can_end();
  const std::string& p = v.pieces[static_cast<size_t>(id)];
  return !p.empty() && walk(p);
}

void Matcher::mask(const Vocab& v, float* logits, int32_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const auto nv = static_cast<size_t>(n);
  // Refuse all, then let through what the walk allows: tokens outside `order` stay refused.
  std::vector<uint8_t>& ok = ok_;
  ok.assign(nv, 0);
  const bool end = can_end();
  for (size_t i = 0; i < std::min(nv, v.eog.size()); ++i) ok[i] = v.eog[i] && end;
  if (!must_end()) {
    if (lv_.empty()) lv_.resize(1);
    lv_[0].stacks = stacks_;
    lv_[0].partial = partial_;
    size_t have = 0;           // lv_[0..have] hold the previous token's prefix
    size_t dead = SIZE_MAX;    // that prefix's length at which the grammar refused it
    for (size_t k = 0; k < v.order.size(); ++k) {
      const auto id = static_cast<size_t>(v.order[k]);
      const std::string& p = v.pieces[id];
      const size_t common = v.lcp[k];
      if (dead <= common) continue;  // shares a refused prefix
      dead = SIZE_MAX;
      size_t d = std::min(common, have);
      if (lv_.size() < p.size() + 1) lv_.resize(p.size() + 1);
      for (; d < p.size(); ++d)
        if (!feed(lv_[d], static_cast<unsigned char>(p[d]), lv_[d + 1])) {
          dead = d + 1;
          break;
        }
      have = d;
      if (dead == SIZE_MAX && id < nv && ends_ok(lv_[p.size()])) ok[id] = 1;
    }
  }
  for (size_t i = 0; i < nv; ++i)
    if (!ok[i]) logits[i] = kNegInf;
  if (nodes_.size() > kCompactAt) compact();
}

void Matcher::accept(const Vocab& v, int32_t id) {
  KVS_CHECK(id >= 0 && static_cast<size_t>(id) < v.pieces.size(), "grammar: token ", id,
            " is outside the vocabulary");
  if (v.eog[static_cast<size_t>(id)]) {
    KVS_CHECK(can_end(), "grammar: the text ends where the grammar cannot");
    return;
  }
  const std::string& p = v.pieces[static_cast<size_t>(id)];
  KVS_CHECK(!p.empty() && accept_text(p), "grammar: token ", id, " is not allowed here");
}

// Keeps only the stacks the state reaches: a long generation would otherwise hold every stack
// any mask ever tried.
void Matcher::compact() {
  std::vector<Node> old = std::move(nodes_);
  nodes_.clear();
  ids_.clear();
  expanded_.clear();
  std::unordered_map<int32_t, int32_t> moved;
  auto copy = [&](int32_t s, auto& self) -> int32_t {
    if (s == kDone) return kDone;
    if (const auto it = moved.find(s); it != moved.end()) return it->second;
    const Node n = old[static_cast<size_t>(s)];
    const int32_t t = intern(n.pos, self(n.parent, self));
    moved.emplace(s, t);
    return t;
  };
  for (int32_t& s : stacks_) s = copy(s, copy);
  for (int32_t& s : initial_) s = copy(s, copy);
  std::sort(stacks_.begin(), stacks_.end());
  std::sort(initial_.begin(), initial_.end());
}

}  // namespace kvs::grammar
