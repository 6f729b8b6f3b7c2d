// IP addresses as the connection manager handles them: one type for IPv4 and IPv6 (IPv4 held as
// ::ffff:a.b.c.d), conversions to and from sockaddr, and the questions the CM asks of them
// (is it this namespace's, which local address routes to it).
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>
#include <vector>

#include "cm/cm_wire.h"

namespace softrdma::cm {

// false for families other than AF_INET/AF_INET6.
bool FromSockaddr(const sockaddr* sa, Addr* out);
void ToSockaddr(const Addr& a, sockaddr_storage* out);
socklen_t SockaddrLen(const Addr& a);
std::string IpText(const Addr& a);

bool IsAnyIp(const Addr& a);
bool IsLoopbackIp(const Addr& a);
bool SameIp(const Addr& a, const Addr& b);

// Every address of this network namespace's interfaces that are up, loopback included.
std::vector<Addr> LocalIps();
bool IsLocalIp(const Addr& a);
// The local address the kernel would send from to reach `dst`; nullopt when there is no route.
std::optional<Addr> RouteSource(const Addr& dst);

}  // namespace softrdma::cm
