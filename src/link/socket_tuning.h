// How the TCP link sets up the sockets of its connections.
#pragma once

#include <cstdint>

namespace softrdma::link {

// The congestion control of connections that stay on this host's loopback device: Reno, the
// kernel's own and cheapest, allowed to every user. On loopback nothing is ever lost or queued for
// a congestion controller to react to, yet each segment runs its hooks in the sender's softirq,
// partly under the socket lock the receiver waits for. TCP ib_write_lat 2 B with Reno,
// bench/ab_latency.sh: 0.963 of BBR's (this machine's default), 0.981 of CUBIC's (Debian's).
inline constexpr char kLoopbackCongestionControl[] = "reno";

// Whether a connection from `self_ip` to `peer_ip` (IPv4, host order) stays on the loopback
// device: a peer in 127.0.0.0/8, or the very address the connection leaves from.
bool StaysOnLoopback(uint32_t self_ip, uint32_t peer_ip);

// TCP_NODELAY, and kLoopbackCongestionControl when the connection stays on loopback. `fd` is
// connected or connecting (its own address is bound); `peer_ip` is where it goes, host order.
// Options the kernel refuses are left at their defaults: they change speed only.
void TuneSocket(int fd, uint32_t peer_ip);

}  // namespace softrdma::link
