// softrdma-bench-pingpong: the cache-line ping-pong anchor of bench/shm_bench.sh. Two processes
// (fork) busy-poll one cache line of shared memory (mmap MAP_SHARED | MAP_ANONYMOUS) and bounce
// a counter: the parent writes an odd value and spins until the child has answered with the next
// even one. That is the floor for any message passing between two processes through memory.
//
//   softrdma-bench-pingpong [--batches N] [--batch K]
//
// The parent times batches of K round trips (default 100, so the clock reads cost little); a
// batch's one-way latency is its time / K / 2. Reported: the median over N batches (default
// 10000), with the min and the 99th percentile, in microseconds:
//
//   one-way latency: median 0.181 us (min 0.170, p99 0.250; 10000 batches of 100 round trips)
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kStop = ~uint64_t{0};
constexpr int kStallSeconds = 10;  // give up if the other side does not answer for this long

struct alignas(64) Line {
  std::atomic<uint64_t> value{0};
};

// Spins until `line` holds `want` (or kStop); returns what it saw. Exits after kStallSeconds of
// silence, so a lost peer never leaves a process spinning forever.
uint64_t WaitFor(const Line& line, uint64_t want) {
  uint64_t spins = 0;
  Clock::time_point since{};
  for (;;) {
    uint64_t v = line.value.load(std::memory_order_acquire);
    if (v == want || v == kStop) return v;
    if ((++spins & 0xfffff) == 0) {
      auto now = Clock::now();
      if (since == Clock::time_point{}) {
        since = now;
      } else if (now - since > std::chrono::seconds(kStallSeconds)) {
        std::fprintf(stderr, "pingpong probe: no answer for %d s\n", kStallSeconds);
        std::_Exit(1);
      }
    }
  }
}

bool ParseCount(const char* s, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end || v <= 0) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long batches = 10000;
  long batch = 100;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    long v = 0;
    if ((a == "--batches" || a == "--batch") && i + 1 < argc && ParseCount(argv[i + 1], &v)) {
      (a == "--batches" ? batches : batch) = v;
      ++i;
    } else {
      std::fprintf(stderr, "usage: softrdma-bench-pingpong [--batches N] [--batch K]\n");
      return 2;
    }
  }

  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  Line* line = new (mem) Line;
  static_assert(std::atomic<uint64_t>::is_always_lock_free);

  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) std::_Exit(1);
    // Answer every odd value with the next even one until told to stop.
    for (uint64_t want = 1;; want += 2) {
      if (WaitFor(*line, want) == kStop) std::_Exit(0);
      line->value.store(want + 1, std::memory_order_release);
    }
  }

  uint64_t seq = 0;
  auto round_trip = [&] {
    line->value.store(++seq, std::memory_order_release);
    ++seq;
    if (WaitFor(*line, seq) == kStop) std::_Exit(1);
  };
  for (long i = 0; i < 10000; ++i) round_trip();  // warm-up: both sides spinning, line shared

  std::vector<double> us;
  us.reserve(static_cast<size_t>(batches));
  for (long b = 0; b < batches; ++b) {
    auto t0 = Clock::now();
    for (long i = 0; i < batch; ++i) round_trip();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    us.push_back(s * 1e6 / static_cast<double>(batch) / 2);
  }
  line->value.store(kStop, std::memory_order_release);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "pingpong probe: the child failed\n");
    return 1;
  }

  std::sort(us.begin(), us.end());
  std::printf(
      "one-way latency: median %.3f us (min %.3f, p99 %.3f; %ld batches of %ld round trips)\n",
      us[us.size() / 2], us.front(), us[us.size() * 99 / 100], batches, batch);
  return 0;
}
