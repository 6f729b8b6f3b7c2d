// Reaching the CM of a process whose run directory is out of sight: on another host, or in a
// container with a /dev/shm of its own (docs/architecture.md §11, "Other hosts").
//
// Processes that share a run directory find each other's listeners there (registry.h). For the
// others, the port of a listening id is a TCP port: each listener also listens with a TCP socket
// on its own address and port (its rendezvous), which the CM service serves like its own port. A
// connecting process that finds no listener in the run directory connects there. Resolving an
// address no process of this host owns tries the same port, in place of the ARP request a real CM
// sends: a CM that greets back, or a host that refuses, answers; silence until the caller's
// timeout is ADDR_ERROR, as before. (A connection alone is no answer: a proxy that intercepts
// every connect of a sandbox accepted one to a TEST-NET address.)
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cm/cm.h"
#include "cm/ip_address.h"
#include "core/log.h"
#include "link/own_socket.h"

namespace softrdma::cm {

namespace {

// A rendezvous socket's backlog: connections are taken at once by the service thread, which
// then hands each to the listener the REQ names (and applies that listener's backlog).
constexpr int kRendezvousBacklog = 128;

// An id's own service fd (its rendezvous, its probe): watched by the service's epoll under `tag`
// (| the fd), found by its number in `by_fd`, and held in `*held`.
void Watch(int epoll_fd, int fd, uint32_t events, uint64_t tag, CmId* id,
           std::map<int, CmId*>* by_fd, int* held) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag | static_cast<uint64_t>(fd);
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  (*by_fd)[fd] = id;
  *held = fd;
}

// Stops watching the fd in `*held` and hands it over (-1: none).
int Unwatch(int epoll_fd, std::map<int, CmId*>* by_fd, int* held) {
  const int fd = *held;
  if (fd < 0) return -1;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  by_fd->erase(fd);
  *held = -1;
  return fd;
}

}  // namespace

void Cm::OpenRendezvous(CmId* id) {
  if (id->rendezvous_fd >= 0 || !StartService()) return;
  sockaddr_storage ss;
  ToSockaddr(id->src, &ss);
  int fd = sys::OwnSocket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ss.ss_family == AF_INET6) {
    int only = id->afonly;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof only);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), SockaddrLen(id->src)) != 0 ||
      listen(fd, kRendezvousBacklog) != 0) {
    const int err = errno;
    // The port is a TCP program's (or another port space's listener's): this one stays
    // reachable through the run directory only.
    SOFTRDMA_LOG(
        "cm: TCP port %u on %s is taken (%s); only processes of this run directory reach the "
        "listener",
        id->src.port, IpText(id->src).c_str(), strerror(err));
    close(fd);
    return;
  }
  Watch(epoll_fd_, fd, EPOLLIN, kRendezvousTag, id, &rendezvous_, &id->rendezvous_fd);
}

void Cm::CloseRendezvous(CmId* id) {
  if (int fd = Unwatch(epoll_fd_, &rendezvous_, &id->rendezvous_fd); fd >= 0) close(fd);
}

void Cm::AcceptRendezvous(int fd) {
  if (!rendezvous_.count(fd)) return;  // closed earlier in this batch of events
  for (;;) {
    int c = accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;
    }
    AddPeer(c, "");
  }
}

std::optional<ServiceAddr> Cm::RendezvousOf(const Addr& dst) {
  if (dst.port == 0) return std::nullopt;
  ServiceAddr s;
  s.ip = dst;
  s.port = dst.port;
  return s;
}

void Cm::StartProbe(CmId* id) {
  CancelProbe(id);
  if (id->dst.port == 0 || !StartService()) return;
  sockaddr_storage ss;
  ToSockaddr(id->dst, &ss);
  int fd = sys::OwnSocket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), SockaddrLen(id->dst)) != 0 &&
      errno != EINPROGRESS) {
    const bool refused = errno == ECONNREFUSED;
    close(fd);
    if (refused) ProbeAnswered(id);  // otherwise no way there: the timer says so
    return;
  }
  Watch(epoll_fd_, fd, EPOLLOUT, kProbeTag, id, &probes_, &id->probe_fd);
}

void Cm::CancelProbe(CmId* id) {
  if (id->probe_peer) {
    id->probe_peer->probing.erase(id);
    id->probe_peer = nullptr;
  }
  if (int fd = Unwatch(epoll_fd_, &probes_, &id->probe_fd); fd >= 0) close(fd);
}

void Cm::OnProbeDone(int fd) {
  auto it = probes_.find(fd);
  if (it == probes_.end()) return;
  // The event may be for an earlier use of the number in this batch: only a finished connect
  // counts.
  pollfd out{fd, POLLOUT, 0};
  if (poll(&out, 1, 0) != 1) return;
  CmId* id = it->second;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  Unwatch(epoll_fd_, &probes_, &id->probe_fd);
  if (err != 0) {
    close(fd);
    if (err == ECONNREFUSED) ProbeAnswered(id);  // the host is there, nobody listens yet
    // Otherwise no answer: ADDR_ERROR when the caller's timeout runs out, as for silence.
    return;
  }
  // Connected: a CM answers by its Hello; the channel then serves the connect that follows.
  Peer* p = AdoptChannel(fd, IpText(id->dst) + ":" + std::to_string(id->dst.port));
  if (p->hello_seen) {
    ProbeAnswered(id);
  } else {
    p->probing.insert(id);
    id->probe_peer = p;
  }
}

// At a channel's Hello, the ids waiting for it are resolved; at its loss before one, they are left
// to their timeout.
void Cm::SettleProbes(Peer* p) {
  std::set<CmId*> ids;
  ids.swap(p->probing);
  for (CmId* id : ids) {
    id->probe_peer = nullptr;
    if (p->hello_seen) ProbeAnswered(id);
  }
}

void Cm::ProbeAnswered(CmId* id) {
  if (id->timer != TimerKind::kAddrError) return;  // the timeout came first
  Disarm(id);
  id->state = IdState::kAddrResolved;
  Report(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0, nullptr);
}

}  // namespace softrdma::cm
