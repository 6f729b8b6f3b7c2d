// Starts a thread and returns once the thread runs its body. Until then the thread is inside its
// start-up (the C library's, a sanitizer runtime's), which allocates: a fork() meanwhile would
// copy the allocator's lock held by a thread the child does not have, and where the allocator does
// not guard fork() itself (the sanitizers' do not) the child's first thread blocks on it for good.
#pragma once

#include <future>
#include <thread>
#include <utility>

namespace softrdma::link {

template <typename Body>
std::thread StartRunningThread(Body body) {
  std::promise<void> started;  // its shared state outlives this frame if the thread needs it to
  std::future<void> running = started.get_future();
  std::thread t([started = std::move(started), body = std::move(body)]() mutable {
    started.set_value();
    body();
  });
  running.wait();
  return t;
}

}  // namespace softrdma::link
