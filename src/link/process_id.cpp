#include "link/process_id.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace softrdma::link {
namespace {

std::atomic<pid_t> g_pid{0};  // 0: ask the kernel

}  // namespace

pid_t ProcessId() {
  if (const pid_t pid = g_pid.load(std::memory_order_relaxed); pid != 0) return pid;
  // The handler is in before the id is kept: a child forked after the first store forgets it.
  static std::once_flag registered;
  std::call_once(registered, [] {
    pthread_atfork(nullptr, nullptr, [] { g_pid.store(0, std::memory_order_relaxed); });
  });
  const pid_t pid = getpid();
  g_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

}  // namespace softrdma::link
