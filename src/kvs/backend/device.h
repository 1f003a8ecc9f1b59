// The Device: memory, streams and kernels of one backend. The engine allocates everything it
// computes with through it and calls its kernels; the CPU implementation is a simulated device
// with a bounded memory region, the CUDA one (backend/cuda/, its own options and sizes in
// cuda/backend.h) the real thing.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvs/model/config.h"
#include "kvs/model/weights.h"
#include "kvs/quant/kv_page.h"

namespace kvs {

class Device;

// Owning handle to device memory; freed by the device that made it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* dev, void* p, size_t n) : dev_(dev), p_(p), n_(n) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset();
  template <class T = uint8_t>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }

 private:
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  size_t n_ = 0;
};

struct RopeParams {
  RopeMode mode = RopeMode::Norm;
  int32_t head_dim = 0, rope_dim = 0;
  float base = 10000.0f, linear_scale = 1.0f;
  const float* freq_factors = nullptr;  // [rope_dim / 2] or nullptr
};

// Attention of n_tok queries of one sequence over its cached spans (causal by position), in
// one or several calls: each call folds its spans, which continue the previous call's in
// logical order, into a running state (`acc` and the unnormalised `out`). `first` starts it,
// `last` normalises `out`. Streaming calls once per ring chunk as it lands; a resident run calls
// once. The fold is the same sequence of operations either way, so the logits are identical.
struct AttentionArgs {
  const float* q = nullptr;      // [n_tok][n_head * head_dim]
  float* out = nullptr;          // [n_tok][n_head * head_dim]
  float* acc = nullptr;          // [n_tok][n_head][2]: running max and sum
  const int32_t* pos = nullptr;  // [n_tok] logical position of each query
  int32_t n_tok = 0;
  const Span* spans = nullptr;  // ordered by logical start
  int32_t n_spans = 0;
  KvLayout kv;
  int32_t n_head = 0;
  float scale = 1.0f;
  int32_t window = 0;  // > 0: a query at p sees keys p - window + 1 .. p only (sliding window)
  bool first = true, last = true;
};

// Qwen3's RMSNorm of every q and k head before the rope: weights of head_dim each.
struct QkNorm {
  const float* q = nullptr;
  const float* k = nullptr;
  float eps = 0.0f;
};

// One product of a group that shares its input rows: y = W x (+ bias), or y += W x with `add`
// (the residual). A backend may run the jobs of a group as one kernel.
struct MatJob {
  const Matrix* w = nullptr;
  float* y = nullptr;  // [n_tok][w->n_out]
  const float* bias = nullptr;
  bool add = false;
};

// A Gated DeltaNet layer (qwen35) for n_tok tokens of one sequence, from its projections to the
// gated norm's output, which ssm_out then takes. Per token: the causal conv of `conv` taps over
// [conv_state; qkv] and silu give q, k (k_heads of `head`, L2-normalized, q scaled by
// 1/sqrt(head)) and v (v_heads of `head`; value head h reads key head h % k_heads); beta =
// sigmoid(beta), g = softplus(alpha + dt_bias) * a; then per value head with its state M
// [head (v) x head (k)]: M *= exp(g); M += beta (v - M k) k^T; o = M q; y = rmsnorm(o, norm) *
// silu(z). chunk > 1 computes chunks of that many tokens at once (the same sums regrouped,
// equal within rounding): prefill; chunk <= 1 goes token by token: decode.
struct DeltaNetArgs {
  const float* qkv = nullptr;      // [n_tok][2 k_heads head + v_heads head]: attn_qkv x
  const float* z = nullptr;        // [n_tok][v_heads * head]: attn_gate x
  const float* alpha = nullptr;    // [n_tok][v_heads]: ssm_alpha x
  const float* beta = nullptr;     // [n_tok][v_heads]: ssm_beta x, before the sigmoid
  float* y = nullptr;              // [n_tok][v_heads * head]
  float* conv_state = nullptr;     // [conv - 1][conv_dim]: the rows before the first token; updated
  float* state = nullptr;          // [v_heads][head][head]: M of each value head; updated
  const float* conv_w = nullptr;   // [conv_dim][conv]: tap j of channel c at c * conv + j
  const float* dt_bias = nullptr;  // [v_heads]
  const float* a = nullptr;        // [v_heads]: -exp(A_log)
  const float* norm = nullptr;     // [head]
  int32_t n_tok = 0, conv = 0, k_heads = 0, v_heads = 0, head = 0;
  float eps = 0.0f;  // of the L2 norms (a floor on the norm) and of the rmsnorm
  int32_t chunk = 0;
  int32_t conv_dim() const { return (2 * k_heads + v_heads) * head; }
};

// Streams: the compute stream runs the kernels; two copy streams move pages host-to-device
// (the ring) and device-to-host (write-back) concurrently with it.
enum class Stream : int { Compute = 0, CopyIn = 1, CopyOut = 2 };
constexpr int kStreams = 3;

