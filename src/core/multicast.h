// Multicast groups across processes without a daemon (docs/architecture.md, "Multicast").
//
// A UD QP attached to a group (ibv_attach_mcast) is published as a file
// <run dir>/mcast/<mgid>-<qpn>, held with flock() for as long as it stays attached, so a process
// that dies leaves the group. A send to QPN 0xFFFFFF with a multicast GID goes as one copy to each
// member QP, which receives it as UD traffic with the group's GID in the GRH; since a QPN names its
// process (its slot), members in any namespace of the host are reached.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace softrdma::core {

constexpr uint32_t kMulticastQpn = 0xffffff;

inline bool IsMulticastGid(const ibv_gid& g) {
  return g.raw[0] == 0xff;
}

class McastRegistry {
 public:
  ~McastRegistry();
  // EINVAL for a non-multicast GID; attaching twice is not an error (as in the kernel).
  int Attach(const ibv_gid& mgid, uint32_t qpn);
  int Detach(const ibv_gid& mgid, uint32_t qpn);
  void DetachAll(uint32_t qpn);
  // QPNs attached to `mgid` in every process of the host (cached for a few milliseconds).
  std::vector<uint32_t> Members(const ibv_gid& mgid);
  // Drops held files without unlocking them: the parent of a fork() still holds the locks.
  void ForgetAfterFork();
  // At exit: removes the member files of QPs still attached (the HCA is never destructed). Left
  // when another thread holds the registry: readers skip files nobody holds.
  void LeaveAllAtExit();

 private:
  struct Cached {
    int64_t expires_ns = 0;
    std::vector<uint32_t> qpns;
  };
  void LeaveAllLocked();
  std::mutex mu_;
  std::map<std::pair<std::string, uint32_t>, int> held_;  // (mgid hex, qpn) -> fd
  std::map<std::string, Cached> cache_;
};

}  // namespace softrdma::core
