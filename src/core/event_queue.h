// A queue whose readiness is a real file descriptor (an eventfd in semaphore mode), so completion
// channels and the async event fd can be poll()ed, made non-blocking, and read from other threads.
#pragma once

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "link/plain_syscall.h"

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
    ssize_t r = sys::Write(fd_, &one, sizeof one);
    (void)r;
  }

  // Blocks unless the application made the fd non-blocking; then returns EAGAIN when empty.
  // A signal interrupts the wait with EINTR, as the read() in rdma-core does: programs such as
  // qperf end timed tests with SIGALRM and rely on it.
  //
  // The eventfd holds one count per queued item, plus `stale_` counts of items that Purge removed
  // while a reader was inside Pop (it cannot take those counts back then, see Purge). A reader
  // whose count turns out to be stale finds the queue empty and waits again.
  int Pop(T* out) {
    return Pop(out, [](const T&) {});
  }

  // As Pop, and `on_take` sees the item under the queue's lock: whatever it records is ordered
  // before a Purge that did not find the item (rdma_get_cm_event counts an event so).
  template <typename OnTake>
  int Pop(T* out, OnTake on_take) {
    return Pop(out, on_take, [](int) { return 0; });
  }

  // As Pop, and `await(fd)` is called before a read that would block: it may wait for the
  // descriptor itself (returns 0 to read, or an errno to return instead).
  template <typename OnTake, typename Await>
  int Pop(T* out, OnTake on_take, Await await) {
    bool queued;
    {
      std::lock_guard<std::mutex> g(mu_);
      ++readers_;
      queued = !items_.empty();
    }
    for (;;) {
      uint64_t v;
      if (int e = queued ? 0 : await(fd_)) {
        std::lock_guard<std::mutex> g(mu_);
        --readers_;
        return e;
      }
      queued = false;
      ssize_t r = read(fd_, &v, sizeof v);
      std::unique_lock<std::mutex> g(mu_);
      if (r != sizeof v) {
        --readers_;
        return r < 0 ? errno : EIO;
      }
      if (items_.empty()) {  // the count of a purged item
        if (stale_ > 0) --stale_;
        // Closed meanwhile (see Close): stay here for good, as a read() blocked on a descriptor
        // another thread closes does, rather than read the closed descriptor.
        if (closed_) never_.wait(g, [] { return false; });
        continue;
      }
      --readers_;
      *out = items_.front();
      items_.pop_front();
      on_take(*out);
      return 0;
    }
  }

  // The owner is about to destroy the queue. True: do so. False: a reader is inside Pop, so the
  // queue must stay (leaked): a program that destroys a channel while one of its threads waits on
  // it (rping's CM thread, when the main thread destroys the id whose DISCONNECTED woke it) sees
  // that thread wait for good, as with the kernel's descriptors, not fail with EBADF.
  bool Close() {
    std::lock_guard<std::mutex> g(mu_);
    closed_ = true;
    return readers_ == 0;
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
    if (removed == 0) return 0;
    if (readers_ > 0) {
      // A reader is inside Pop: it may hold the count of an item just removed, and the file
      // status flags are shared with it, so making the fd non-blocking here would make its
      // blocking read() fail with EAGAIN (rdma_get_cm_event did, in cmtime's server). Leave the
      // counts; readers skip them.
      stale_ += removed;
      return removed;
    }
    // Nobody is in Pop, and nobody enters while we hold mu_: the counts of the removed items are
    // in the eventfd. Take them back without blocking, so that poll() does not report them.
    int fl = fcntl(fd_, F_GETFL);
    if (!(fl & O_NONBLOCK)) fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
    for (int i = 0; i < removed; ++i) {
      uint64_t v;
      ssize_t r = read(fd_, &v, sizeof v);
      (void)r;
    }
    if (!(fl & O_NONBLOCK)) fcntl(fd_, F_SETFL, fl);
    return removed;
  }

 private:
  int fd_;
  std::mutex mu_;
  std::deque<T> items_;
  int readers_ = 0;     // threads inside Pop
  uint64_t stale_ = 0;  // counts in the eventfd whose items were purged
  bool closed_ = false;
  std::condition_variable never_;  // what a reader of a closed queue waits on
};

}  // namespace softrdma::core
