// The CM service: one TCP listening socket per process that uses the CM, channels to other
// processes' services, and a thread that reads them and runs the CM timers.
//
// A channel carries the messages of every connection between the two processes; it starts with
// a Hello each way. A message that fails validation, or a channel that closes, is handled as the
// loss of that peer: its connections see DISCONNECTED (or their connect fails), and nothing else
// is affected.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cm/cm.h"
#include "cm/ip_address.h"
#include "core/log.h"
#include "link/own_socket.h"
#include "link/running_thread.h"

namespace softrdma::cm {

namespace {

constexpr int kConnectTimeoutMs = 2000;
constexpr size_t kReadChunk = 16384;

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

bool Cm::StartService() {
  if (started_) return true;
  int fd = sys::OwnSocket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    // No IPv6 in this namespace: IPv4 alone.
    fd = sys::OwnSocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      return false;
    }
  }
  sockaddr_storage local;
  socklen_t len = sizeof local;
  if (listen(fd, 1024) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    close(fd);
    return false;
  }
  Addr la;
  FromSockaddr(reinterpret_cast<sockaddr*>(&local), &la);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    close(fd);
    return false;
  }
  listen_fd_ = fd;
  service_port_ = la.port;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kWakeTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  started_ = true;
  thread_ = link::StartRunningThread([this] { Run(); });
  thread_.detach();
  SOFTRDMA_LOG("cm: service on port %u", service_port_);
  return true;
}

void Cm::Wake() {
  uint64_t one = 1;
  ssize_t r = write(wake_fd_, &one, sizeof one);
  (void)r;
}

Peer* Cm::PeerFor(const ServiceAddr& s, std::unique_lock<std::mutex>* lk) {
  std::string key = IpText(s.ip) + ":" + std::to_string(s.port);
  if (auto it = peers_by_key_.find(key); it != peers_by_key_.end()) return it->second;
  if (lk) lk->unlock();
  sockaddr_storage ss;
  ToSockaddr(s.ip, &ss);
  reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(s.port);
  int fd = sys::OwnSocket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0;
  if (ok && connect(fd, reinterpret_cast<sockaddr*>(&ss), SockaddrLen(s.ip)) != 0) {
    ok = errno == EINPROGRESS;
    if (ok) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t el = sizeof err;
      ok = poll(&p, 1, kConnectTimeoutMs) == 1 &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0;
    }
  }
  if (lk) lk->lock();
  if (!ok) {
    if (fd >= 0) close(fd);
    SOFTRDMA_LOG("cm: cannot reach CM service %s", key.c_str());
    return nullptr;
  }
  return AdoptChannel(fd, key);  // another thread may have connected meanwhile
}

Peer* Cm::AdoptChannel(int fd, const std::string& key) {
  if (auto it = peers_by_key_.find(key); it != peers_by_key_.end()) {
    close(fd);
    return it->second;
  }
  return peers_by_key_[key] = AddPeer(fd, key);
}

// A new channel, either way: watched for input, greeted, and given kHelloTimeoutMs to greet back.
Peer* Cm::AddPeer(int fd, std::string key) {
  SetNoDelay(fd);
  auto* p = new Peer;
  p->fd = fd;
  p->key = std::move(key);
  p->hello_deadline_ns = NowNs() + kHelloTimeoutMs * 1000000ull;
  peers_.insert(p);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = p;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  Send(p, EncodeHello());
  return p;
}

// Whether the service thread waits for room in the socket (while `p->tx` holds bytes).
void Cm::WatchOutput(Peer* p, bool want) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want ? uint32_t{EPOLLOUT} : 0u);
  ev.data.ptr = p;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, p->fd, &ev);
}

void Cm::Send(Peer* p, const std::vector<uint8_t>& msg) {
  if (p->fd < 0) return;
  size_t off = 0;
  if (p->tx.empty()) {
    while (off < msg.size()) {
      ssize_t n = send(p->fd, msg.data() + off, msg.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        // Broken: the service thread sees the hang-up and handles the loss in one place.
        shutdown(p->fd, SHUT_RDWR);
        return;
      }
    }
  }
  if (off < msg.size()) {
    bool was_empty = p->tx.empty();
    p->tx.insert(p->tx.end(), msg.begin() + static_cast<ptrdiff_t>(off), msg.end());
    if (was_empty) WatchOutput(p, true);
  }
}