// A fence is made once and re-armed by every record(); waits refer to its latest record.
using FenceId = int32_t;
// A flag is a counter that host threads raise and streams wait for: the CPU's side of split
// attention tells the device that a layer's partials are in host memory.
using FlagId = int32_t;

// A backend in two parts: what a device is (memory, streams, fences, flags, step capture) and
// the operations it computes. A new backend implements both lists; the engine asks caps(),
// never the backend's name, what it may do.
class Device {
 public:
  // What a backend's operations can do beyond the common list, fixed when it is made.
  struct Caps {
    // gated_delta_net and sigmoid_mul run here (qwen35): the engine refuses such a model before
    // allocating anything otherwise.
    bool gated_delta_net = false;
    // Tokens a prefill's delta rule takes at once (DeltaNetArgs::chunk; decode goes token by
    // token).
    int32_t delta_net_chunk = 64;
    // Steps of up to this many tokens (all sequences' together) are batch-invariant: each
    // token's bits are those of a step of it alone.
    int32_t invariant_tokens = INT32_MAX;
    // Its attention's span partials are the CPU kernels' (cpu/host_attention.h) bit for bit:
    // split attention then hands it the CPU's row of each span, folded as its own would be, and
    // a split run gives resident's bits. Elsewhere one merged row crosses the bus.
    bool cpu_partials = false;
  };

  explicit Device(const Caps& caps) : caps_(caps) {}
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  virtual std::string name() const = 0;
  const Caps& caps() const { return caps_; }

  // ---- What a device is: memory, streams, fences ----

  // Device memory, bounded by capacity(); fails naming `what` and the sizes when full.
  virtual DeviceBuffer alloc(size_t bytes, const char* what) = 0;
  virtual void free(void* p) = 0;  // called by DeviceBuffer
  virtual size_t capacity() const = 0;
  virtual size_t used() const = 0;
  // Pinned host memory (the host store), not counted against capacity(); freed by free().
  virtual DeviceBuffer alloc_host(size_t bytes, const char* what) = 0;
  // Memory the driver pages between host and device on demand (CUDA managed memory, the
  // `unified` baseline), not counted against capacity(); fails where the backend has none.
  virtual DeviceBuffer alloc_managed(size_t bytes, const char* what);
  // Makes the limit real (on): takes all device memory beyond what capacity() still leaves
  // free, so managed memory competes for only that much (the `unified` baseline under
  // --vram-limit); off gives it back.
  virtual void set_balloon(bool /*on*/) {}
  virtual void upload(void* dst, const void* src, size_t n) = 0;    // host -> device
  virtual void download(void* dst, const void* src, size_t n) = 0;  // device -> host
  // Weights as the kernels read them (the CPU reads the mapped file in place).
  virtual Weights place_weights(const Weights& host) = 0;
  // Allocates now the scratch the kernels would otherwise grow on demand, for passes of up to
  // n_tok tokens (n_out_tok rows through the output matrix) over up to max_spans spans, so
  // that the KV arena can take what is left without starving them later.
  virtual void reserve(const Weights& /*w*/, int64_t /*n_tok*/, int64_t /*n_out_tok*/,
                       int64_t /*max_spans*/, int32_t /*n_head*/, int32_t /*head_dim*/) {}
  // The phase arena: the scratch that only passes of more rows than reserve() was given need
  // (on CUDA the f16 copies of whole matrices and activations for cuBLAS, and of a quantized
  // cache), for passes of up to n_tok tokens over up to max_spans spans of layout kv, kept in
  // device memory the caller lends for such passes instead of the device's own. Sets the
  // geometry the next lend_prefill_scratch() carves (engines sharing a device call it before
  // each lend) and returns its bytes (0: none).
  virtual size_t prefill_scratch(const Weights& /*w*/, int64_t /*n_tok*/, int64_t /*max_spans*/,
                                 const KvLayout& /*kv*/) {
    return 0;
  }
  // Lends `p` (prefill_scratch() bytes, 256-byte aligned) for the passes to come; nullptr takes
  // it back once the work queued on it is done. Lending what is lent already costs nothing.
  virtual void lend_prefill_scratch(uint8_t* /*p*/) {}

  // Asynchronous work. copy() on a stream is ordered with everything else on that stream.
  virtual void copy(Stream s, void* dst, const void* src, size_t n) = 0;
  virtual FenceId make_fence() = 0;
  virtual void record(Stream s, FenceId f) = 0;  // f opens when s reaches this point
  virtual void wait(Stream s, FenceId f) = 0;    // later work on s waits for f's last record
  virtual void wait_host(FenceId f) = 0;         // the calling thread waits for it
  virtual bool done(FenceId f) = 0;              // whether its last record has been reached
  virtual double busy_seconds(Stream s) = 0;     // time a copy stream has spent copying
  // Time the compute stream has spent waiting on fences (the ring's ready fences: stalls),
  // measured where the waiting happens (on the GPU for CUDA).
  virtual double wait_seconds() = 0;
  virtual void sync() = 0;  // waits for all queued work on all streams
  // --h2d-limit: later copies on the CopyIn stream average at most this many bytes a second
  // (a simulated slower link; backend/pacer.h); fails where the backend cannot.
  virtual void limit_copy_in(double bytes_per_s);

