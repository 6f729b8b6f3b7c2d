// Diagnostics for people debugging their RDMA programs: SOFTRDMA_LOG=1 prints what the device
// decides (links chosen, frames dropped and why) to stderr. Off by default and cheap when off.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace softrdma::core {

inline bool LogEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("SOFTRDMA_LOG");
    return v && *v && *v != '0';
  }();
  return on;
}

}  // namespace softrdma::core

#define SOFTRDMA_LOG(...)                             \
  do {                                                \
    if (::softrdma::core::LogEnabled()) {             \
      std::fprintf(stderr, "softrdma: " __VA_ARGS__); \
      std::fputc('\n', stderr);                       \
    }                                                 \
  } while (0)
