// The server's engine loop: one thread owns the Engine; HTTP handler threads submit jobs and
// read their tokens from the job's channel. Between steps, waiting jobs take free sequences;
// each step carries one token of every decoding sequence and, in what is left of -b, chunks of
// the prompts being read, so a long prompt never stalls the others by more than a step of -b.
// With speculation a decoding sequence's token comes with the drafts its drafter proposes (each
// slot's engine sequence, by its id, a sequence of the Speculator's: the MTP drafter follows the
// engine's steps by it), all verified in that step; the rejected ones are rolled back.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvs/chat/chat_parse.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/generate.h"
#include "kvs/engine/sampler.h"
#include "kvs/engine/speculation.h"
#include "kvs/tokenizer/tokenizer.h"

namespace kvs::cli {

// What a request asks of a generation, checked by the HTTP side.
struct GenRequest {
  std::vector<int32_t> prompt;
  SamplerParams sampling;
  int64_t max_tokens = -1;  // -1: until the context is full
  std::vector<std::string> stop;
  float presence_penalty = 0, frequency_penalty = 0;
  int32_t top_logprobs = -1;  // -1: no log-probabilities; 0..20: the chosen token's and N best
  bool ignore_eos = false;     // end-of-generation tokens do not end it (llama-server's name)
  ChatParseOptions chat;       // how a chat answer becomes a message (reasoning, tool calls)
  bool return_progress = false;  // llama-server's: an event after each prompt chunk
  bool timings_per_token = false;  // llama-server's: streamed chunks carry the timings so far
  bool post_sampling_probs = false;  // top_logprobs as probabilities after the sampler's chain
  // The prompt's pages go into the prompt cache as soon as it is read (not when the answer
  // ends), for the other choices of an n > 1 request to reuse.
  bool share_prompt = false;
  int32_t id_slot = -1;        // the slot that must run it (llama-server's id_slot); -1: any
  // llama-server's context shift: at the context's end the generation goes on with n_discard
  // tokens after the first n_keep dropped (0: half of those after n_keep; n_keep -1: the
  // prompt's), the rest read again at their new positions; without it the generation ends.
  bool context_shift = false;
  int32_t n_keep = 0, n_discard = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to a token's logit (-inf: never)
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  bool post_sampling = false;  // logprob and top hold probabilities after the sampler's chain
};

// One message of the scheduler to a job's reader: text, or the end.
struct Event {
  std::string text;  // complete UTF-8 characters, stop strings held back until decided
  std::vector<int32_t> tokens;  // the tokens sampled since the last event (text may lag them)
  std::optional<TokenLogprob> logprob;
  bool done = false;
  std::string finish_reason;  // with done: "stop" or "length"
  std::string stop_type;      // with done: llama-server's "eos", "word" or "limit"
  std::string stopping_word;  // with done: the stop string that ended it
  bool truncated = false;     // with done: the context ran full (shifted, or ended there)
  int32_t slot = -1;          // the slot that ran it
  std::string error;          // with done: not empty when the generation failed
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose pages came from the prompt cache
  double prompt_s = 0, decode_s = 0;
  int64_t drafted = 0, accepted = 0;  // speculative decoding's draft tokens
  // With done: the sequence's KV at the end (positions, and pages as SlotInfo counts them).
  int32_t n_past = 0;
  int64_t pages_resident = 0, pages_streamed = 0;
  // With return_progress, before the answer: the prompt's tokens read so far (the cached ones
  // included), as llama-server's prompt_progress. Its and every token's event also carry the
  // counts and times above (prompt_tokens: those read), for timings_per_token.
  struct Progress {
    int64_t total = 0, cache = 0, processed = 0;
    double ms = 0;
  };
  std::optional<Progress> progress;
};

// A request in flight, shared by its handler thread and the scheduler.
class Job {
 public:
  explicit Job(GenRequest r) : request(std::move(r)) {}
  const GenRequest request;
  // Set by the handler when its client is gone; the scheduler frees the sequence next step.
  std::atomic<bool> cancelled{false};
  // Set by the scheduler once the prompt is read (or the job has ended).
  std::atomic<bool> prompt_read{false};

