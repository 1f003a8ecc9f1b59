#include "kvs/engine/model_draft.h"

#include <algorithm>

#include "kvs/util/error.h"

namespace kvs {

void check_draft_vocab(const Model& target, const Model& draft) {
  const char* what = "-md/--model-draft: the draft model's vocabulary is not the target's";
  KVS_CHECK(draft.config.n_vocab == target.config.n_vocab, what, ": ", draft.config.n_vocab,
            " tokens against ", target.config.n_vocab, " (vocab size)");
  const Tokenizer* t = target.tokenizer.get();
  const Tokenizer* d = draft.tokenizer.get();
  KVS_CHECK((t == nullptr) == (d == nullptr), what, ": only ", t ? "the target" : "the draft model",
            " has a tokenizer");
  if (!t) return;
  KVS_CHECK(d->n_vocab() == t->n_vocab(), what, ": ", d->n_vocab(), " token texts against ",
            t->n_vocab(), " (vocab size)");
  for (int32_t id = 0; id < t->n_vocab(); ++id)
    KVS_CHECK(d->token_text(id) == t->token_text(id), what, ": token ", id, " is '",
              d->token_text(id), "' in the draft model, '", t->token_text(id),
              "' in the target (token texts)");
  KVS_CHECK(d->bos() == t->bos(), what, ": bos id ", d->bos(), " against ", t->bos(),
            " (special ids)");
  KVS_CHECK(d->eos() == t->eos(), what, ": eos id ", d->eos(), " against ", t->eos(),
            " (special ids)");
}

namespace {

EngineOptions draft_options(const ModelConfig& c, const EngineOptions& o, int32_t draft_max) {
  EngineOptions d;
  d.n_ctx = o.n_ctx;
  d.n_batch = o.n_batch;
  d.page_size = o.page_size;
  d.k_type = o.k_type;
  d.v_type = o.v_type;
  d.n_seq = o.n_seq;
  d.kv_mode = KvMode::Resident;
  d.phase_arena = false;
  // Full attention layers roll back anywhere; window layers keep the positions of the drafts
  // they may drop, recurrent layers the inputs of the steps since the one that read the
  // accepted tokens (at most 2, then draft_max - 1 drafts).
  d.n_verify = c.n_layers_of(LayerKind::Full) == c.n_layer ? 1 : draft_max + 1;
  return d;
}

// The draft engine, once the vocabularies match; its refusals name the draft model.
Engine draft_engine(const Model& draft, const Model& target, Device& dev, const EngineOptions& o) {
  check_draft_vocab(target, draft);
  try {
    return Engine(draft, dev, o);
  } catch (const Error& e) {
    fail("-md/--model-draft (", draft.config.name, "): ", e.what());
  }
}

// Sequence lengths as the engine counts them.
int32_t len(const std::vector<int32_t>& v) {
  return static_cast<int32_t>(v.size());
}

}  // namespace

ModelDrafter::ModelDrafter(const Model& draft, const Model& target, Device& dev,
                           const EngineOptions& o, int32_t draft_max, double p_min)
    : Drafter("draft model", draft.config.n_vocab, draft_max, p_min),
      cfg_(draft.config),
      device_bytes_(dev.used()),
      eng_(draft_engine(draft, target, dev, draft_options(draft.config, o, draft_max))),
      seqs_(static_cast<size_t>(o.n_seq)) {
  device_bytes_ = dev.used() - device_bytes_;
  for (Seq& s : seqs_) s.draft = eng_.open_sequence();
}

size_t ModelDrafter::planned_bytes(const ModelConfig& c, size_t weights, const EngineOptions& o,
                                   int32_t draft_max) {
  const EngineOptions d = draft_options(c, o, draft_max);
  const KvShape k = Engine::kv_shape(c, d);
  return weights + Engine::activation_bytes(c, d) + k.full_bytes + k.window_bytes +
         k.recurrent_bytes;
}

void ModelDrafter::sync(Seq& s) {
  // The last token is read again when the KV has it already: its logits start the drafts.
  const auto common =
      std::min(static_cast<int32_t>(
                   std::mismatch(s.kv.begin(), s.kv.end(), s.tokens.begin(), s.tokens.end()).first -
                   s.kv.begin()),
               len(s.tokens) - 1);
  if (common == len(s.kv)) return;
  if (common >= s.floor) {
    eng_.truncate(s.draft, common);
  } else {
    eng_.close_sequence(s.draft);
    s.draft = eng_.open_sequence();
    s.floor = 0;
  }
  s.kv.resize(std::min(s.kv.size(), static_cast<size_t>(s.draft.n_past)));
}

void ModelDrafter::propose(const std::vector<Ask>& asks) {
  const int32_t n_batch = eng_.options().n_batch;
  // Only full attention layers roll back to any position; window and recurrent layers undo
  // only the drafts of the last propose().
  const bool any_floor = cfg_.n_layers_of(LayerKind::Full) != cfg_.n_layer;
  const bool recurrent = cfg_.n_layers_of(LayerKind::Recurrent) > 0;
  // The step that reads each sequence's last unread tokens (at most 2: a draft the target
  // accepted last, and its own token after it), then one step a draft, each extending it.
  struct Live {
    const Ask* ask;
    Seq* seq;
  };
  std::vector<Live> live;
  batch_.clear();
  for (const Ask& a : asks) {
    if (!begin(a)) continue;
    Seq& s = seqs_.at(static_cast<size_t>(a.seq));
    if (s.tokens.empty()) continue;
    sync(s);
    int32_t unread = len(s.tokens) - len(s.kv);
    if (unread > 2) {  // a prompt, or a new message: read as a prefill, -b tokens at a time
      const int32_t n = std::min(unread - 2, n_batch);
      eng_.eval(s.draft, s.tokens.data() + s.kv.size(), n);
      s.kv.insert(s.kv.end(), s.tokens.begin() + len(s.kv), s.tokens.begin() + len(s.kv) + n);
      unread -= n;
      if (any_floor) s.floor = len(s.kv);
      if (unread > 2) continue;
    }
    batch_.push_back({&s.draft, s.tokens.data() + s.kv.size(), unread, recurrent});
    s.kv.insert(s.kv.end(), s.tokens.begin() + len(s.kv), s.tokens.end());
    if (any_floor) s.floor = len(s.kv);
    a.out->tokens.reserve(static_cast<size_t>(a.max));
    live.push_back({&a, &s});
  }
  while (!batch_.empty()) {
    eng_.step(batch_);
    batch_.clear();
    std::vector<Live> next;
    for (size_t i = 0; i < live.size(); ++i) {
      const auto [a, s] = live[i];
      if (!next_draft(*s, *a, eng_.logits(static_cast<int32_t>(i)))) continue;
      const int32_t& t = a->out->tokens.back();
      batch_.push_back({&s->draft, &t, 1, recurrent, recurrent});
      s->kv.push_back(t);
      next.push_back(live[i]);
    }
    live = std::move(next);
  }
}

}  // namespace kvs
