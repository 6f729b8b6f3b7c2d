// A queue whose readiness is a real file descriptor (an eventfd in semaphore mode), so completion
// channels and the async event fd can be poll()ed, made non-blocking, and read from other threads.
#pragma once

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <mutex>

namespace softrdma::core {

template <typename T>
class EventQueue {
 public:
  EventQueue() : fd_(eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC)) {}
  ~EventQueue() {
    if (fd_ >= 0) close(fd_);
  }
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  int fd() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

  void Push(const T& v) {
    {
      std::lock_guard<std::mutex> g(mu_);
      items_.push_back(v);
    }
    uint64_t one = 1;
    ssize_t r = write(fd_, &one, sizeof one);
    (void)r;
  }

  // Blocks unless the application made the fd non-blocking; then returns EAGAIN when empty.
  // A signal interrupts the wait with EINTR, as the read() in rdma-core does: programs such as
  // qperf end timed tests with SIGALRM and rely on it.
  int Pop(T* out) {
    uint64_t v;
    ssize_t r = read(fd_, &v, sizeof v);
    if (r != sizeof v) return r < 0 ? errno : EIO;
    std::lock_guard<std::mutex> g(mu_);
    *out = items_.front();
    items_.pop_front();
    return 0;
  }

  size_t size() {
    std::lock_guard<std::mutex> g(mu_);
    return items_.size();
  }

  // Removes queued events that refer to an object being destroyed.
  template <typename Pred>
  int Purge(Pred pred) {
    std::lock_guard<std::mutex> g(mu_);
    int removed = 0;
    for (auto it = items_.begin(); it != items_.end();) {
      if (pred(*it)) {
        it = items_.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
    // Consume the matching semaphore counts without blocking.
    int fl = fcntl(fd_, F_GETFL);
    fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
    for (int i = 0; i < removed; ++i) {
      uint64_t v;
      ssize_t r = read(fd_, &v, sizeof v);
      (void)r;
    }
    fcntl(fd_, F_SETFL, fl);
    return removed;
  }

 private:
  int fd_;
  std::mutex mu_;
  std::deque<T> items_;
};

}  // namespace softrdma::core
