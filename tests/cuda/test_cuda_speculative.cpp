// The verify step on CUDA (skipped without a GPU): a step of a token and its drafts gives every
// row the bits of the one-token steps, resident, streamed, in host mode and across rollbacks;
// steps of up to kCudaInvariantTokens tokens compute each token as a step of it alone does.
#include <gtest/gtest.h>

#include "kvs/backend/cuda/backend.h"
#include "speculative_cases.h"

namespace kvs::test {
namespace {

TEST(CudaSpeculative, VerifiedRowsAreBitIdenticalToOneTokenSteps) {
  std::unique_ptr<Device> dev;
  try {
    dev = make_cuda_device(0, CudaOptions{});
  } catch (const Error&) {
    GTEST_SKIP() << "no CUDA device";
  }
  const VerifyTotals t = verify_cases(*dev, 12, kCudaInvariantTokens);
  EXPECT_GT(t.accepted, 100);
  EXPECT_GT(t.rejected, 50);
  EXPECT_GT(t.page_rollbacks, 5);
  EXPECT_GE(t.streamed, 2);
}

}  // namespace
}  // namespace kvs::test
