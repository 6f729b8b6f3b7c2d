// What every rsocket shares: the naming eventfd, socket options, fcntl, address copies, waits.
#include "rsocket/socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softrdma::rsocket {
namespace {

// The port's active MTU, the segment size rdma-core's rsockets report for a path of it. (iperf3
// calls a TCP_MAXSEG larger than a UDP datagram, as 65536 was, nonsense.)
constexpr int kPathMtu = 4096;

int ReadInt(const void* val, socklen_t len, int* out) {
  if (!val) return -EFAULT;
  if (len < static_cast<socklen_t>(sizeof(int))) return -EINVAL;
  std::memcpy(out, val, sizeof(int));
  return 0;
}

int WriteInt(int v, void* val, socklen_t* len) {
  if (!val || !len) return -EFAULT;
  if (*len < static_cast<socklen_t>(sizeof(int))) return -EINVAL;
  std::memcpy(val, &v, sizeof v);
  *len = sizeof v;
  return 0;
}

// Queue sizes and buffers: at least a small working minimum, at most what a ring index allows.
uint32_t Clamp(int v, uint32_t lo, uint32_t hi) {
  if (v < 0) return lo;
  return std::clamp(static_cast<uint32_t>(v), lo, hi);
}

}  // namespace

Socket::Socket(int family, int type) : family_(family), type_(type) {
  fd_ = eventfd(0, EFD_CLOEXEC);
}

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

int Socket::Listen(int) {
  return -EOPNOTSUPP;
}
int Socket::Accept(sockaddr*, socklen_t*) {
  return -EOPNOTSUPP;
}
off_t Socket::IoMap(void*, size_t, int, int, off_t) {
  return -EOPNOTSUPP;
}
int Socket::IoUnmap(void*, size_t) {
  return -EOPNOTSUPP;
}
ssize_t Socket::IoWrite(const void*, size_t, off_t, int) {
  return -EOPNOTSUPP;
}
int Socket::OnSetOption(int, int, const void*, socklen_t) {
  return 0;
}

int Socket::TakeError() {
  int e = so_error_;
  so_error_ = 0;
  return e;
}

int Socket::SetSockOpt(int level, int name, const void* val, socklen_t len) {
  std::unique_lock<std::mutex> lk(mu_);
  int v = 0;
  int r = 0;
  switch (level) {
    case SOL_SOCKET:
      switch (name) {
        case SO_REUSEADDR:
          if ((r = ReadInt(val, len, &v))) return r;
          opts_.reuseaddr = v != 0;
          break;
        case SO_KEEPALIVE:
          if ((r = ReadInt(val, len, &v))) return r;
          opts_.keepalive = v != 0;
          break;
        case SO_SNDBUF:
          if ((r = ReadInt(val, len, &v))) return r;
          opts_.sndbuf = Clamp(v, 4096, 1u << 28);
          break;
        case SO_RCVBUF:
          if ((r = ReadInt(val, len, &v))) return r;
          opts_.rcvbuf = Clamp(v, 4096, 1u << 28);
          break;
        case SO_LINGER:
          if (!val) return -EFAULT;
          if (len < static_cast<socklen_t>(sizeof(::linger))) return -EINVAL;
          std::memcpy(&opts_.linger, val, sizeof(::linger));
          break;
        case SO_OOBINLINE:
          if ((r = ReadInt(val, len, &v))) return r;
          opts_.oobinline = v != 0;
          break;
        default:
          return -ENOPROTOOPT;
      }
      break;
    case IPPROTO_IPV6:
      if (family_ != AF_INET6 || name != IPV6_V6ONLY) return -ENOPROTOOPT;
      if ((r = ReadInt(val, len, &v))) return r;
      if (AddressFixedLocked()) return -EINVAL;
      opts_.v6only = v != 0;
      break;
    case IPPROTO_TCP:
      if (type_ != SOCK_STREAM) return -ENOPROTOOPT;
      switch (name) {
        case TCP_NODELAY:
          if ((r = ReadInt(val, len, &v))) return r;
          opts_.nodelay = v != 0;
          break;
        case TCP_MAXSEG:
          if ((r = ReadInt(val, len, &v))) return r;
          if (v < 0) return -EINVAL;
          break;
        case TCP_KEEPIDLE:
          if ((r = ReadInt(val, len, &v))) return r;
          if (v < 1) return -EINVAL;
          opts_.keepidle = v;
          break;
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
          if ((r = ReadInt(val, len, &v))) return r;
          if (v < 1) return -EINVAL;
          (name == TCP_KEEPCNT ? opts_.keepcnt : opts_.keepintvl) = v;
          break;
        default:
          return -ENOPROTOOPT;
      }
      break;
    case SOL_RDMA:
      if (name == RDMA_ROUTE) {
        if (!val && len) return -EFAULT;
        break;  // routes are resolved by our CM; a supplied path is accepted and not needed
      }
      if ((r = ReadInt(val, len, &v))) return r;
      switch (name) {
        case RDMA_SQSIZE:
          opts_.sq_size = Clamp(v, 16, 16384);
          break;
        case RDMA_RQSIZE:
          opts_.rq_size = Clamp(v, 16, 16384);
          break;
        case RDMA_INLINE:
          opts_.inline_size = Clamp(v, 0, 1024);
          break;
        case RDMA_IOMAPSIZE:
          opts_.iomap_size = Clamp(v, 0, 1u << 16);
          break;
        default:
          return -ENOPROTOOPT;
      }
      break;
    default:
      return -ENOPROTOOPT;
  }
  return OnSetOption(level, name, val, len);
}

