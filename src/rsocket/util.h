// Small helpers the socket kinds share: iovec copies, non-blocking fds, the EAGAIN path.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace softrdma::rsocket {

// How long a blocking call looks for progress before it sleeps (rdma-core's rsockets spin for
// their polling_time too): most answers come within tens of microseconds, and waking a sleeper
// can take milliseconds where cores are shared or virtual.
constexpr std::chrono::microseconds kSpinBeforeSleep{50};

inline void SetNonBlocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// A non-blocking call that found nothing to do. Programs spin on these (rstream's default mode),
// often with their peer on the same cores: giving the CPU away here lets the peer make the
// progress this caller waits for.
inline int WouldBlock() {
  sched_yield();
  return -EAGAIN;
}

inline size_t IovTotal(const iovec* iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

// Copies len bytes starting skip bytes into the iovecs to dst.
inline void GatherFrom(const iovec* iov, int n, size_t skip, uint8_t* dst, size_t len) {
  for (int i = 0; i < n && len; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    size_t k = std::min(iov[i].iov_len - skip, len);
    std::memcpy(dst, static_cast<const uint8_t*>(iov[i].iov_base) + skip, k);
    dst += k;
    len -= k;
    skip = 0;
  }
}

// Copies len bytes from src into the iovecs, starting skip bytes in.
inline void ScatterTo(const iovec* iov, int n, size_t skip, const uint8_t* src, size_t len) {
  for (int i = 0; i < n && len; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    size_t k = std::min(iov[i].iov_len - skip, len);
    std::memcpy(static_cast<uint8_t*>(iov[i].iov_base) + skip, src, k);
    src += k;
    len -= k;
    skip = 0;
  }
}

}  // namespace softrdma::rsocket
