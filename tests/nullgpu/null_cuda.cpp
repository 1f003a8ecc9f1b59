// A null GPU for the CUDA backend's host side (tests/nullgpu/launches.sh) and for measuring the
// host's share of a step (scripts/host-overhead.sh): a library that,
// preloaded (LD_PRELOAD) into a CUDA build of kvstream, answers every CUDA runtime and cuBLAS
// call the binary makes without a GPU. Memory is host memory (reserved, not committed, until
// written), copies are real, kernels, graphs, events and GEMMs do nothing. So everything the
// host does for a step (the engine's bookkeeping, the recording of the step, its key and
// staged inputs, the graph's relaunch) runs as it would on the GPU machine, and its time is
// what `kvstream bench` reports as host_issue_s_per_token; what the GPU would do takes no time.
// Figures from it are host-side only, and the logits are garbage. KVS_NULL_GPU_REPORT=FILE
// writes at exit, as JSON, how many kernels, graph captures, instantiations, updates and
// launches the process made (tests/nullgpu checks that decode steps relaunch one graph).
// KVS_NULL_GPU picks the card it claims to be: h200 (the default), rtx4080 (sm_89, 16 GiB),
// rtx3090 (sm_86, 24 GiB) or rtx5070ti (sm_120, 16 GiB, the card of the streaming prototype);
// like a real one it refuses a kernel more dynamic shared memory than the card gives a block,
// or more than 48 KiB not first allowed by cudaFuncSetAttribute, so the host's choices for
// consumer cards are checked too.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace {

std::mutex mu;
std::unordered_map<void*, size_t>& maps() {
  static std::unordered_map<void*, size_t> m;
  return m;
}

// Anonymous memory reserved without commitment: a 100 GiB arena costs only what is written.
cudaError_t map(void** p, size_t n) {
  n = n == 0 ? 1 : n;
  void* a =
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (a == MAP_FAILED) return cudaErrorMemoryAllocation;
  const std::lock_guard<std::mutex> l(mu);
  maps()[a] = n;
  *p = a;
  return cudaSuccess;
}
cudaError_t unmap(void* p) {
  if (!p) return cudaSuccess;
  const std::lock_guard<std::mutex> l(mu);
  auto it = maps().find(p);
  if (it == maps().end()) return cudaErrorInvalidValue;
  munmap(it->first, it->second);
  maps().erase(it);
  return cudaSuccess;
}

// Distinct handles for streams, events, graphs.
template <class T>
T handle() {
  static std::mutex m;
  static uintptr_t next = 0x1000;
  const std::lock_guard<std::mutex> l(m);
  next += 16;
  return reinterpret_cast<T>(next);
}

struct Card {
  const char* name;
  int major, minor, sms;
  size_t memory;
  int smem_optin, smem_sm;  // KiB: a block's opt-in maximum, an SM's
};
const Card& card() {
  static const Card cards[] = {{"h200", 9, 0, 132, size_t{144} << 30, 227, 228},
                               {"rtx4080", 8, 9, 76, size_t{16} << 30, 99, 100},
                               {"rtx3090", 8, 6, 82, size_t{24} << 30, 99, 100},
                               {"rtx5070ti", 12, 0, 70, size_t{16} << 30, 99, 100}};
  static const Card c = [] {
    const char* e = std::getenv("KVS_NULL_GPU");
    for (const Card& k : cards)
      if (!e || std::strcmp(e, k.name) == 0) return k;
    std::fprintf(stderr, "KVS_NULL_GPU=%s: h200, rtx4080, rtx3090 or rtx5070ti\n", e);
    std::abort();
  }();
  return c;
}
bool capturing = false;

// What the process launched, for KVS_NULL_GPU_REPORT.
struct Counts {
  std::atomic<long> kernels{0}, captures{0}, instantiations{0}, updates{0}, graph_launches{0};
  ~Counts() {
    const char* f = std::getenv("KVS_NULL_GPU_REPORT");
    if (!f) return;
    if (FILE* o = std::fopen(f, "w")) {
      std::fprintf(o,
                   "{\"kernels\": %ld, \"captures\": %ld, \"instantiations\": %ld, "
                   "\"updates\": %ld, \"graph_launches\": %ld}\n",
                   kernels.load(), captures.load(), instantiations.load(), updates.load(),
                   graph_launches.load());
      std::fclose(o);
    }
  }
} counts;
std::unordered_map<const void*, int>& allowed() {  // kernel -> dynamic shared memory allowed
  static std::unordered_map<const void*, int> m;
  return m;
}

}  // namespace

// Calls that only answer success.
#define OK(decl)        \
  cudaError_t decl {    \
    return cudaSuccess; \
  }
#define OK_BLAS(decl)             \
  cublasStatus_t decl {           \
    return CUBLAS_STATUS_SUCCESS; \
  }

