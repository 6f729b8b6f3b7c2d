// librdmacm.so.1: the rsocket calls (rsocket(7)). Not built yet: every call fails with ENOSYS so
// that programs linking librdmacm load and report a clear error (issue 3, step 5).
#include <rdma/rsocket.h>

#include <cerrno>

#include "abi/export.h"

namespace {

template <typename T = int>
T NotYet() {
  errno = ENOSYS;
  return static_cast<T>(-1);
}

}  // namespace

SOFTRDMA_EXPORT int rsocket(int, int, int) {
  return NotYet();
}
SOFTRDMA_EXPORT int rbind(int, const sockaddr*, socklen_t) {
  return NotYet();
}
SOFTRDMA_EXPORT int rlisten(int, int) {
  return NotYet();
}
SOFTRDMA_EXPORT int raccept(int, sockaddr*, socklen_t*) {
  return NotYet();
}
SOFTRDMA_EXPORT int rconnect(int, const sockaddr*, socklen_t) {
  return NotYet();
}
SOFTRDMA_EXPORT int rshutdown(int, int) {
  return NotYet();
}
SOFTRDMA_EXPORT int rclose(int) {
  return NotYet();
}
SOFTRDMA_EXPORT ssize_t rrecv(int, void*, size_t, int) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rrecvmsg(int, msghdr*, int) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rsend(int, const void*, size_t, int) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rsendmsg(int, const msghdr*, int) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rread(int, void*, size_t) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rreadv(int, const iovec*, int) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rwrite(int, const void*, size_t) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rwritev(int, const iovec*, int) {
  return NotYet<ssize_t>();
}
SOFTRDMA_EXPORT int rpoll(pollfd*, nfds_t, int) {
  return NotYet();
}
SOFTRDMA_EXPORT int rselect(int, fd_set*, fd_set*, fd_set*, timeval*) {
  return NotYet();
}
SOFTRDMA_EXPORT int rgetpeername(int, sockaddr*, socklen_t*) {
  return NotYet();
}
SOFTRDMA_EXPORT int rgetsockname(int, sockaddr*, socklen_t*) {
  return NotYet();
}
SOFTRDMA_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) {
  return NotYet();
}
SOFTRDMA_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) {
  return NotYet();
}
SOFTRDMA_EXPORT int rfcntl(int, int, ...) {
  return NotYet();
}
SOFTRDMA_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) {
  return NotYet<off_t>();
}
SOFTRDMA_EXPORT int riounmap(int, void*, size_t) {
  return NotYet();
}
SOFTRDMA_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) {
  return NotYet<size_t>();
}
