// Placing a payload in application memory: the bytes arrive exactly, and an application that
// polls the last byte and then writes its own value there (riostream) never has that value
// overwritten by the rest of the copy. Both ways of placing: PlaceBytes, and its copy in assembly
// that a fault does not end (link/placement_guard.h), which placements into registered memory take.
#include "link/place.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "link/placement_guard.h"
#include "link/sanitizers.h"

namespace softrdma::link {
namespace {

using Placer = void (*)(void* dst, const void* src, size_t n);

void Guarded(void* dst, const void* src, size_t n) {
  EXPECT_TRUE(GuardedPlace(dst, src, n));
}

class Place : public ::testing::TestWithParam<Placer> {};

INSTANTIATE_TEST_SUITE_P(BothWays, Place, ::testing::Values(&PlaceBytes, &Guarded),
                         [](const auto& info) {
                           return std::string(info.param == &Guarded ? "Guarded" : "PlaceBytes");
                         });

TEST_P(Place, EverySizeAndAlignmentArrivesExactly) {
  std::vector<uint8_t> src(70000), dst(70000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  // Around the tail (64) and where the assembly's bulk turns from words to rep movsb (64 + 256).
  for (size_t n : {0,   1,   7,   8,   9,   63,  64,  65,   71,   127,  128,
                   129, 255, 256, 257, 319, 320, 321, 4096, 8191, 65541}) {
    for (size_t off : {0, 1, 5}) {
      std::fill(dst.begin(), dst.end(), 0xee);
      GetParam()(dst.data() + off, src.data() + 3, n);
      for (size_t i = 0; i < dst.size(); ++i) {
        uint8_t want = i >= off && i < off + n ? src[3 + i - off] : 0xee;
        ASSERT_EQ(dst[i], want) << "n " << n << " off " << off << " byte " << i;
      }
    }
  }
}

// The riostream hang: glibc's AVX-512 memcpy of 64 bytes stores them twice; the poller's marker,
// written between the two stores, was lost. Racing plain stores against a poller is the point
// here, which ThreadSanitizer would report.
TEST_P(Place, AMarkerWrittenAfterTheLastByteArrivesSurvives) {
  if (softrdma::kThreadSanitizer) GTEST_SKIP() << "races by design";
  constexpr int kRounds = 200000;
  constexpr size_t kLen = 64;
  alignas(64) static uint8_t dst[kLen];
  alignas(64) static uint8_t src[kLen];
  // Odd: never a round's tag (it was 0, round 0's tag, which the poller could answer before the
  // copy and then see overwritten).
  std::fill(dst, dst + kLen, uint8_t{0xff});
  std::atomic<int> acked{-1};
  std::atomic<bool> stop{false};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::thread poller([&] {
    std::atomic_ref<uint8_t> last(dst[kLen - 1]);
    for (int r = 0; r < kRounds && !stop.load(std::memory_order_relaxed); ++r) {
      uint8_t tag = static_cast<uint8_t>(2 * r);
      while (last.load(std::memory_order_acquire) != tag)
        if (stop.load(std::memory_order_relaxed)) return;
      last.store(static_cast<uint8_t>(tag + 1), std::memory_order_release);  // the reply marker
      acked.store(r, std::memory_order_release);
    }
  });
  volatile size_t run_time_len = kLen;
  size_t len = run_time_len;
  int lost = 0, r = 0;
  for (; r < kRounds && std::chrono::steady_clock::now() < deadline; ++r) {
    std::fill(src, src + kLen, static_cast<uint8_t>(r));
    src[kLen - 1] = static_cast<uint8_t>(2 * r);
    GetParam()(dst, src, len);  // a length known only at run time, as in the link
    while (acked.load(std::memory_order_acquire) != r)
      if (std::chrono::steady_clock::now() > deadline) break;
    if (acked.load(std::memory_order_acquire) != r) break;
    if (std::atomic_ref<uint8_t>(dst[kLen - 1]).load() != static_cast<uint8_t>(2 * r + 1)) {
      ++lost;
      // Let the poller go on: it waits for the next round's tag, which the next copy brings.
    }
  }
  stop.store(true);
  poller.join();
  EXPECT_EQ(lost, 0) << "markers overwritten in " << r << " rounds";
  EXPECT_GT(r, 1000) << "the poller did not keep up";
}

}  // namespace
}  // namespace softrdma::link
