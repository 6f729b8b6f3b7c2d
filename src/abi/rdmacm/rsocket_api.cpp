// librdmacm.so.1: the rsocket calls (rsocket(7)). Argument translation only: the sockets live in
// src/rsocket. Each call returns what the socket call it mirrors returns, with errno set.
#include <rdma/rsocket.h>

#include <cerrno>
#include <cstdarg>
#include <memory>

#include "abi/export.h"
#include "rsocket/create.h"
#include "rsocket/fd_table.h"
#include "rsocket/poll.h"

namespace rs = softrdma::rsocket;

namespace {

template <typename T>
T Result(T r) {
  if (r < 0) {
    errno = static_cast<int>(-r);
    return static_cast<T>(-1);
  }
  return r;
}

// Runs op on the socket behind fd, or fails with EBADF / ENOTSOCK.
template <typename T, typename Op>
T With(int fd, Op op) {
  int err = 0;
  std::shared_ptr<rs::Socket> s = rs::FindSocket(fd, &err);
  if (!s) {
    errno = err;
    return static_cast<T>(-1);
  }
  return Result<T>(op(*s));
}

// A msghdr the message calls can use; errno as sendmsg/recvmsg set it otherwise.
bool ValidMsg(const msghdr* msg) {
  if (!msg) {
    errno = EFAULT;
    return false;
  }
  if (msg->msg_iovlen > IOV_MAX) {
    errno = EMSGSIZE;
    return false;
  }
  return true;
}

}  // namespace

SOFTRDMA_EXPORT int rsocket(int domain, int type, int protocol) {
  return Result(rs::Create(domain, type, protocol));
}
SOFTRDMA_EXPORT int rbind(int socket, const sockaddr* addr, socklen_t addrlen) {
  return With<int>(socket, [&](rs::Socket& s) { return s.Bind(addr, addrlen); });
}
SOFTRDMA_EXPORT int rlisten(int socket, int backlog) {
  return With<int>(socket, [&](rs::Socket& s) { return s.Listen(backlog); });
}
SOFTRDMA_EXPORT int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  return With<int>(socket, [&](rs::Socket& s) { return s.Accept(addr, addrlen); });
}
SOFTRDMA_EXPORT int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  return With<int>(socket, [&](rs::Socket& s) { return s.Connect(addr, addrlen); });
}
SOFTRDMA_EXPORT int rshutdown(int socket, int how) {
  return With<int>(socket, [&](rs::Socket& s) { return s.Shutdown(how); });
}
SOFTRDMA_EXPORT int rclose(int socket) {
  return Result(rs::Destroy(socket));
}

SOFTRDMA_EXPORT ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  iovec iov{buf, len};
  return With<ssize_t>(socket,
                       [&](rs::Socket& s) { return s.Recv(&iov, 1, flags, nullptr, nullptr); });
}
SOFTRDMA_EXPORT ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr,
                                  socklen_t* addrlen) {
  iovec iov{buf, len};
  return With<ssize_t>(socket,
                       [&](rs::Socket& s) { return s.Recv(&iov, 1, flags, src_addr, addrlen); });
}
SOFTRDMA_EXPORT ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  if (!ValidMsg(msg)) return -1;
  return With<ssize_t>(socket, [&](rs::Socket& s) {
    sockaddr* from = static_cast<sockaddr*>(msg->msg_name);
    socklen_t* fromlen = from ? &msg->msg_namelen : nullptr;
    msg->msg_flags = 0;
    msg->msg_controllen = 0;
    return s.Recv(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags, from, fromlen);
  });
}
SOFTRDMA_EXPORT ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  iovec iov{const_cast<void*>(buf), len};
  return With<ssize_t>(socket, [&](rs::Socket& s) { return s.Send(&iov, 1, flags, nullptr, 0); });
}
SOFTRDMA_EXPORT ssize_t rsendto(int socket, const void* buf, size_t len, int flags,
                                const sockaddr* dest_addr, socklen_t addrlen) {
  iovec iov{const_cast<void*>(buf), len};
  return With<ssize_t>(socket,
                       [&](rs::Socket& s) { return s.Send(&iov, 1, flags, dest_addr, addrlen); });
}
SOFTRDMA_EXPORT ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  if (!ValidMsg(msg)) return -1;
  return With<ssize_t>(socket, [&](rs::Socket& s) {
    return s.Send(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                  static_cast<const sockaddr*>(msg->msg_name), msg->msg_namelen);
  });
}
SOFTRDMA_EXPORT ssize_t rread(int socket, void* buf, size_t count) {
  return rrecv(socket, buf, count, 0);
}
SOFTRDMA_EXPORT ssize_t rreadv(int socket, const iovec* iov, int iovcnt) {
  if (iovcnt < 0 || iovcnt > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  return With<ssize_t>(socket,
                       [&](rs::Socket& s) { return s.Recv(iov, iovcnt, 0, nullptr, nullptr); });
}
SOFTRDMA_EXPORT ssize_t rwrite(int socket, const void* buf, size_t count) {
  return rsend(socket, buf, count, 0);
}
SOFTRDMA_EXPORT ssize_t rwritev(int socket, const iovec* iov, int iovcnt) {
  if (iovcnt < 0 || iovcnt > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  return With<ssize_t>(socket, [&](rs::Socket& s) { return s.Send(iov, iovcnt, 0, nullptr, 0); });
}

SOFTRDMA_EXPORT int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  return Result(rs::Poll(fds, nfds, timeout));
}
SOFTRDMA_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds,
                            timeval* timeout) {
  return Result(rs::Select(nfds, readfds, writefds, exceptfds, timeout));
}

SOFTRDMA_EXPORT int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) {
  return With<int>(socket, [&](rs::Socket& s) { return s.GetPeerName(addr, addrlen); });
}
SOFTRDMA_EXPORT int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) {
  return With<int>(socket, [&](rs::Socket& s) { return s.GetSockName(addr, addrlen); });
}
SOFTRDMA_EXPORT int rsetsockopt(int socket, int level, int optname, const void* optval,
                                socklen_t optlen) {
  return With<int>(socket,
                   [&](rs::Socket& s) { return s.SetSockOpt(level, optname, optval, optlen); });
}
SOFTRDMA_EXPORT int rgetsockopt(int socket, int level, int optname, void* optval,
                                socklen_t* optlen) {
  return With<int>(socket,
                   [&](rs::Socket& s) { return s.GetSockOpt(level, optname, optval, optlen); });
}
SOFTRDMA_EXPORT int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = cmd == F_SETFL ? va_arg(ap, long) : 0;
  va_end(ap);
  return With<int>(socket, [&](rs::Socket& s) { return s.Fcntl(cmd, arg); });
}

SOFTRDMA_EXPORT off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  return With<off_t>(socket, [&](rs::Socket& s) { return s.IoMap(buf, len, prot, flags, offset); });
}
SOFTRDMA_EXPORT int riounmap(int socket, void* buf, size_t len) {
  return With<int>(socket, [&](rs::Socket& s) { return s.IoUnmap(buf, len); });
}
// Declared size_t by rsocket.h; returns (size_t)-1 with errno on failure, as upstream does.
SOFTRDMA_EXPORT size_t riowrite(int socket, const void* buf, size_t count, off_t offset,
                                int flags) {
  return static_cast<size_t>(
      With<ssize_t>(socket, [&](rs::Socket& s) { return s.IoWrite(buf, count, offset, flags); }));
}
