#include "link/socket_tuning.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace softrdma::link {

bool StaysOnLoopback(uint32_t self_ip, uint32_t peer_ip) {
  return (peer_ip >> 24) == 127 || peer_ip == self_ip;
}

void TuneSocket(int fd, uint32_t peer_ip) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in self{};
  socklen_t len = sizeof self;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0 || self.sin_family != AF_INET)
    return;
  if (StaysOnLoopback(ntohl(self.sin_addr.s_addr), peer_ip))
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, kLoopbackCongestionControl,
               sizeof kLoopbackCongestionControl - 1);
}

}  // namespace softrdma::link
