// The prompt cache on CUDA (tests/prompt_cache_cases.h): a resumed sequence's logits are a cold
// run's bits when its steps stay within kCudaInvariantTokens (larger steps' products depend on
// the chunk, on both sides).
#include <gtest/gtest.h>

#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/util/error.h"
#include "prompt_cache_cases.h"

namespace kvs {
namespace {

using namespace test;

MakeDevice cuda() {
  return [] { return make_cuda_device(0, CudaOptions{}); };
}

bool have_gpu() {
  try {
    make_cuda_device(0, CudaOptions{});
    return true;
  } catch (const Error&) {
    return false;
  }
}

#define NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";

constexpr int32_t kSteps = kCudaInvariantTokens;

TEST(CudaPromptCacheExact, CachedPrefixesGiveTheColdLogits) {
  NEED_GPU();
  cached_prefixes_give_the_cold_logits(cuda(), {"tiny", "tiny-qwen3", "tiny:q4_0"}, 20261231, 16,
                                       10, 3, kSteps);
}

TEST(CudaPromptCacheExact, WindowLayersGiveTheColdLogits) {
  NEED_GPU();
  cached_prefixes_give_the_cold_logits(cuda(), {"tiny-gemma3"}, 20261207, 12, 6, 2, kSteps);
}

TEST(CudaPromptCacheExact, RecurrentLayersGiveTheColdLogits) {
  NEED_GPU();
  cached_prefixes_give_the_cold_logits(cuda(), {"tiny-qwen35", "tiny-qwen35:q4_0"}, 20261208, 12,
                                       6, 2, kSteps);
}

TEST(CudaPromptCacheExact, RecurrentCheckpointsWhereTheyAreTaken) {
  NEED_GPU();
  recurrent_checkpoints_where_they_are_taken(cuda(), kSteps);
}

TEST(CudaPromptCacheExact, SequencesShareACachedPrefixAtOnce) {
  NEED_GPU();
  sequences_share_a_cached_prefix_at_once(cuda(), kSteps / 2);
}

}  // namespace
}  // namespace kvs