  void push(Event e);
  // Moves the pending events into `out`, waiting up to `timeout_s` for one.
  void pop(std::vector<Event>& out, double timeout_s);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

struct SlotInfo {
  const char* state = "idle";  // idle, prefill, decode
  int64_t id_task = -1;        // the admission number of its request (-1: idle)
  int32_t n_past = 0;          // positions in the KV
  int64_t prompt_tokens = 0, generated = 0;
  // Pages of the full layers (all of them summed): resident in the arena, streamed through the
  // ring; host in --kv-mode host.
  int64_t pages_resident = 0, pages_streamed = 0;
};

struct SchedulerStats {
  int64_t admitted = 0, rejected = 0, finished = 0, cancelled = 0, failed = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0, steps = 0;
  int64_t drafted = 0, accepted = 0;  // speculative decoding's draft tokens
  double busy_s = 0;                  // time spent in steps
  double decode_tokens_per_s = 0;     // generated tokens over the step time of the last 10 s
  size_t bytes_streamed = 0, bytes_written_back = 0;
  std::optional<PromptCacheStats> prompt_cache;  // without a prompt cache: none
  double copy_busy_s = 0;
  int32_t slots_busy = 0, queued = 0;
  std::vector<SlotInfo> slots;
};

class Scheduler {
 public:
  // spec: the drafters of serve --spec, for eng's sequences (null: off).
  Scheduler(Engine& eng, const Tokenizer& tok, int32_t max_queue, bool verbose,
            Speculator* spec = nullptr);
  ~Scheduler();  // stops the loop; jobs still running end with an error event
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the job; false when every sequence is busy and the queue is full.
  bool submit(const std::shared_ptr<Job>& job);
  SchedulerStats stats() const;
  int32_t n_slots() const { return static_cast<int32_t>(slots_.size()); }

  // Runs fn on the engine's thread between steps and returns when it has run (its exceptions
  // rethrown here): fn gets the engine and the tokens that slot `slot` last held in its KV,
  // which it may change (slot actions); fails while the slot is busy.
  void with_slot(int32_t slot, const std::function<void(Engine&, std::vector<int32_t>&)>& fn);

 private:
  struct Generation;
  struct Slot {
    Sequence seq;
    std::shared_ptr<Job> job;  // null: free
    std::unique_ptr<Generation> gen;
    int64_t admitted = 0;  // admission order: earlier prompts get their chunks first
    int32_t fed = 0;       // prompt tokens in the KV
    int32_t cached = 0;    // of which the prompt cache gave
    Decoding dec;          // dec.next: -1 while reading the prompt
    std::vector<int32_t> held;  // the tokens in its KV (prompt, then generated)
    // After a context shift: the tokens it reads again (fed counts them), then the generation
    // goes on; empty otherwise.
    std::vector<int32_t> reread;
    bool shift_due = false;  // the context is full and the request shifts it
    bool truncated = false;  // the context ran full
    std::vector<int32_t> last;  // those of its last request, once released (slot actions)
  };
  struct Call {
    int32_t slot;
    const std::function<void(Engine&, std::vector<int32_t>&)>* fn;
    std::promise<void> done;
  };
  // Why a generation ends with a token: finish()'s arguments; reason null: it goes on.
  struct End {
    const char* reason = nullptr;
    bool flush = true;
    const char* stop_type = "none";  // llama-server's: eos, word (a stop string), limit
    std::string word;                // the stop string
  };

  void loop();
  // With return_progress: the slot's prompt read so far, as an event.
  void progress(Slot& s);
  void admit(std::unique_lock<std::mutex>& lock);
  // Runs the queued with_slot() calls (mu_ held on entry and exit).
  void run_calls(std::unique_lock<std::mutex>& lock);
  void release(Slot& s);
  // Shows the prompt cache's warnings (its disk tier's refused files, failed writes) on stderr.
  void warn_cache();
  int32_t index(const Slot& s) const { return static_cast<int32_t>(&s - slots_.data()); }
  // After the step of s (batch entry `entry`): its next tokens (Decoder::advance), each sent.
  // Returns the tokens sent.
  int64_t advance(Slot& s, int32_t entry);
  // Sends `id`, chosen from `logits` with `n_past` positions before it, and counts it.
  End deliver(Slot& s, int32_t id, const float* logits, int32_t n_past, bool accepted);
  // Sends the end (flush: with the text held back, unless a stop string ended it) and frees s.
  void finish(Slot& s, const End& end);
  // The context shift of s (shift_due): its KV cut to the kept tokens, whose tail and the
  // pending token it reads again next. False when nothing can be dropped.
  bool shift(Slot& s);
  // The tokens s reads: its prompt, or after a shift those it reads again.
  const std::vector<int32_t>& reading(const Slot& s) const {
    return s.reread.empty() ? s.job->request.prompt : s.reread;
  }
  void fail(Slot& s, const char* what);
  void publish(const StepStats* step, int64_t decoded);
  // The pages of s's full layers in the arena and streamed through the ring, into info.
  void count_pages(const Slot& s, SlotInfo& info) const;
  // A busy slot as /slots shows it, into info.
  void describe(const Slot& s, SlotInfo& info) const;

  Engine& eng_;
  const Tokenizer& tok_;
  const int32_t max_queue_;
  const bool verbose_;
  Decoder decoder_;
  std::vector<Slot> slots_;
  std::vector<Decoding*> decoding_;  // scratch: the slots' decodings of a step
  std::vector<Slot*> reading_;  // scratch: the slots reading their prompts, in admission order

  mutable std::mutex mu_;  // guards queue_, stop_, stats_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::deque<Call*> calls_;
  bool stop_ = false;
  SchedulerStats stats_;
  std::deque<std::pair<double, std::pair<int64_t, double>>> recent_;  // step end: tokens, s
  std::thread thread_;
};

}  // namespace kvs::cli
