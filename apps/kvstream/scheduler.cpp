#include "scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <unordered_map>

#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs::cli {

void Job::push(Event e) {
  if (e.done) prompt_read = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

void Job::pop(std::vector<Event>& out, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
}

namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

Event ended(std::string error) {
  Event e;
  e.done = true;
  e.error = std::move(error);
  return e;
}

// Log-probabilities of the model's distribution (temperature 1, before any penalty): the
// chosen token's and the n best.
TokenLogprob logprob_of(const float* logits, int32_t n_vocab, int32_t id, int32_t n) {
  float mx = -INFINITY;
  for (int32_t i = 0; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double z = 0;
  for (int32_t i = 0; i < n_vocab; ++i) z += std::exp(static_cast<double>(logits[i] - mx));
  const float lz = mx + static_cast<float>(std::log(z));
  TokenLogprob t;
  t.id = id;
  t.logprob = logits[id] - lz;
  if (n > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) ids[static_cast<size_t>(i)] = i;
    const auto k = std::min<ptrdiff_t>(n, n_vocab);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (ptrdiff_t i = 0; i < k; ++i)
      t.top.emplace_back(ids[static_cast<size_t>(i)], logits[ids[static_cast<size_t>(i)]] - lz);
  }
  return t;
}

}  // namespace

// A request's generation state: its sampler, the text decoder with the stop strings, the
// counts the penalties need, its clock.
struct Scheduler::Generation {
  Generation(const Tokenizer& tok, const GenRequest& r) : sampler(r.sampling), dec(tok) {
    for (int32_t id : r.prompt) sampler.accept(id);
  }

  // `logits` with OpenAI's penalties applied (each token sampled so far, by whether and how
  // often it was) and the request's logit_bias.
  const float* penalised(const GenRequest& r, const float* logits, int32_t n_vocab) {
    const bool penalty = (r.presence_penalty != 0 || r.frequency_penalty != 0) && !counts.empty();
    if (!penalty && r.logit_bias.empty()) return logits;
    work.assign(logits, logits + n_vocab);
    if (penalty)
      for (const auto& [id, c] : counts)
        work[static_cast<size_t>(id)] -=
            r.presence_penalty + r.frequency_penalty * static_cast<float>(c);
    for (const auto& [id, b] : r.logit_bias)
      if (id >= 0 && id < n_vocab) work[static_cast<size_t>(id)] += b;
    return work.data();
  }

  // The text `id` releases; `stopped` when a stop string completed (the text before it kept,
  // the string in `word`).
  std::string text(int32_t id, const std::vector<std::string>& stops, bool& stopped,
                   std::string& word) {
    held += dec.push(id);
    size_t at = std::string::npos;
    for (const std::string& s : stops)
      if (const size_t f = held.find(s); f < at) at = f, word = s;
    if (at != std::string::npos) {
      stopped = true;
      std::string out = held.substr(0, at);
      held.clear();
      return out;
    }
    // Hold back the longest tail that could still begin a stop string.
    size_t keep = 0;
    for (const std::string& s : stops)
      for (size_t n = std::min(s.size() - 1, held.size()); n > keep; --n)
        if (held.compare(held.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
    std::string out = held.substr(0, held.size() - keep);
    held.erase(0, held.size() - keep);
    return out;
  }
  std::string flush() {
    std::string out = held + dec.flush();
    held.clear();
    return out;
  }

  Sampler sampler;
  StreamDecoder dec;
  std::string held;
  std::unordered_map<int32_t, int32_t> counts;  // generated tokens, for the penalties
  std::vector<float> work;
  int64_t generated = 0;
  double t_admit = now(), t_first = 0;
};

Scheduler::Scheduler(Engine& eng, const Tokenizer& tok, int32_t max_queue, bool verbose,
                     Speculator* spec)
    : eng_(eng),
      tok_(tok),
      max_queue_(max_queue),
      verbose_(verbose),
      decoder_(eng, tok.n_vocab(), spec) {
  slots_.resize(static_cast<size_t>(eng.options().n_seq));
  stats_.slots.resize(slots_.size());
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& j : queue_) j->push(ended("the server is shutting down"));
  for (Slot& s : slots_)
    if (s.job) s.job->push(ended("the server is shutting down"));
}

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t room = static_cast<int64_t>(slots_.size()) - stats_.slots_busy + max_queue_;
    if (stop_ || static_cast<int64_t>(queue_.size()) >= room) {
      ++stats_.rejected;
      return false;
    }
    queue_.push_back(job);
    stats_.queued = static_cast<int32_t>(queue_.size());
  }
  cv_.notify_one();
  return true;
}

