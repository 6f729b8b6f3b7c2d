// The pause after a socket lease stranded frames: short for ping-pong traffic that strands one
// now and then, growing to 100 ms for an application that never polls for its frames.
#include "link/lease_pause.h"

#include <gtest/gtest.h>

namespace softrdma::link {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(LeasePause, AFirstStrandingPausesForAMillisecond) {
  LeasePause p;
  EXPECT_EQ(p.AfterStranding(2 * kMs), LeasePause::kMinNs);
}

// riostream: each lease polls once and strands the exchange it then spins for.
TEST(LeasePause, LeasesThatKeepStrandingFramesPauseLongerUpToAHundredMilliseconds) {
  LeasePause p;
  int64_t expected = kMs;
  for (int i = 0; i < 7; ++i, expected *= 2) EXPECT_EQ(p.AfterStranding(1 * kMs), expected);
  EXPECT_EQ(p.AfterStranding(1 * kMs), 100 * kMs);
  EXPECT_EQ(p.AfterStranding(1 * kMs), 100 * kMs);
}

// ib_write_lat over TCP: a lease serves the ping-pong for seconds, then one late answer strands a
// frame. The pause must not stay at the 100 ms an earlier run of strandings reached.
TEST(LeasePause, ALeaseThatServedLongStartsThePauseOver) {
  LeasePause p;
  for (int i = 0; i < 10; ++i) p.AfterStranding(kMs);
  EXPECT_EQ(p.AfterStranding(LeasePause::kProvenNs), LeasePause::kMinNs);
  EXPECT_EQ(p.AfterStranding(LeasePause::kProvenNs - 1), 2 * kMs);
}

}  // namespace
}  // namespace softrdma::link
