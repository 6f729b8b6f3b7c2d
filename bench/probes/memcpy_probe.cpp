// softrdma-bench-memcpy: the memcpy anchor of bench/shm_bench.sh. Single-thread memcpy bandwidth
// between two warm, page-aligned buffers, for each SIZE (default 64 KiB and 1 MiB).
//
//   softrdma-bench-memcpy [--reps N] [--ms MS] [SIZE...]
//
// One rep copies SIZE bytes over and over for about MS milliseconds (default 20) and yields
// one figure; the median of N reps (default 25) is reported, with the min and max:
//
//   size 65536 B: median 31.234 GB/s (min 29.100, max 32.050; 25 reps)
//
// GB/s = 10^9 bytes copied per second (bytes read = bytes written = SIZE per copy).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Keeps the copies: the compiler must assume the buffers are read and written here.
inline void Clobber(void* dst, const void* src) {
  asm volatile("" : : "r"(dst), "r"(src) : "memory");
}

bool ParseCount(const char* s, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!*s || *end || v <= 0) return false;
  *out = v;
  return true;
}

int Usage() {
  std::fprintf(stderr, "usage: softrdma-bench-memcpy [--reps N] [--ms MS] [SIZE...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long reps = 25;
  long ms = 20;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    long v = 0;
    if ((a == "--reps" || a == "--ms") && i + 1 < argc && ParseCount(argv[i + 1], &v)) {
      (a == "--reps" ? reps : ms) = v;
      ++i;
    } else if (ParseCount(argv[i], &v)) {
      sizes.push_back(static_cast<size_t>(v));
    } else {
      return Usage();
    }
  }
  if (sizes.empty()) sizes = {65536, 1048576};

  for (size_t size : sizes) {
    size_t len = (size + 4095) & ~size_t{4095};
    void* p = mmap(nullptr, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      return 1;
    }
    auto* src = static_cast<char*>(p);
    char* dst = src + len;
    std::memset(src, 0x5a, len);
    std::memset(dst, 0xa5, len);

    // Calibrate: copies per rep so that one rep lasts about `ms` milliseconds.
    long copies = 1;
    for (;;) {
      auto t0 = Clock::now();
      for (long c = 0; c < copies; ++c) {
        std::memcpy(dst, src, size);
        Clobber(dst, src);
      }
      double s = Seconds(t0, Clock::now());
      if (s >= ms / 1000.0 / 4 || copies > (1L << 40)) {
        copies = std::max(1L, static_cast<long>(copies * (ms / 1000.0) / std::max(s, 1e-9)));
        break;
      }
      copies *= 2;
    }

    std::vector<double> gbs;
    for (long r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      for (long c = 0; c < copies; ++c) {
        std::memcpy(dst, src, size);
        Clobber(dst, src);
      }
      double s = Seconds(t0, Clock::now());
      gbs.push_back(static_cast<double>(size) * static_cast<double>(copies) / s / 1e9);
    }
    if (std::memcmp(dst, src, size) != 0) {
      std::fprintf(stderr, "memcpy probe: copy mismatch\n");
      return 1;
    }
    munmap(p, 2 * len);
    std::sort(gbs.begin(), gbs.end());
    std::printf("size %zu B: median %.3f GB/s (min %.3f, max %.3f; %ld reps)\n", size,
                gbs[gbs.size() / 2], gbs.front(), gbs.back(), reps);
  }
  return 0;
}