void Scheduler::warn_cache() {
  for (const std::string& w : eng_.prompt_cache_warnings())
    std::fprintf(stderr, "kvstream: %s\n", w.c_str());
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Scheduler::admit(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    std::erase_if(queue_, [&](const std::shared_ptr<Job>& j) {
      if (!j->cancelled) return false;
      ++stats_.cancelled;
      return true;
    });
    run_calls(lock);
    for (Slot& s : slots_) {
      if (s.job || queue_.empty()) continue;
      // The first request that may run here: any slot's, or one pinned to this one (id_slot).
      const auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& j) {
        return j->request.id_slot < 0 || j->request.id_slot == index(s);
      });
      if (it == queue_.end()) continue;
      s.job = std::move(*it);
      queue_.erase(it);
      s.admitted = stats_.admitted;
      ++stats_.admitted;
      stats_.prompt_tokens += static_cast<int64_t>(s.job->request.prompt.size());
      ++stats_.slots_busy;  // counted before the unlock, which submit() reads
      stats_.queued = static_cast<int32_t>(queue_.size());
      // The engine is this thread's alone: the copies of cached pages do not hold up the
      // HTTP threads' submissions and statistics.
      lock.unlock();
      s.seq = eng_.open_sequence();
      s.gen = std::make_unique<Generation>(tok_, s.job->request);
      const auto& prompt = s.job->request.prompt;
      s.dec = Decoding{&s.seq, &s.gen->sampler};
      decoder_.start(s.dec, prompt.data(), static_cast<int32_t>(prompt.size()));
      s.fed = s.cached =
          eng_.reuse_prefix(s.seq, prompt.data(), static_cast<int32_t>(prompt.size()));
      s.held = prompt;
      warn_cache();
      progress(s);
      lock.lock();
    }
    int32_t busy = 0;
    for (const Slot& s : slots_) busy += s.job ? 1 : 0;
    stats_.slots_busy = busy;
    if (const PromptCacheStats* c = eng_.prompt_cache_stats()) stats_.prompt_cache = *c;
    stats_.queued = static_cast<int32_t>(queue_.size());
    if (busy > 0 || stop_) return;
    cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !calls_.empty(); });
  }
}

void Scheduler::with_slot(int32_t slot,
                          const std::function<void(Engine&, std::vector<int32_t>&)>& fn) {
  KVS_CHECK(slot >= 0 && slot < n_slots(), "slot ", slot, " does not exist (0 to ", n_slots() - 1,
            ")");
  Call c{slot, &fn, {}};
  auto done = c.done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVS_CHECK(!stop_, "the server is shutting down");
    calls_.push_back(&c);
  }
  cv_.notify_one();
  done.get();
}

void Scheduler::run_calls(std::unique_lock<std::mutex>& lock) {
  while (!calls_.empty()) {
    Call* c = calls_.front();
    calls_.pop_front();
    Slot& s = slots_[static_cast<size_t>(c->slot)];
    lock.unlock();
    try {
      KVS_CHECK(!s.job, "slot ", c->slot, " is busy with a request; retry when it is idle");
      (*c->fn)(eng_, s.last);
      c->done.set_value();
    } catch (...) {
      c->done.set_exception(std::current_exception());
    }
    warn_cache();
    lock.lock();
  }
}

// Frees s and says so in the published slots at once: its client hears of the end after this,
// so the client's next look at /slots or /metrics sees the slot free.
void Scheduler::release(Slot& s) {
  s.held.resize(std::min(s.held.size(), static_cast<size_t>(s.seq.n_past)));
  s.last = std::move(s.held);
  s.held.clear();
  s.reread.clear();
  s.shift_due = s.truncated = false;
  eng_.close_sequence(s.seq);
  warn_cache();
  s.job.reset();
  s.gen.reset();
  int32_t busy = 0;
  for (const Slot& x : slots_) busy += x.job != nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.slots[static_cast<size_t>(&s - slots_.data())] = SlotInfo{};
  stats_.slots_busy = busy;
  if (const PromptCacheStats* c = eng_.prompt_cache_stats()) stats_.prompt_cache = *c;
}