void Cm::OnWritable(Peer* p) {
  while (!p->tx.empty()) {
    ssize_t n = send(p->fd, p->tx.data(), p->tx.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p->tx.erase(p->tx.begin(), p->tx.begin() + n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      ClosePeer(p);
      return;
    }
  }
  WatchOutput(p, false);
}

void Cm::ClosePeer(Peer* p) {
  if (p->fd < 0) return;
  SettleProbes(p);
  OnPeerLost(p);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p->fd, nullptr);
  close(p->fd);
  p->fd = -1;
  if (!p->key.empty()) peers_by_key_.erase(p->key);
  peers_.erase(p);
  graveyard_.push_back(p);
}

void Cm::OnReadable(Peer* p) {
  uint8_t buf[kReadChunk];
  for (;;) {
    ssize_t n = recv(p->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      ClosePeer(p);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      ClosePeer(p);
      return;
    }
    p->rx.insert(p->rx.end(), buf, buf + n);
    size_t off = 0;
    while (p->fd >= 0) {
      auto len = PeekLength(p->rx.data() + off, p->rx.size() - off);
      if (!len) {
        SOFTRDMA_LOG("cm: malformed message header from a peer; dropping its channel");
        ClosePeer(p);
        return;
      }
      if (*len == 0 || p->rx.size() - off < *len) break;
      auto m = Decode(p->rx.data() + off, *len);
      if (!m || (!p->hello_seen && m->type != MsgType::kHello) ||
          (p->hello_seen && m->type == MsgType::kHello)) {
        SOFTRDMA_LOG("cm: invalid message from a peer; dropping its channel");
        ClosePeer(p);
        return;
      }
      off += *len;
      if (m->type == MsgType::kHello) {
        p->hello_seen = true;
        SettleProbes(p);
      } else {
        OnMessage(p, *m);
      }
    }
    if (p->fd < 0) return;
    p->rx.erase(p->rx.begin(), p->rx.begin() + static_cast<ptrdiff_t>(off));
  }
}

void Cm::AcceptChannels() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN, or out of fds: the rest wait in the backlog
    }
    AddPeer(fd, "");
  }
}

void Cm::Arm(CmId* id, TimerKind kind, uint64_t ms, int status) {
  id->timer = kind;
  id->timer_status = status;
  id->deadline_ns = NowNs() + ms * 1000000ull;
  timed_.insert(id);
  if (started_) {
    Wake();
  } else {
    StartService();
  }
}

void Cm::Disarm(CmId* id) {
  id->timer = TimerKind::kNone;
  timed_.erase(id);
}

void Cm::Run() {
  epoll_event events[64];
  for (;;) {
    int timeout = -1;
    {
      std::lock_guard<std::mutex> g(mu);
      for (Peer* p : graveyard_) delete p;
      graveyard_.clear();
      uint64_t now = NowNs();
      auto consider = [&](uint64_t deadline) {
        uint64_t left = deadline > now ? (deadline - now) / 1000000 + 1 : 0;
        if (timeout < 0 || left < static_cast<uint64_t>(timeout)) timeout = static_cast<int>(left);
      };
      for (CmId* id : timed_) consider(id->deadline_ns);
      for (Peer* p : peers_) {
        if (!p->hello_seen) consider(p->hello_deadline_ns);
      }
    }
    int n = epoll_wait(epoll_fd_, events, 64, timeout);
    std::lock_guard<std::mutex> g(mu);
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        AcceptChannels();
      } else if (tag == kWakeTag) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof v);
        (void)r;
      } else if (tag & kRendezvousTag) {
        AcceptRendezvous(static_cast<int>(tag & kFdMask));
      } else if (tag & kProbeTag) {
        OnProbeDone(static_cast<int>(tag & kFdMask));
      } else {
        auto* p = static_cast<Peer*>(events[i].data.ptr);
        if (p->fd < 0) continue;
        if (events[i].events & EPOLLOUT) OnWritable(p);
        if (p->fd >= 0 && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
          OnReadable(p);
        }
      }
    }
    uint64_t now = NowNs();
    std::vector<CmId*> due;
    for (CmId* id : timed_) {
      if (id->deadline_ns <= now) due.push_back(id);
    }
    for (CmId* id : due) {
      if (timed_.count(id)) OnTimer(id);
    }
    std::vector<Peer*> silent;
    for (Peer* p : peers_) {
      if (!p->hello_seen && p->hello_deadline_ns <= now) silent.push_back(p);
    }
    for (Peer* p : silent) {
      SOFTRDMA_LOG("cm: a channel sent no Hello in %llu ms; closing it",
                   static_cast<unsigned long long>(kHelloTimeoutMs));
      ClosePeer(p);
    }
  }
}

}  // namespace softrdma::cm
