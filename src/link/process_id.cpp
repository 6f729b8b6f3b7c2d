#include "link/process_id.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace softrdma::link {
namespace {

std::atomic<pid_t> g_pid{0};  // 0: ask the kernel

}  // namespace

pid_t ProcessId() {
  if (const pid_t pid = g_pid.load(std::memory_order_relaxed); pid != 0) return pid;
  // The handler is in before the id is kept: a child forked after the first store forgets it.
  // A static's guard, not std::call_once: that sets thread-locals of libstdc++, whose first use
  // under ASan maps a page (its record of the thread's TLS blocks), and the first question about
  // the maps must not change them (test ProcessMaps.TheQueryAndTheTextAgree: the hole it made was
  // mapped by then).
  static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr, [] { g_pid.store(0, std::memory_order_relaxed); }) == 0;
  }();
  (void)registered;
  const pid_t pid = getpid();
  g_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

}  // namespace softrdma::link