void Scheduler::finish(Slot& s, const End& end) {
  Generation& g = *s.gen;
  Event e;
  if (end.flush) e.text = g.flush();
  e.done = true;
  e.finish_reason = end.reason;
  e.stop_type = end.stop_type;
  e.stopping_word = end.word;
  e.truncated = s.truncated;
  e.slot = index(s);
  e.prompt_tokens = static_cast<int64_t>(s.job->request.prompt.size());
  e.completion_tokens = g.generated;
  e.cached_tokens = s.cached;
  e.prompt_s = g.t_first - g.t_admit;
  e.decode_s = now() - g.t_first;
  e.drafted = s.dec.drafted;
  e.accepted = s.dec.accepted;
  SlotInfo kv;
  count_pages(s, kv);
  e.n_past = s.seq.n_past;
  e.pages_resident = kv.pages_resident;
  e.pages_streamed = kv.pages_streamed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.finished;
  }
  const std::shared_ptr<Job> job = s.job;
  release(s);
  job->push(std::move(e));
}

void Scheduler::progress(Slot& s) {
  if (!s.job->request.return_progress) return;
  Event e;
  Event::Progress p;
  p.total = static_cast<int64_t>(s.job->request.prompt.size());
  p.cache = s.cached;
  p.processed = s.fed;
  if (s.fed > s.cached) p.ms = (now() - s.gen->t_admit) * 1e3;
  e.prompt_tokens = p.processed;
  e.cached_tokens = p.cache;
  e.prompt_s = p.ms / 1e3;
  e.progress = p;
  s.job->push(std::move(e));
}

void Scheduler::fail(Slot& s, const char* what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failed;
  }
  const std::shared_ptr<Job> job = s.job;
  release(s);
  job->push(ended(what));
}

int64_t Scheduler::advance(Slot& s, int32_t entry) {
  Generation& g = *s.gen;
  const GenRequest& r = s.job->request;
  if (g.generated == 0) g.t_first = now();
  if (s.dec.next < 0) s.reread.clear();  // read again whole after a shift, if it was
  // A prompt's last chunk has no drafts.
  if (const int64_t n_draft = std::max<int64_t>(0, std::ssize(s.dec.feed) - 1); n_draft > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.drafted += n_draft;
  }
  End end;
  const int32_t n = decoder_.advance(
      s.dec, entry,
      [&](int32_t id, const float* row, int32_t n_past, bool ok) {
        end = deliver(s, id, row, n_past, ok);
        return end.reason == nullptr;
      },
      [&](const float* row) { return g.penalised(r, row, tok_.n_vocab()); });
  if (!end.reason && s.shift_due && !shift(s)) end = {"length", true, "limit", ""};
  if (end.reason) finish(s, end);
  return n;
}

bool Scheduler::shift(Slot& s) {
  s.shift_due = false;
  const GenRequest& r = s.job->request;
  const int32_t n_ctx = eng_.options().n_ctx, n_past = s.seq.n_past, next = s.dec.next;
  // llama-server's arithmetic: n_keep counts from after the BOS; the rest halved by default.
  int32_t keep = r.n_keep < 0 ? static_cast<int32_t>(r.prompt.size())
                              : r.n_keep + (tok_.add_bos() ? 1 : 0);
  keep = std::clamp(keep, 0, std::max(0, n_ctx - 4));
  const int32_t left = n_past - keep;
  const int32_t discard = std::clamp(r.n_discard > 0 ? r.n_discard : left / 2, 0,
                                     std::max(0, left - 1));
  if (discard == 0 || next < 0) return false;
  std::vector<int32_t> kept(s.held.begin(), s.held.begin() + keep);
  kept.insert(kept.end(), s.held.begin() + keep + discard, s.held.begin() + n_past);
  // The kept tail is read again at its new positions, so the KV is what reading the kept
  // tokens as a prompt gives, bit for bit (no rotation of cached keys). Full layers keep the
  // first n_keep positions; window and recurrent ones cannot go back that far and start over,
  // from the prompt cache where it holds the prefix.
  const KvShape& shape = eng_.kv_shape();
  int32_t reused = keep;
  if (shape.n_window == 0 && shape.n_recurrent == 0) {
    eng_.truncate(s.seq, keep);
  } else {
    eng_.close_sequence(s.seq);
    s.seq = eng_.open_sequence();
    reused = eng_.reuse_prefix(s.seq, kept.data(), static_cast<int32_t>(kept.size()));
    warn_cache();
  }
  if (verbose_)
    std::fprintf(stderr,
                 "kvstream: slot %d: context shift: %d tokens kept, %d dropped after them, %d "
                 "read again\n",
                 index(s), keep, discard, static_cast<int32_t>(kept.size()) - reused + 1);
  s.reread.assign(kept.begin() + reused, kept.end());
  s.reread.push_back(next);
  s.fed = 0;
  kept.push_back(next);
  decoder_.start(s.dec, kept.data(), static_cast<int32_t>(kept.size()));
  s.held = std::move(kept);
  return true;
}

