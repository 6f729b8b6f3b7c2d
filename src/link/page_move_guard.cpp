#include "link/page_move_guard.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "link/placement_guard.h"

namespace softrdma::link {
namespace {

// The pages of the move on or of the last one: a thread that faulted just before the end may
// reach the handler just after it, and must still go back to its write.
std::atomic<uintptr_t> g_lo{0};
std::atomic<uintptr_t> g_hi{0};
std::atomic<uint32_t> g_moving{0};  // 1 while a move is on (a futex word)
std::atomic<pid_t> g_mover{0};      // the thread moving
const uintptr_t g_page_bytes = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
std::atomic<int64_t> g_ended_ns{0};
// A fault in the last move's pages this soon after its end is one of its writes, retried; later,
// those pages are the application's again, and a fault there is its own (retrying that for ever
// would hang the thread instead of letting its handler or the default action see it).
constexpr int64_t kLateFaultNs = 100'000'000;

// The handlers before ours (SIGSEGV, SIGBUS); written only while ours is not installed.
struct sigaction g_previous = {};
struct sigaction g_previous_bus = {};

pid_t ThreadId() {
  return static_cast<pid_t>(syscall(SYS_gettid));
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void PassOn(int sig, siginfo_t* info, void* context) {
  const struct sigaction& p = sig == SIGBUS ? g_previous_bus : g_previous;
  if (p.sa_flags & SA_SIGINFO) {
    if (p.sa_sigaction) return p.sa_sigaction(sig, info, context);
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    return p.sa_handler(sig);
  }
  // The default action: returning repeats the fault, which then ends the process as it would have
  // without us.
  signal(sig, SIG_DFL);
}

void WaitWhileMoving() {
  while (g_moving.load(std::memory_order_acquire)) {
    timespec bound{0, 1'000'000};  // a wake-up lost to a race costs at most this
    syscall(SYS_futex, &g_moving, FUTEX_WAIT_PRIVATE, 1, &bound, nullptr, 0);
  }
}

void OnFault(int sig, siginfo_t* info, void* context) {
  const auto a = reinterpret_cast<uintptr_t>(info->si_addr);
  if (info->si_code == SEGV_ACCERR && a >= g_lo.load(std::memory_order_acquire) &&
      a < g_hi.load(std::memory_order_acquire)) {
    if (g_moving.load(std::memory_order_acquire) &&
        g_mover.load(std::memory_order_relaxed) == ThreadId()) {
      // A signal handler on the moving thread itself: waiting would never end. Its page is made
      // writable, and that write may be lost as every such write was before the guard.
      const uintptr_t page = a & ~(g_page_bytes - 1);
      if (mprotect(reinterpret_cast<void*>(page), 1, PROT_READ | PROT_WRITE) == 0) return;
      return PassOn(sig, info, context);
    }
    WaitWhileMoving();
    if (NowNs() - g_ended_ns.load(std::memory_order_acquire) < kLateFaultNs) return;  // write again
  }
  if (ResumeFaultedPlacement(info, context)) return;  // into pages the application made read-only
  PassOn(sig, info, context);
}

// A bus error inside a placement: registered pages of a file the application truncated since (an
// HCA would write the pages the registration pinned). Past the end of the file, /proc/self/mem
// does not write either, and the access fails.
void OnBusError(int sig, siginfo_t* info, void* context) {
  if (ResumeFaultedPlacement(info, context)) return;
  PassOn(sig, info, context);
}

// Puts `handler` in for `sig` unless it is there already; the one it replaces goes to `previous`.
bool InstallFor(int sig, void (*handler)(int, siginfo_t*, void*), struct sigaction* previous) {
  struct sigaction current {};
  if (sigaction(sig, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == handler) return true;
  struct sigaction ours {};
  ours.sa_sigaction = handler;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  *previous = current;
  return sigaction(sig, &ours, nullptr) == 0;
}

// Ours go (back) in before every move: the application may have put its own in since, which
// then become the ones faults not ours go to.
bool Install() {
  InstallFor(SIGBUS, OnBusError, &g_previous_bus);
  return InstallFor(SIGSEGV, OnFault, &g_previous);
}

// The move is over (`restore`: it failed, the old pages are made writable again): writers that
// wait for it go on.
void EndMove(bool restore) {
  if (restore)
    mprotect(reinterpret_cast<void*>(g_lo.load(std::memory_order_relaxed)),
             g_hi.load(std::memory_order_relaxed) - g_lo.load(std::memory_order_relaxed),
             PROT_READ | PROT_WRITE);
  g_ended_ns.store(NowNs(), std::memory_order_release);
  g_moving.store(0, std::memory_order_release);
  syscall(SYS_futex, &g_moving, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

void InstallFaultHandler() {
  static const bool installed = Install();
  (void)installed;
}

PageMoveGuard::PageMoveGuard(uintptr_t start, size_t len) : on_(Install()) {
  if (!on_) return;
  g_mover.store(ThreadId(), std::memory_order_relaxed);
  g_moving.store(1, std::memory_order_relaxed);
  g_lo.store(start, std::memory_order_relaxed);
  g_hi.store(start + len, std::memory_order_release);
  if (mprotect(reinterpret_cast<void*>(start), len, PROT_READ) == 0) return;
  EndMove(false);
  on_ = false;
}

bool PageMoveGuard::AwaitMoveOver() {
  if (g_moving.load(std::memory_order_acquire)) {
    if (g_mover.load(std::memory_order_relaxed) == ThreadId()) return false;
    WaitWhileMoving();
    return true;
  }
  // One that ended just now may have been the refusal's cause: as a late fault in OnFault.
  return NowNs() - g_ended_ns.load(std::memory_order_acquire) < kLateFaultNs;
}

PageMoveGuard::~PageMoveGuard() {
  if (on_) EndMove(!moved_);
}

}  // namespace softrdma::link