int Socket::GetSockOpt(int level, int name, void* val, socklen_t* len) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!val || !len) return -EFAULT;
  switch (level) {
    case SOL_SOCKET:
      switch (name) {
        case SO_REUSEADDR:
          return WriteInt(opts_.reuseaddr, val, len);
        case SO_KEEPALIVE:
          return WriteInt(opts_.keepalive, val, len);
        case SO_SNDBUF:
          return WriteInt(static_cast<int>(opts_.sndbuf), val, len);
        case SO_RCVBUF:
          return WriteInt(static_cast<int>(opts_.rcvbuf), val, len);
        case SO_ERROR:
          if (*len < static_cast<socklen_t>(sizeof(int))) return -EINVAL;
          return WriteInt(TakeError(), val, len);
        case SO_TYPE:
          return WriteInt(type_, val, len);
        case SO_OOBINLINE:
          return WriteInt(opts_.oobinline, val, len);
        case SO_LINGER: {
          socklen_t n = std::min<socklen_t>(*len, sizeof(::linger));
          std::memcpy(val, &opts_.linger, n);
          *len = n;
          return 0;
        }
        default:
          return -ENOPROTOOPT;
      }
    case IPPROTO_TCP:
      if (type_ != SOCK_STREAM) return -ENOPROTOOPT;
      switch (name) {
        case TCP_NODELAY:
          return WriteInt(opts_.nodelay, val, len);
        case TCP_MAXSEG:
          return WriteInt(kPathMtu, val, len);
        case TCP_INFO: {
          // What a monitor reads (iperf3, every interval): the state and the segment size. No
          // retransmission is ever counted: the connection below is reliable.
          tcp_info info{};
          info.tcpi_state = ConnectedLocked() ? TCP_ESTABLISHED : TCP_CLOSE;
          info.tcpi_snd_mss = info.tcpi_rcv_mss = kPathMtu;
          info.tcpi_snd_cwnd = opts_.sq_size;
          const socklen_t n = std::min<socklen_t>(*len, sizeof info);
          std::memcpy(val, &info, n);
          *len = n;
          return 0;
        }
        case TCP_KEEPIDLE:
          return WriteInt(opts_.keepidle, val, len);
        case TCP_KEEPCNT:
          return WriteInt(opts_.keepcnt, val, len);
        case TCP_KEEPINTVL:
          return WriteInt(opts_.keepintvl, val, len);
        default:
          return -ENOPROTOOPT;
      }
    case IPPROTO_IPV6:
      if (family_ != AF_INET6 || name != IPV6_V6ONLY) return -ENOPROTOOPT;
      return WriteInt(opts_.v6only, val, len);
    case SOL_RDMA:
      switch (name) {
        case RDMA_SQSIZE:
          return WriteInt(static_cast<int>(opts_.sq_size), val, len);
        case RDMA_RQSIZE:
          return WriteInt(static_cast<int>(opts_.rq_size), val, len);
        case RDMA_INLINE:
          return WriteInt(static_cast<int>(opts_.inline_size), val, len);
        case RDMA_IOMAPSIZE:
          return WriteInt(static_cast<int>(opts_.iomap_size), val, len);
        default:
          return -ENOPROTOOPT;
      }
    default:
      return -ENOPROTOOPT;
  }
}

void Socket::ApplyBindOptionsLocked(rdma_cm_id* id) const {
  int on = 1;
  if (opts_.reuseaddr)
    rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on);
  if (family_ != AF_INET6) return;
  int only = opts_.v6only;
  rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &only, sizeof only);
}

int Socket::Fcntl(int cmd, long arg) {
  std::lock_guard<std::mutex> g(mu_);
  switch (cmd) {
    case F_GETFL:
      return file_flags_;
    case F_SETFL:
      file_flags_ = (file_flags_ & ~O_NONBLOCK) | (static_cast<int>(arg) & O_NONBLOCK);
      return 0;
    default:
      return -ENOTSUP;
  }
}

socklen_t AddrLen(const sockaddr* addr) {
  if (!addr) return 0;
  switch (addr->sa_family) {
    case AF_INET:
      return sizeof(sockaddr_in);
    case AF_INET6:
      return sizeof(sockaddr_in6);
    default:
      return sizeof(sockaddr_storage);
  }
}

void CopyAddrOut(const sockaddr* src, socklen_t src_len, sockaddr* dst, socklen_t* len) {
  if (!dst || !len) return;
  std::memcpy(dst, src, std::min(*len, src_len));
  *len = src_len;
}

int PollUntil(std::vector<pollfd>* fds, std::chrono::steady_clock::time_point deadline,
              bool forever) {
  int timeout = -1;
  if (!forever) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    timeout = left.count() < 0 ? 0 : static_cast<int>(left.count());
  }
  int r = poll(fds->data(), fds->size(), timeout);
  return r < 0 ? -errno : r;
}

}  // namespace softrdma::rsocket