Scheduler::End Scheduler::deliver(Slot& s, int32_t id, const float* logits, int32_t n_past,
                                  bool accepted) {
  Generation& g = *s.gen;
  const GenRequest& r = s.job->request;
  ++g.counts[id];
  ++g.generated;
  s.held.push_back(id);
  {  // counted, and the slot shown decoding, before the client can see the token
    SlotInfo info;
    describe(s, info);
    info.state = "decode";
    info.n_past = n_past;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.completion_tokens;
    stats_.accepted += accepted;
    stats_.slots[static_cast<size_t>(&s - slots_.data())] = info;
  }
  if (!r.ignore_eos && tok_.is_eog(id))
    return {"stop", true, "eos", ""};  // not text, no log-probability
  Event e;
  e.tokens.push_back(id);
  if (r.top_logprobs >= 0 && r.post_sampling_probs) {
    TokenLogprob t;
    t.id = id;
    t.post_sampling = true;
    t.top = g.sampler.last_distribution(static_cast<size_t>(r.top_logprobs));
    t.logprob = t.top.empty() ? 1.0f : 0.0f;  // greedy: the token was certain
    for (const auto& [tid, p] : g.sampler.last_distribution(SIZE_MAX))
      if (tid == id) t.logprob = p;
    if (t.top.empty()) t.top.emplace_back(id, 1.0f);
    e.logprob = std::move(t);
  } else if (r.top_logprobs >= 0) {
    e.logprob = logprob_of(logits, tok_.n_vocab(), id, r.top_logprobs);
  }
  bool stopped = false;
  std::string word;
  e.text = g.text(id, r.stop, stopped, word);
  e.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  e.completion_tokens = g.generated;
  e.cached_tokens = s.cached;
  e.prompt_s = g.t_first - g.t_admit;
  e.decode_s = now() - g.t_first;
  s.job->push(std::move(e));
  if (stopped) return {"stop", false, "word", word};
  if (r.max_tokens >= 0 && g.generated >= r.max_tokens) return {"length", true, "limit", ""};
  if (n_past >= eng_.options().n_ctx) {
    s.truncated = true;
    if (!r.context_shift) return {"length", true, "limit", ""};
    s.shift_due = true;
  }
  return {};
}

void Scheduler::count_pages(const Slot& s, SlotInfo& info) const {
  const int32_t P = eng_.options().page_size;
  const Plan& plan = eng_.plan();
  const bool host = eng_.options().kv_mode == KvMode::Host;
  // Completed pages beyond a layer's resident cap stream; the page being written is resident.
  const int32_t done = s.seq.n_past / P, tail = s.seq.n_past % P ? 1 : 0;
  for (int32_t l = 0; l < eng_.kv_shape().n_full; ++l) {
    const int32_t cap = host || plan.resident.size() <= static_cast<size_t>(s.seq.id)
                            ? (host ? 0 : done)
                            : resident_cap(plan, static_cast<size_t>(s.seq.id), l);
    const int32_t res = std::min(done, cap);
    info.pages_resident += res + (host ? 0 : tail);
    info.pages_streamed += done - res + (host ? tail : 0);
  }
}

void Scheduler::describe(const Slot& s, SlotInfo& info) const {
  info.state = s.dec.next < 0 ? "prefill" : "decode";
  info.id_task = s.admitted;
  info.n_past = s.seq.n_past;
  info.prompt_tokens = static_cast<int64_t>(s.job->request.prompt.size());
  info.generated = s.gen->generated;
  count_pages(s, info);
}

void Scheduler::publish(const StepStats* step, int64_t decoded) {
  const double t = now();
  std::lock_guard<std::mutex> lock(mu_);
  if (step) {
    ++stats_.steps;
    stats_.busy_s += step->seconds;
    recent_.push_back({t, {decoded, step->seconds}});
  }
  while (!recent_.empty() && recent_.front().first < t - 10) recent_.pop_front();
  int64_t n = 0;
  double sec = 0;
  for (const auto& [at, v] : recent_) n += v.first, sec += v.second;
  stats_.decode_tokens_per_s = sec > 0 ? static_cast<double>(n) / sec : 0.0;
  const EngineStats& tot = eng_.totals();
  stats_.bytes_streamed = tot.bytes_in;
  stats_.bytes_written_back = tot.bytes_out;
  stats_.copy_busy_s = tot.copy_busy_s;
  if (const PromptCacheStats* c = eng_.prompt_cache_stats()) stats_.prompt_cache = *c;
  int32_t busy = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    SlotInfo& info = stats_.slots[i];
    info = SlotInfo{};
    if (!s.job) continue;
    ++busy;
    describe(s, info);
  }
  stats_.slots_busy = busy;
}

