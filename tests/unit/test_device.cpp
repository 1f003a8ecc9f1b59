// The CPU device's streams and fences: ordering, cross-stream waits, and a ring of 1 or 2
// slots driven the way the stream schedule drives it (ready / consumed fences per slot).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

TEST(Device, MemoryCapacityIsEnforced) {
  auto dev = make_cpu_device(1 << 20);
  DeviceBuffer a = dev->alloc(768 << 10, "a");
  EXPECT_EQ(dev->used(), size_t{768} << 10);
  try {
    dev->alloc(512 << 10, "the ring");
    FAIL() << "allocation past the capacity succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the ring"), std::string::npos) << e.what();
  }
  a.reset();
  EXPECT_EQ(dev->used(), 0u);
  DeviceBuffer b = dev->alloc(1 << 20, "b");
  EXPECT_EQ(dev->used(), size_t{1} << 20);
}

TEST(Device, CopiesOnAStreamAreOrdered) {
  auto dev = make_cpu_device(0);
  std::vector<uint8_t> src(1 << 20), dst(1 << 20, 0);
  for (int i = 0; i < 8; ++i) {
    std::fill(src.begin(), src.end(), static_cast<uint8_t>(i));
    // Each copy reads src after the host has refilled it, so wait for it before the next fill.
    FenceId f = dev->make_fence();
    dev->copy(Stream::CopyIn, dst.data(), src.data(), src.size());
    dev->record(Stream::CopyIn, f);
    dev->wait_host(f);
    EXPECT_EQ(dst[12345], i);
  }
  dev->sync();
}

TEST(Device, CrossStreamWait) {
  auto dev = make_cpu_device(0);
  std::vector<int> a(1000), b(1000, -1), c(1000, -1);
  std::iota(a.begin(), a.end(), 0);
  FenceId in_done = dev->make_fence(), out_done = dev->make_fence();
  dev->copy(Stream::CopyIn, b.data(), a.data(), a.size() * sizeof(int));
  dev->record(Stream::CopyIn, in_done);
  dev->wait(Stream::CopyOut, in_done);  // the write-back must see the first copy's data
  dev->copy(Stream::CopyOut, c.data(), b.data(), b.size() * sizeof(int));
  dev->record(Stream::CopyOut, out_done);
  dev->wait_host(out_done);
  EXPECT_EQ(c, a);
}

// A producer (copy stream) fills slots with chunk k; the consumer (compute, the host thread)
// reads them in order. The copy into a slot waits for its consumed fence, the consumer for its
// ready fence: no chunk is overwritten before it is read and nothing deadlocks.
void ring(int n_slots, int n_chunks) {
  auto dev = make_cpu_device(0);
  constexpr size_t kChunk = 64 << 10;
  std::vector<std::vector<uint8_t>> host(static_cast<size_t>(n_chunks),
                                         std::vector<uint8_t>(kChunk));
  for (int k = 0; k < n_chunks; ++k)
    for (size_t i = 0; i < kChunk; ++i)
      host[static_cast<size_t>(k)][i] = static_cast<uint8_t>(k * 31 + i * 7);
  DeviceBuffer slots = dev->alloc(kChunk * static_cast<size_t>(n_slots), "ring");
  std::vector<FenceId> ready, consumed;
  for (int s = 0; s < n_slots; ++s) {
    ready.push_back(dev->make_fence());
    consumed.push_back(dev->make_fence());
  }
  int issued = 0;
  auto issue = [&] {
    const int s = issued % n_slots;
    if (issued >= n_slots) dev->wait(Stream::CopyIn, consumed[static_cast<size_t>(s)]);
    dev->copy(Stream::CopyIn, slots.as() + static_cast<size_t>(s) * kChunk,
              host[static_cast<size_t>(issued)].data(), kChunk);
    dev->record(Stream::CopyIn, ready[static_cast<size_t>(s)]);
    ++issued;
  };
  for (int k = 0; k < n_slots && issued < n_chunks; ++k) issue();
  for (int k = 0; k < n_chunks; ++k) {
    const int s = k % n_slots;
    dev->wait(Stream::Compute, ready[static_cast<size_t>(s)]);
    ASSERT_EQ(std::memcmp(slots.as() + static_cast<size_t>(s) * kChunk,
                          host[static_cast<size_t>(k)].data(), kChunk),
              0)
        << "slot " << s << " does not hold chunk " << k;
    dev->record(Stream::Compute, consumed[static_cast<size_t>(s)]);
    if (issued < n_chunks) issue();  // the copy for chunk k + n_slots waits for `consumed`
  }
  dev->sync();
}

TEST(Device, RingOfOneSlot) {
  ring(1, 64);
}
TEST(Device, RingOfTwoSlots) {
  ring(2, 200);
}
TEST(Device, RingOfEightSlots) {
  ring(8, 200);
}

}  // namespace
}  // namespace kvs
