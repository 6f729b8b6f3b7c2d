// Which process serves an (IP, port) in a port space, without a daemon (docs/architecture.md §8).
//
// A bound CM id with a port claims a file in <run dir>/cm named by its network namespace, port
// space, port and address; the claim is an flock() on the file, so a process that dies releases
// it. The file records the claimant's CM service port, whether it listens, and the addresses of
// its namespace, which is how a connecting process in another namespace of the host finds it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cm/cm_wire.h"

namespace softrdma::cm {

class PortClaim {
 public:
  PortClaim() = default;
  ~PortClaim();
  PortClaim(const PortClaim&) = delete;
  PortClaim& operator=(const PortClaim&) = delete;

  // 0, or EADDRINUSE when a live claim conflicts (same namespace, port space and port, and the
  // same address or a wildcard on either side, unless both ask to reuse the address).
  int Claim(uint16_t port_space, const Addr& addr, bool reuse);
  // Publishes that this process's CM is in this namespace (port space 0, port 0; never conflicts),
  // which is what KnownHost looks for.
  int ClaimPresence();
  // Publishes that the claimant listens, and where its CM service is reached.
  bool Publish(uint16_t service_port);
  bool held() const { return fd_ >= 0; }
  // Closes the claim without removing it: after fork(), the parent still holds it.
  void ForgetAfterFork();
  // In a fork()ed child: the files this process removes at exit are none of the parent's.
  static void ForgetHeldFilesAfterFork();

 private:
  std::string path_;
  int fd_ = -1;
  uint16_t port_space_ = 0;
  Addr addr_;
  bool reuse_ = false;
};

struct ServiceAddr {
  Addr ip;  // where to connect (this namespace: loopback)
  uint16_t port = 0;
  uint64_t netns = 0;
};

// The CM service of a listener for `dst` in `port_space`, as reached from this namespace.
std::optional<ServiceAddr> FindListener(uint16_t port_space, const Addr& dst);
// True when some live softrdma listener's namespace owns `ip` (the CM's stand-in for ARP).
bool KnownHost(const Addr& ip);

// A port for an id bound without one (rdma_bind_addr with port 0).
uint16_t EphemeralPort();

}  // namespace softrdma::cm