void Scheduler::loop() {
  const int32_t n_batch = eng_.options().n_batch;
  std::vector<BatchEntry> batch;
  std::vector<Slot*> who;
  std::vector<bool> samples;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      admit(lock);
      if (stop_) return;
    }
    for (Slot& s : slots_)
      if (s.job && s.job->cancelled) {
        {  // counted before the slot shows idle, which a client may be waiting for
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.cancelled;
        }
        release(s);
      }
    // One token of every decoding sequence, then prompt chunks in what is left of -b, the
    // sequences admitted first served first.
    batch.clear();
    who.clear();
    samples.clear();
    decoding_.clear();
    for (Slot& s : slots_)
      if (s.job && s.dec.next >= 0) {
        // No draft whose row could only give a token past max_tokens.
        const int64_t max_tokens = s.job->request.max_tokens;
        s.dec.max_drafts = max_tokens >= 0 ? max_tokens - s.gen->generated - 1
                                           : std::numeric_limits<int64_t>::max();
        decoding_.push_back(&s.dec);
        who.push_back(&s);
        samples.push_back(true);
      }
    decoder_.add_steps(decoding_, batch);
    int32_t budget = n_batch;
    for (const BatchEntry& e : batch) budget -= e.n;
    reading_.clear();
    for (Slot& s : slots_)
      if (s.job && s.dec.next < 0) reading_.push_back(&s);
    std::sort(reading_.begin(), reading_.end(),
              [](const Slot* x, const Slot* y) { return x->admitted < y->admitted; });
    for (Slot* sp : reading_) {
      if (budget == 0) break;
      Slot& s = *sp;
      const auto& prompt = reading(s);
      const int32_t left = static_cast<int32_t>(prompt.size()) - s.fed;
      // With recurrent checkpoints the last token goes alone (Engine::keeps_checkpoints).
      const int32_t m = std::min(budget, eng_.keeps_checkpoints() && left > 1 ? left - 1 : left);
      batch.push_back({&s.seq, prompt.data() + s.fed, m});
      who.push_back(&s);
      samples.push_back(m == left);
      s.fed += m;
      budget -= m;
    }
    if (batch.empty()) {
      publish(nullptr, 0);
      continue;
    }
    try {
      eng_.step(batch);
    } catch (const std::exception& ex) {
      // The engine's state after a failed step is unknown: every sequence in it ends.
      std::fprintf(stderr, "kvstream: serve: step failed: %s\n", ex.what());
      for (Slot* s : who) fail(*s, ex.what());
      publish(nullptr, 0);
      continue;
    }
    const StepStats step = eng_.last_step();
    for (size_t i = 0; i < who.size(); ++i)
      if (Slot& s = *who[i]; s.dec.next < 0 && s.reread.empty()) {
        progress(s);
        if (s.fed == static_cast<int32_t>(s.job->request.prompt.size())) {
          if (s.job->request.share_prompt) eng_.publish(s.seq);
          s.job->prompt_read = true;
        }
      }
    // The recurrent checkpoints inside prompts and before their last tokens.
    for (size_t i = 0; i < who.size(); ++i)
      if (Slot& s = *who[i];
          s.dec.next < 0 && s.reread.empty() && checkpoint_due(s.fed - batch[i].n, s.fed,
                                           static_cast<int32_t>(s.job->request.prompt.size()),
                                           eng_.options().ctx_checkpoints))
        eng_.checkpoint(s.seq);
    int64_t decoded = 0;
    for (size_t i = 0; i < who.size(); ++i) {
      if (!samples[i]) continue;
      try {
        decoded += advance(*who[i], static_cast<int32_t>(i));
      } catch (const std::exception& ex) {
        fail(*who[i], ex.what());
      }
    }
    if (verbose_)
      std::fprintf(stderr,
                   "kvstream: step: %d tokens of %d sequences, %.2f ms, streamed %s, %lld "
                   "generated\n",
                   step.n_tokens, step.n_seqs, step.seconds * 1e3,
                   format_bytes(step.bytes_in).c_str(), static_cast<long long>(decoded));
    publish(&step, decoded);
  }
}

}  // namespace kvs::cli
