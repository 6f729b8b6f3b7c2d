// Starts a thread and returns once the thread runs its body. Until then the thread is inside its
// start-up (the C library's, a sanitizer runtime's), which allocates: a fork() meanwhile would
// copy the allocator's lock held by a thread the child does not have, and where the allocator does
// not guard fork() itself (the sanitizers' do not) the child's first thread blocks on it for good.
#pragma once

#include <pthread.h>

#include <csignal>
#include <future>
#include <thread>
#include <utility>

namespace softrdma::link {

// While alive, the calling thread blocks every asynchronous signal, and so does any thread it
// starts meanwhile (a thread inherits its creator's mask; set so, the new thread never has a
// moment in which it takes one). rdma-core starts no thread, so a program's signals must reach
// only the program's threads: a SIGUSR1 that a sigwait() thread waits for, blocked by the program
// everywhere else, killed the whole process from our progress thread (test Signals.*). Faults stay
// unblocked: a blocked SIGSEGV kills without running the handler (the sanitizers report from it).
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS})
      sigdelset(&all, fault);
    pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  ~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  AsyncSignalsBlocked(const AsyncSignalsBlocked&) = delete;
  AsyncSignalsBlocked& operator=(const AsyncSignalsBlocked&) = delete;

 private:
  sigset_t saved_;
};

template <typename Body>
std::thread StartRunningThread(Body body) {
  std::promise<void> started;  // its shared state outlives this frame if the thread needs it to
  std::future<void> running = started.get_future();
  AsyncSignalsBlocked in_the_new_thread;
  std::thread t([started = std::move(started), body = std::move(body)]() mutable {
    started.set_value();
    body();
  });
  running.wait();
  return t;
}

}  // namespace softrdma::link
