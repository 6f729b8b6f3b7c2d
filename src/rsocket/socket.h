// rsockets (rsocket(7)): the socket object behind every rsocket fd. Built only on the public verbs
// and rdma_cm APIs. Each socket owns a real file descriptor (an eventfd) that names it in the
// process, so programs can mix rsockets and ordinary fds in rpoll/rselect.
//
// Conventions: every method returns a value >= 0 on success or -errno, and the extern "C" layer
// (abi/rdmacm/rsocket_api.cpp) turns that into -1/errno. One mutex per socket guards its state;
// blocking waits release it while they sleep in poll().
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

struct rdma_cm_id;

namespace softrdma::rsocket {

// Tunables an application sets with rsetsockopt before connecting.
struct Options {
  uint32_t sndbuf = 256 * 1024;
  uint32_t rcvbuf = 256 * 1024;
  uint32_t sq_size = 384;
  uint32_t rq_size = 384;
  uint32_t inline_size = 64;
  uint32_t iomap_size = 0;
  bool reuseaddr = false;
  bool keepalive = false;
  bool nodelay = false;
  bool oobinline = false;
  // IPV6_V6ONLY: an AF_INET6 socket bound to the wildcard also takes IPv4 peers unless set, as
  // Linux does by default (net.ipv6.bindv6only 0).
  bool v6only = false;
  int keepidle = 7200;
  // TCP_KEEPCNT, TCP_KEEPINTVL: kept for getsockopt only, as SO_KEEPALIVE and TCP_KEEPIDLE are
  // (no keepalive probes: docs/rsocket.md).
  int keepcnt = 9;
  int keepintvl = 75;
  ::linger linger{};
};

class Socket {
 public:
  Socket(int family, int type);
  virtual ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // The eventfd naming the socket; < 0 if creation failed.
  int fd() const { return fd_; }
  int type() const { return type_; }
  int family() const { return family_; }

  virtual int Bind(const sockaddr* addr, socklen_t len) = 0;
  virtual int Listen(int backlog);
  // Returns the new socket's fd.
  virtual int Accept(sockaddr* addr, socklen_t* len);
  virtual int Connect(const sockaddr* addr, socklen_t len) = 0;
  virtual ssize_t Recv(const iovec* iov, int iovcnt, int flags, sockaddr* from,
                       socklen_t* fromlen) = 0;
  virtual ssize_t Send(const iovec* iov, int iovcnt, int flags, const sockaddr* to,
                       socklen_t tolen) = 0;
  virtual int Shutdown(int how) = 0;
  // Releases every resource; the socket is already out of the fd table.
  virtual void Close() = 0;
  virtual int GetSockName(sockaddr* addr, socklen_t* len) = 0;
  virtual int GetPeerName(sockaddr* addr, socklen_t* len) = 0;

  int SetSockOpt(int level, int name, const void* val, socklen_t len);
  int GetSockOpt(int level, int name, void* val, socklen_t* len);
  int Fcntl(int cmd, long arg);

  virtual off_t IoMap(void* buf, size_t len, int prot, int flags, off_t offset);
  virtual int IoUnmap(void* buf, size_t len);
  virtual ssize_t IoWrite(const void* buf, size_t count, off_t offset, int flags);

  // rpoll support. Readiness makes non-blocking progress and returns the ready events (POLLERR
  // and POLLHUP always count). Arm requests wake-ups and appends the fds to sleep on; it returns
  // false instead when it found news while arming (then look at Readiness again, do not sleep).
  virtual short Readiness(short events) = 0;
  virtual bool Arm(std::vector<pollfd>* fds) = 0;

 protected:
  bool NonBlocking(int msg_flags) const {
    return (file_flags_ & O_NONBLOCK) || (msg_flags & MSG_DONTWAIT);
  }
  // Options applied to a socket that is already connected (most only matter before).
  virtual int OnSetOption(int level, int name, const void* val, socklen_t len);
  // Whether the socket has its local address (bound, listening, connecting or connected): then
  // IPV6_V6ONLY can no longer change, as for a kernel socket.
  virtual bool AddressFixedLocked() const = 0;
  // Whether it is a connected stream (TCP_INFO's state).
  virtual bool ConnectedLocked() const { return false; }
  // Gives id the options that decide how it binds (SO_REUSEADDR, IPV6_V6ONLY); before
  // rdma_bind_addr.
  void ApplyBindOptionsLocked(rdma_cm_id* id) const;
  // Consumes SO_ERROR.
  virtual int TakeError();

  std::mutex mu_;
  Options opts_;
  int fd_ = -1;
  int family_;
  int type_;
  int file_flags_ = O_RDWR;
  int so_error_ = 0;
};

// Copies an address out as getsockname(2) does: truncates to *len and reports the full size.
void CopyAddrOut(const sockaddr* src, socklen_t src_len, sockaddr* dst, socklen_t* len);
socklen_t AddrLen(const sockaddr* addr);

// Waits for any of fds (poll(2) semantics) until deadline; returns poll's result or -errno.
int PollUntil(std::vector<pollfd>* fds, std::chrono::steady_clock::time_point deadline,
              bool forever);

}  // namespace softrdma::rsocket
