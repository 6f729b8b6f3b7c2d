#include "cm/ip_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include "link/own_socket.h"

namespace softrdma::cm {

namespace {

constexpr uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

}  // namespace

bool FromSockaddr(const sockaddr* sa, Addr* out) {
  if (!sa) return false;
  *out = Addr{};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    out->family = 4;
    out->port = ntohs(in->sin_port);
    std::memcpy(out->ip, kV4Mapped, 12);
    std::memcpy(out->ip + 12, &in->sin_addr, 4);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    out->family = 6;
    out->port = ntohs(in6->sin6_port);
    std::memcpy(out->ip, &in6->sin6_addr, 16);
    return true;
  }
  return false;
}

void ToSockaddr(const Addr& a, sockaddr_storage* out) {
  std::memset(out, 0, sizeof *out);
  if (a.family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(a.port);
    std::memcpy(&in->sin_addr, a.ip + 12, 4);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(a.port);
    std::memcpy(&in6->sin6_addr, a.ip, 16);
  }
}

socklen_t SockaddrLen(const Addr& a) {
  return a.family == 4 ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

std::string IpText(const Addr& a) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.family == 4) {
    inet_ntop(AF_INET, a.ip + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, a.ip, buf, sizeof buf);
  }
  return buf;
}

bool IsAnyIp(const Addr& a) {
  if (a.family == 4) return std::memcmp(a.ip + 12, "\0\0\0\0", 4) == 0;
  static const uint8_t kZero[16] = {};
  return std::memcmp(a.ip, kZero, 16) == 0;
}

bool IsLoopbackIp(const Addr& a) {
  if (a.family == 4) return a.ip[12] == 127;
  static const uint8_t kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(a.ip, kLoop6, 16) == 0 ||
         (std::memcmp(a.ip, kV4Mapped, 12) == 0 && a.ip[12] == 127);
}

bool SameIp(const Addr& a, const Addr& b) {
  return std::memcmp(a.ip, b.ip, 16) == 0;
}

std::vector<Addr> LocalIps() {
  std::vector<Addr> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    Addr a;
    if (FromSockaddr(i->ifa_addr, &a)) out.push_back(a);
  }
  freeifaddrs(list);
  return out;
}

bool IsLocalIp(const Addr& a) {
  if (IsLoopbackIp(a)) return true;
  for (const Addr& l : LocalIps()) {
    if (SameIp(l, a)) return true;
  }
  return false;
}

std::optional<Addr> RouteSource(const Addr& dst) {
  sockaddr_storage ss;
  ToSockaddr(dst, &ss);
  reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(9);  // any non-zero port
  int fd = sys::OwnSocket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::optional<Addr> out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), SockaddrLen(dst)) == 0) {
    sockaddr_storage local;
    socklen_t len = sizeof local;
    Addr a;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        FromSockaddr(reinterpret_cast<sockaddr*>(&local), &a)) {
      a.port = 0;
      out = a;
    }
  }
  close(fd);
  return out;
}

}  // namespace softrdma::cm