extern "C" {

void** __cudaRegisterFatBinary(void*) {
  static void* h = nullptr;
  return &h;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {}
cudaError_t __cudaGetKernel(cudaKernel_t* k, const void* f) {
  *k = reinterpret_cast<cudaKernel_t>(const_cast<void*>(f));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t) {
  ++counts.kernels;
  return cudaSuccess;
}
OK(__cudaPopCallConfiguration(dim3*, dim3*, size_t*, void*))

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
OK(cudaSetDevice(int))
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof(*p));
  const Card& c = card();
  std::snprintf(p->name, sizeof(p->name), "null GPU as %s (tests/nullgpu/null_cuda.cpp)", c.name);
  p->major = c.major, p->minor = c.minor, p->multiProcessorCount = c.sms, p->warpSize = 32;
  p->totalGlobalMem = c.memory, p->l2CacheSize = 48 << 20, p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = static_cast<size_t>(c.smem_optin) << 10;
  p->sharedMemPerMultiprocessor = static_cast<size_t>(c.smem_sm) << 10, p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536, p->maxThreadsPerBlock = 1024;
  p->maxThreadsPerMultiProcessor = c.major == 9 ? 2048 : 1536, p->maxBlocksPerMultiProcessor = 32;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total) {
  *total = card().memory, *free_b = *total - (size_t{1} << 30);
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaErrorInvalidValue           ? "invalid argument (null GPU)"
         : e == cudaErrorInvalidConfiguration ? "invalid configuration argument (null GPU)"
         : e == cudaErrorMemoryAllocation     ? "out of memory (null GPU)"
                                              : "an error of the null GPU";
}
OK(cudaGetLastError())
OK(cudaDeviceSynchronize())
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (v < 0 || v > card().smem_optin << 10) return cudaErrorInvalidValue;
  const std::lock_guard<std::mutex> l(mu);
  allowed()[f] = v;
  return cudaSuccess;
}
// Without the kernel's registers: at most 3 blocks (what the kernels' launch bounds ask), fewer
// where the card's threads or shared memory (1 KiB of it reserved a block) hold fewer.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int threads,
                                                                   size_t smem, unsigned) {
  const Card& c = card();
  const int by_threads = (c.major == 9 ? 2048 : 1536) / (threads > 0 ? threads : 1);  // per SM
  const int by_smem = static_cast<int>((static_cast<size_t>(c.smem_sm) << 10) / (smem + 1024));
  *n = std::max(1, std::min({3, by_threads, by_smem}));
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t n) {
  return map(p, n);
}
cudaError_t cudaMallocManaged(void** p, size_t n, unsigned) {
  return map(p, n);
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
  return map(p, n);
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  return unmap(p);
}
cudaError_t cudaFreeHost(void* p) {
  return unmap(p);
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
// Not written: a memset would commit the pages of every buffer it clears, and no kernel reads.
OK(cudaMemsetAsync(void*, int, size_t, cudaStream_t))

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = handle<cudaStream_t>();
  return cudaSuccess;
}
OK(cudaStreamDestroy(cudaStream_t))
OK(cudaStreamSynchronize(cudaStream_t))
OK(cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned))
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  ++counts.captures;
  capturing = true;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
  capturing = false;
  *g = handle<cudaGraph_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* s) {
  *s = capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t, unsigned long long) {
  ++counts.instantiations;
  *e = handle<cudaGraphExec_t>();
  return cudaSuccess;
}
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t, cudaGraph_t, cudaGraphExecUpdateResultInfo*) {
  ++counts.updates;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) {
  ++counts.graph_launches;
  return cudaSuccess;
}
OK(cudaGraphDestroy(cudaGraph_t))
OK(cudaGraphExecDestroy(cudaGraphExec_t))

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  return cudaEventCreate(e);
}
OK(cudaEventDestroy(cudaEvent_t))
OK(cudaEventRecord(cudaEvent_t, cudaStream_t))
OK(cudaEventQuery(cudaEvent_t))
OK(cudaEventSynchronize(cudaEvent_t))
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* c, const void* f, void**) {
  const dim3 b = c->blockDim;
  if (b.x * b.y * b.z > 1024 || c->gridDim.x == 0 || c->gridDim.y == 0 || c->gridDim.z == 0)
    return cudaErrorInvalidConfiguration;
  if (c->dynamicSmemBytes > 48 << 10) {
    const std::lock_guard<std::mutex> l(mu);
    const auto it = allowed().find(f);
    if (it == allowed().end() || c->dynamicSmemBytes > static_cast<size_t>(it->second))
      return cudaErrorInvalidValue;
  }
  ++counts.kernels;
  return cudaSuccess;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = handle<cublasHandle_t>();
  return CUBLAS_STATUS_SUCCESS;
}
OK_BLAS(cublasDestroy_v2(cublasHandle_t))
OK_BLAS(cublasSetStream_v2(cublasHandle_t, cudaStream_t))
OK_BLAS(cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                     const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                     const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t))

}  // extern "C"
