#include "rsocket/poll.h"

#include <sched.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <vector>

#include "rsocket/fd_table.h"
#include "rsocket/util.h"

namespace softrdma::rsocket {

int Poll(pollfd* fds, nfds_t nfds, int timeout_ms) {
  if (!fds && nfds) return -EFAULT;
  using Clock = std::chrono::steady_clock;
  const bool forever = timeout_ms < 0;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(forever ? 0 : timeout_ms);
  std::vector<std::shared_ptr<Socket>> socks(nfds);
  bool any_rsocket = false;
  for (nfds_t i = 0; i < nfds; ++i) {
    int err = 0;
    if (fds[i].fd >= 0) socks[i] = FindSocket(fds[i].fd, &err);
    any_rsocket |= socks[i] != nullptr;
  }
  if (!any_rsocket) {
    int r = poll(fds, nfds, timeout_ms);
    return r < 0 ? -errno : r;
  }
  // Like rdma-core's rsockets (its polling_time), look for a while before sleeping: an answer
  // usually takes microseconds, and a sleeper's wake-up can take milliseconds on a busy or
  // virtual machine (udpong resends whatever is not back within 1 ms, and then hangs).
  const Clock::time_point spin_until = Clock::now() + kSpinBeforeSleep;
  std::vector<pollfd> wait;
  for (;;) {
    // Ordinary fds are looked at without waiting; rsockets make non-blocking progress.
    wait.clear();
    for (nfds_t i = 0; i < nfds; ++i) {
      if (!socks[i]) wait.push_back({fds[i].fd, fds[i].events, 0});
    }
    if (!wait.empty() && poll(wait.data(), wait.size(), 0) < 0) return -errno;
    int ready = 0;
    size_t k = 0;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = socks[i] ? socks[i]->Readiness(fds[i].events) : wait[k++].revents;
      if (fds[i].revents) ++ready;
    }
    if (ready) return ready;
    const Clock::time_point now = Clock::now();
    if (!forever && now >= deadline) {
      // rpoll(..., 0) in a loop is how programs spin (rstream -T a): yield as a poll(2) system
      // call would, so a peer sharing the cores gets to make the progress this caller waits for.
      if (timeout_ms == 0) sched_yield();
      return 0;
    }
    if (now < spin_until) continue;
    // Nothing yet: arm every rsocket and sleep on all underlying fds together.
    wait.clear();
    bool news = false;
    for (nfds_t i = 0; i < nfds; ++i) {
      if (socks[i]) {
        if (!socks[i]->Arm(&wait)) news = true;
      } else {
        wait.push_back({fds[i].fd, fds[i].events, 0});
      }
    }
    if (news) continue;
    int r = PollUntil(&wait, deadline, forever);
    if (r < 0 && r != -EINTR) return r;
    if (r == -EINTR) return r;
  }
}

int Select(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return -EINVAL;
  std::vector<pollfd> fds;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (exceptfds && FD_ISSET(fd, exceptfds)) ev |= POLLPRI;
    if (ev) fds.push_back({fd, ev, 0});
  }
  int timeout_ms = -1;
  auto start = std::chrono::steady_clock::now();
  if (timeout) {
    if (timeout->tv_sec < 0 || timeout->tv_usec < 0) return -EINVAL;
    timeout_ms = static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_usec + 999) / 1000);
  }
  int r = Poll(fds.data(), fds.size(), timeout_ms);
  if (r < 0) return r;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int count = 0;
  for (const pollfd& p : fds) {
    if (p.revents & POLLNVAL) return -EBADF;
    if (readfds && (p.events & POLLIN) && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(p.fd, readfds);
      ++count;
    }
    if (writefds && (p.events & POLLOUT) && (p.revents & (POLLOUT | POLLERR))) {
      FD_SET(p.fd, writefds);
      ++count;
    }
    if (exceptfds && (p.events & POLLPRI) && (p.revents & POLLPRI)) {
      FD_SET(p.fd, exceptfds);
      ++count;
    }
  }
  if (timeout) {
    auto spent = std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
    int64_t left = static_cast<int64_t>(timeout->tv_sec) * 1000000 + timeout->tv_usec - spent;
    if (left < 0) left = 0;
    timeout->tv_sec = left / 1000000;
    timeout->tv_usec = left % 1000000;
  }
  return count;
}

}  // namespace softrdma::rsocket
