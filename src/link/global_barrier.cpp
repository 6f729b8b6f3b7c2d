#include "link/global_barrier.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "link/running_thread.h"

namespace softrdma::link {
namespace {

enum State : int { kUnregistered, kRegistering, kReady, kRefused };
std::atomic<int> g_state{kUnregistered};

long Membarrier(int cmd) {
  return syscall(SYS_membarrier, cmd, 0, 0);
}

void Register() {
  const long cmds = Membarrier(MEMBARRIER_CMD_QUERY);
  const bool ok = cmds >= 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
                  (cmds & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) &&
                  Membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
  int expected = kRegistering;
  // A fork() meanwhile reset the child's state; the parent's registration is its own.
  g_state.compare_exchange_strong(expected, ok ? kReady : kRefused, std::memory_order_acq_rel);
}

}  // namespace

void PrepareGlobalBarrierInBackground() {
  static std::once_flag atfork;
  std::call_once(atfork, [] {
    pthread_atfork(nullptr, nullptr,
                   [] { g_state.store(kUnregistered, std::memory_order_relaxed); });
  });
  int expected = kUnregistered;
  if (!g_state.compare_exchange_strong(expected, kRegistering, std::memory_order_acq_rel)) return;
  // Started as the progress thread is: it takes none of the program's signals, and a fork() never
  // catches it inside its start-up.
  StartRunningThread([] { Register(); }).detach();
}

bool GlobalBarrierReady() {
  return g_state.load(std::memory_order_acquire) == kReady;
}

bool GlobalBarrier() {
  return Membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
}

}  // namespace softrdma::link