  // Flags (split attention; the other modes do not use them; fail where the backend has
  // none): raise() from any host thread sets the counter to `value`, never lower; later work on
  // s waits until it is at least `value`.
  virtual FlagId make_flag();
  virtual void raise(FlagId f, uint64_t value);
  virtual void wait_flag(Stream s, FlagId f, uint64_t value);
  // Time the compute stream has spent waiting on flags (for the CPU's partials), apart from
  // wait_seconds().
  virtual double flag_wait_seconds() { return 0; }

  // A step whose work is all on the compute stream, with no host waits inside, may be recorded
  // between these calls and run as one unit (a CUDA graph); end_step(false) drops it after an
  // error. The CPU runs each operation as it is called.
  virtual void begin_step() {}
  virtual void end_step(bool /*run*/) {}

  // ---- The operations, on the compute stream. Activations are f32 rows in device memory ----

  virtual void embed(const Matrix& emb, const int32_t* ids, int32_t n, float* x) = 0;
  // y[r] = x[r] / rms(x[r]) * w, rows of n.
  virtual void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n,
                       float eps) = 0;
  // For each job: y[t][n_out] (+)= W x[t][n_in] (+ bias), t < n_tok; every W has n_in columns.
  virtual void matmuls(const float* x, int64_t n_tok, const MatJob* jobs, int n_jobs) = 0;
  void matmul(const Matrix& w, const float* x, float* y, int64_t n_tok, const float* bias) {
    const MatJob j{&w, y, bias, false};
    matmuls(x, n_tok, &j, 1);
  }
  // Rotates q (n_head heads a token) and k (n_head_kv heads; may be null with 0) in place.
  virtual void rope(float* q, float* k, const int32_t* pos, int32_t n_tok, int32_t n_head,
                    int32_t n_head_kv, const RopeParams& p) = 0;
  virtual void swiglu(float* gate, const float* up, int64_t n) = 0;  // gate = silu(gate) * up
  // gate = gelu(gate) * up, gelu's tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  virtual void geglu(float* gate, const float* up, int64_t n) = 0;
  virtual void scale(float* x, float s, int64_t n) = 0;       // x *= s
  virtual void add(float* x, const float* y, int64_t n) = 0;  // x += y
  // Writes K and V rows of n_tok tokens into their page frames at the given slots.
  virtual void kv_write(const KvLayout& l, const float* k, const float* v, int32_t n_tok,
                        uint8_t* const* pages, const int32_t* slots) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  // With norm, rmsnorm of every q and k head in place first; rope(q, k, ...) and then
  // kv_write(l, k, v, ...) of the rotated rows (l.n_head_kv kv heads): one pass where a backend
  // fuses them.
  virtual void rope_kv_write(float* q, float* k, const float* v, const int32_t* pos, int32_t n_tok,
                             int32_t n_head, const RopeParams& p, const KvLayout& l,
                             uint8_t* const* pages, const int32_t* slots,
                             const QkNorm* norm = nullptr) {
    if (norm) {
      rmsnorm(q, norm->q, q, int64_t{n_tok} * n_head, p.head_dim, norm->eps);
      rmsnorm(k, norm->k, k, int64_t{n_tok} * l.n_head_kv, p.head_dim, norm->eps);
    }
    rope(q, k, pos, n_tok, n_head, l.n_head_kv, p);
    kv_write(l, k, v, n_tok, pages, slots);
  }
  // Folds a.n_spans spans' partials computed elsewhere (split attention: by the CPU), in
  // pinned host memory (alloc_host), into the running state of a's one token, as attention()
  // folds those it computes (a.spans are not read): rows of head_dim + 4 floats [max, sum,
  // non-empty (1 or 0), 0, unnormalised output], span s's head h at row s * n_head + h. Fails
  // where the backend has no flags.
  virtual void fold(const AttentionArgs& a, const float* parts);
  // A Gated DeltaNet layer's recurrent part (DeltaNetArgs), and x *= sigmoid(gate) (qwen35's
  // gated attention output); fail unless caps().gated_delta_net.
  virtual void gated_delta_net(const DeltaNetArgs& a);
  virtual void sigmoid_mul(float* x, const float* gate, int64_t n);

 private:
  const Caps caps_;
};

// The CPU backend; capacity 0 means unbounded.
std::unique_ptr<Device> make_cpu_device(size_t capacity);
// The scratch an engine has a device set aside (Engine::scratch_args): reserve()'s for passes
// of n_tok rows (n_out_tok through the output matrix) over max_spans spans, and
// prefill_scratch()'s for passes of n_batch rows (0: no phase arena).
struct ScratchArgs {
  int64_t n_tok = 0, n_out_tok = 0, max_spans = 0, n_batch = 0;
  int32_t n_head = 0, head_dim = 0;
  KvLayout kv;
};

}  // namespace kvs
