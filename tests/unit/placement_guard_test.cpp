// Copies and atomics into application memory that a fault does not end (link/placement_guard.h):
// into pages made read-only they report failure instead of killing the process, the way past the
// protection then writes the bytes, and where nothing faults they do what an HCA does.
#include "link/placement_guard.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "link/page_move_guard.h"

namespace softrdma::link {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Private anonymous pages, filled with 0xee, then given `prot` from page `from` on.
struct Pages {
  Pages(size_t n, int prot, size_t from = 0) : len(n * kPage) {
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    p = static_cast<uint8_t*>(m);
    std::memset(p, 0xee, len);
    if (mprotect(p + from * kPage, len - from * kPage, prot) != 0) {
      munmap(p, len);
      p = nullptr;
    }
  }
  ~Pages() {
    if (p) munmap(p, len);
  }
  size_t len;
  uint8_t* p = nullptr;
};

class PlacementGuard : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallFaultHandler();
    src.resize(3 * kPage);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  }
  std::vector<uint8_t> src;
};

TEST_F(PlacementGuard, AccessesToAReadOnlyPageFailAndWriteNothing) {
  Pages ro(1, PROT_READ);
  ASSERT_NE(ro.p, nullptr);
  auto* word = reinterpret_cast<uint64_t*>(ro.p + 64);
  const uint64_t before = *word;
  uint64_t orig = 1;
  EXPECT_FALSE(GuardedPlace(ro.p + 8, src.data(), 100));
  EXPECT_FALSE(GuardedPlace(ro.p + 8, src.data(), 500));  // the bulk's 64-byte rounds
  EXPECT_FALSE(GuardedPlace(ro.p, src.data(), kPage));    // the rep movsb bulk
  EXPECT_FALSE(GuardedStore8(ro.p + 3, 42));
  EXPECT_FALSE(GuardedCompareSwap(word, before, 7, &orig));      // would swap
  EXPECT_FALSE(GuardedCompareSwap(word, before + 1, 7, &orig));  // would not: faults all the same
  EXPECT_FALSE(GuardedFetchAdd(word, 5, &orig));
  for (size_t i = 0; i < kPage; ++i) ASSERT_EQ(ro.p[i], 0xee) << "byte " << i;
}

TEST_F(PlacementGuard, ReadingAnInaccessiblePageFails) {
  Pages none(1, PROT_NONE);
  ASSERT_NE(none.p, nullptr);
  std::vector<uint8_t> to(kPage, 0);
  EXPECT_FALSE(GuardedPlace(to.data(), none.p, 64));
  EXPECT_FALSE(GuardedPlace(to.data(), none.p, 500));
  EXPECT_FALSE(GuardedPlace(to.data(), none.p, kPage));
}

// Every length from nothing to past where the bulk turns to rep movsb, from and to every
// alignment within a word and a vector: the bytes are the source's, and not one byte beside them
// is written.
TEST_F(PlacementGuard, EveryLengthAndAlignmentIsCopiedExactly) {
  constexpr size_t kMaxLen = 1200, kSlack = 32;
  std::vector<uint8_t> to(kMaxLen + 2 * kSlack);
  for (size_t len = 0; len <= kMaxLen; len += len < 200 ? 1 : 7) {
    for (size_t to_off : {0, 1, 7, 8, 15, 17}) {
      for (size_t from_off : {0, 3, 8, 16}) {
        std::fill(to.begin(), to.end(), 0xee);
        uint8_t* d = to.data() + kSlack + to_off;
        ASSERT_TRUE(GuardedPlace(d, src.data() + from_off, len));
        ASSERT_EQ(std::memcmp(d, src.data() + from_off, len), 0)
            << len << " bytes to +" << to_off << " from +" << from_off;
        for (size_t i = 0; i < to.size(); ++i) {
          if (to.data() + i < d || to.data() + i >= d + len) {
            ASSERT_EQ(to[i], 0xee) << "byte " << i << " beside " << len << " bytes";
          }
        }
      }
    }
  }
}

// The probe of a READ's source: every page of the range is looked at, the last one too, and an
// inaccessible or unmapped page makes it false; nothing is written.
TEST_F(PlacementGuard, AProbeFindsEveryPageThatCannotBeRead) {
  Pages three(3, PROT_NONE, 2);
  ASSERT_NE(three.p, nullptr);
  EXPECT_TRUE(Readable(three.p, 0));
  EXPECT_TRUE(Readable(three.p + 1, 2 * kPage - 1));
  EXPECT_FALSE(Readable(three.p + 1, 2 * kPage));  // its last byte is the third page's first
  EXPECT_FALSE(Readable(three.p + 2 * kPage + 8, 8));
  Pages holed(3, PROT_READ);  // its middle page unmapped: a hole nothing else is mapped into
  ASSERT_NE(holed.p, nullptr);
  ASSERT_EQ(munmap(holed.p + kPage, kPage), 0);
  EXPECT_FALSE(Readable(holed.p + kPage, 64));
  EXPECT_FALSE(Readable(holed.p, 2 * kPage));
  Pages read_only(1, PROT_READ);
  ASSERT_NE(read_only.p, nullptr);
  EXPECT_TRUE(Readable(read_only.p, kPage));
}

// A copy that faults halfway (its second page read-only) reports it; the way past the protection
// then writes all of it.
TEST_F(PlacementGuard, PastTheProtectionEveryByteLands) {
  Pages half(2, PROT_READ, 1);
  ASSERT_NE(half.p, nullptr);
  EXPECT_FALSE(GuardedPlace(half.p + 100, src.data(), kPage));
  ASSERT_TRUE(PlaceGuarded(half.p + 100, src.data(), kPage));
  for (size_t i = 0; i < 2 * kPage; ++i) {
    const bool in = i >= 100 && i < 100 + kPage;
    ASSERT_EQ(half.p[i], in ? src[i - 100] : 0xee) << "byte " << i;
  }
  ASSERT_TRUE(StoreGuarded(half.p + kPage + 1000, 0x0102030405060708));
  uint64_t stored;
  std::memcpy(&stored, half.p + kPage + 1000, 8);
  EXPECT_EQ(stored, 0x0102030405060708u);
}

TEST_F(PlacementGuard, WhereNothingFaultsTheAtomicsAreAnHcas) {
  uint64_t word = 10, orig = 0;
  ASSERT_TRUE(GuardedCompareSwap(&word, 11, 20, &orig));
  EXPECT_EQ(orig, 10u);
  EXPECT_EQ(word, 10u) << "no match, no swap";
  ASSERT_TRUE(GuardedCompareSwap(&word, 10, 20, &orig));
  EXPECT_EQ(orig, 10u);
  EXPECT_EQ(word, 20u);
  ASSERT_TRUE(GuardedFetchAdd(&word, 5, &orig));
  EXPECT_EQ(orig, 20u);
  EXPECT_EQ(word, 25u);
  uint8_t bytes[16] = {};
  ASSERT_TRUE(GuardedStore8(bytes + 3, 0x1122334455667788));
  uint64_t stored;
  std::memcpy(&stored, bytes + 3, 8);
  EXPECT_EQ(stored, 0x1122334455667788u);
  EXPECT_EQ(bytes[2], 0);
  EXPECT_EQ(bytes[11], 0);
}

}  // namespace
}  // namespace softrdma::link
