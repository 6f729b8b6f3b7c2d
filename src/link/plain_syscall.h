// The system calls the data path makes (ibv_post_send, ibv_poll_cq and what they drive), made
// directly rather than through glibc's wrappers.
//
// The wrappers of send, recv, read, write, connect, accept, close, poll and epoll_wait are
// cancellation points. On a NIC the data-path verbs make no system call, so they are never where a
// thread's pending cancellation acts; here they were, and a thread cancelled in one died with the
// endpoint's progress mutex locked: no thread of the process made progress again
// (tests/semantics/cancellation_test.cpp). A direct system call is not a cancellation point, and
// skips the wrapper's cancellation bookkeeping (about a hundred instructions per call).
//
// Blocking waits the man pages leave cancellable (ibv_get_cq_event's read) keep glibc's wrappers.
// Each returns as its wrapper does: -1 with errno set on failure.
//
// Under ThreadSanitizer the wrappers stay: its interceptors of them are where it learns that a
// descriptor orders two threads (an epoll_ctl before the epoll_wait that reports the object, an
// eventfd write before its read); without them it reported races on every object handed over so.
// The sanitizer build is a test build: it does not check the cancellation property.
#pragma once

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <ctime>

#include "link/sanitizers.h"

namespace softrdma::sys {

constexpr bool kPlain = !kThreadSanitizer;

inline ssize_t Send(int fd, const void* p, size_t n, int flags) {
  if constexpr (!kPlain) return ::send(fd, p, n, flags);
  return syscall(SYS_sendto, fd, p, n, flags, nullptr, 0);
}
inline ssize_t SendMsg(int fd, const msghdr* m, int flags) {
  if constexpr (!kPlain) return ::sendmsg(fd, m, flags);
  return syscall(SYS_sendmsg, fd, m, flags);
}
inline ssize_t Recv(int fd, void* p, size_t n, int flags) {
  if constexpr (!kPlain) return ::recv(fd, p, n, flags);
  return syscall(SYS_recvfrom, fd, p, n, flags, nullptr, nullptr);
}
inline ssize_t RecvMsg(int fd, msghdr* m, int flags) {
  if constexpr (!kPlain) return ::recvmsg(fd, m, flags);
  return syscall(SYS_recvmsg, fd, m, flags);
}
inline int RecvMmsg(int fd, mmsghdr* v, unsigned n, int flags) {
  if constexpr (!kPlain) return ::recvmmsg(fd, v, n, flags, nullptr);
  return static_cast<int>(syscall(SYS_recvmmsg, fd, v, n, flags, nullptr));
}
inline ssize_t Readv(int fd, const iovec* v, int n) {
  if constexpr (!kPlain) return ::readv(fd, v, n);
  return syscall(SYS_readv, fd, v, n);
}
inline ssize_t Read(int fd, void* p, size_t n) {
  if constexpr (!kPlain) return ::read(fd, p, n);
  return syscall(SYS_read, fd, p, n);
}
inline ssize_t Write(int fd, const void* p, size_t n) {
  if constexpr (!kPlain) return ::write(fd, p, n);
  return syscall(SYS_write, fd, p, n);
}
inline int Connect(int fd, const sockaddr* a, socklen_t len) {
  if constexpr (!kPlain) return ::connect(fd, a, len);
  return static_cast<int>(syscall(SYS_connect, fd, a, len));
}
// `from`, when given, receives the peer's address (`*from_len` bytes at most).
inline int Accept4(int fd, int flags, sockaddr* from = nullptr, socklen_t* from_len = nullptr) {
  if constexpr (!kPlain) return ::accept4(fd, from, from_len, flags);
  return static_cast<int>(syscall(SYS_accept4, fd, from, from_len, flags));
}
inline int Close(int fd) {
  if constexpr (!kPlain) return ::close(fd);
  return static_cast<int>(syscall(SYS_close, fd));
}
// epoll_pwait without a signal mask is epoll_wait, on every architecture (some have no epoll_wait).
inline int EpollWait(int epfd, epoll_event* events, int max, int timeout_ms) {
  if constexpr (!kPlain) return ::epoll_wait(epfd, events, max, timeout_ms);
  return static_cast<int>(
      syscall(SYS_epoll_pwait, epfd, events, max, timeout_ms, nullptr, size_t{_NSIG / 8}));
}

// poll(2) with a zero timeout: it registers on no wait queue, and takes no socket lock. poll
// itself where the architecture has it: ppoll copies in a timeout and a signal mask first (an empty
// look at a TCP socket 222 ns against 262 on x86-64; a leased poller makes several per message).
inline int PollNow(pollfd* fds, nfds_t n) {
  if constexpr (!kPlain) return ::poll(fds, n, 0);
#ifdef SYS_poll
  return static_cast<int>(syscall(SYS_poll, fds, n, 0));
#else
  static const timespec kNow{0, 0};
  return static_cast<int>(syscall(SYS_ppoll, fds, n, &kNow, nullptr, size_t{_NSIG / 8}));
#endif
}

}  // namespace softrdma::sys
