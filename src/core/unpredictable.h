// Numbers a peer must not be able to guess: memory keys (an rkey is the only check on a remote
// access), initial packet sequence numbers. Per thread, from a generator the kernel seeds, seeded
// again in a fork() child: a copy of its parent's state repeated every number the parent drew next.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <random>

namespace softrdma::core {

inline uint32_t UnpredictableU32() {
  struct Seeded {
    pid_t pid = 0;
    std::mt19937 gen;
  };
  static thread_local Seeded s;
  if (const pid_t pid = getpid(); s.pid != pid) {
    s.gen.seed(std::random_device{}());
    s.pid = pid;
  }
  return static_cast<uint32_t>(s.gen());
}

}  // namespace softrdma::core
