// How the TCP link sets up the sockets of its connections.
#pragma once

#include <cstdint>

namespace softrdma::link {

// The congestion control of connections that stay on this host's loopback device: Reno, the
// kernel's own and cheapest, allowed to every user. On loopback nothing is ever lost or queued for
// a congestion controller to react to, yet each segment runs its hooks, inside the socket's lock
// that the receiver then waits for: the system's default (BBR here, CUBIC on Debian) cost TCP
// ib_write_lat 2 B 3-4 % against Reno (3.49-3.61 us against 3.36-3.50).
inline constexpr char kLoopbackCongestionControl[] = "reno";

// Whether a connection from `self_ip` to `peer_ip` (IPv4, host order) stays on the loopback
// device: a peer in 127.0.0.0/8, or the very address the connection leaves from.
bool StaysOnLoopback(uint32_t self_ip, uint32_t peer_ip);

// TCP_NODELAY, and kLoopbackCongestionControl when the connection stays on loopback. `fd` is
// connected or connecting (its own address is bound); `peer_ip` is where it goes, host order.
// Options the kernel refuses are left at their defaults: they change speed, not behaviour.
void TuneSocket(int fd, uint32_t peer_ip);

}  // namespace softrdma::link
