// How a destination named by verbs — (GID, QPN) or (LID, QPN) or just a QPN — becomes a reachable
// process, without a daemon. See docs/architecture.md, "Addressing".
//
//  * Each process holds a host-wide slot (1..kMaxSlot), claimed by an flock()ed file in the run
//    directory. The slot is the port's LID and the top bits of every QPN of the process.
//  * Each GID encodes one IPv4 address of the process's network namespace and the TCP port of its
//    endpoint: fe80:0000:0000:0000:<ipv4:4><port:2><slot:2>. A GID alone reaches the process from
//    any host that can route to that address.
//  * The slot file records the endpoint (network namespace, port, addresses), so a LID or a QPN
//    alone reaches the process from any namespace of the same host.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/host_identity.h"
#include "core/limits.h"
#include "link/link.h"

namespace softrdma::core {

// The first number from index `*next` on that `taken(number)` refuses, with the process's `slot`
// in the top bits, as QP and XRC SRQ numbers carry it (a number names its process); `*next`
// moves past it. The caller makes sure a free index exists.
template <typename Taken>
uint32_t NextFreeNumber(uint16_t slot, uint32_t* next, Taken taken) {
  uint32_t idx = *next;
  uint32_t number = (uint32_t{slot} << kQpIndexBits) | idx;
  while (taken(number)) {
    idx = idx % kMaxQp + 1;
    number = (uint32_t{slot} << kQpIndexBits) | idx;
  }
  *next = idx % kMaxQp + 1;
  return number;
}

struct GidFields {
  uint32_t ip;  // host order
  uint16_t port;
  uint16_t slot;
};

ibv_gid MakeGid(const GidFields& f);
std::optional<GidFields> ParseGid(const ibv_gid& gid);

// The slot an address vector reaches: the GID's, else the LID, else the QPN's.
uint16_t DestinationSlot(const ibv_ah_attr& attr, uint32_t qpn);

// IPv4 addresses of this namespace's interfaces that are up, non-loopback first; 127.0.0.1 when
// there is nothing else. SOFTRDMA_IP puts a chosen address first.
std::vector<uint32_t> LocalIpv4Addresses();

class SlotRegistry {
 public:
  // Claims a free slot and publishes `port` and `ips` in it. Holds the claim until destruction.
  bool Claim(uint16_t port, const std::vector<uint32_t>& ips, std::string* err);
  ~SlotRegistry();
  uint16_t slot() const { return slot_; }
  struct Peer {
    link::PeerAddr addr;  // where it listens, as seen from this namespace
    bool same_netns;      // it shares our network namespace: same host, same Unix socket space
  };
  // Where the process holding `slot` listens.
  std::optional<Peer> Lookup(uint16_t slot) const;
  // Drops the claim's fd without unlocking: the parent of a fork() still holds it.
  void ForgetAfterFork();

  // Shared XRC targets (xrc_targets.h) outlive the process that created them, so their QP
  // numbers' slot must too. A process holding a target of another slot holds that slot (a shared
  // lock on "slot-N.held"): no starting process claims it or sweeps it, even once its creator is
  // gone. Release drops one hold; the last holder of a slot whose creator is gone removes its
  // files. Holds of the slot we claimed ourselves are not needed and not taken.
  void Hold(uint16_t slot);
  void Release(uint16_t slot);
  // At exit, slot `slot` (ours, or one we hold) is made to reach the process of slot `to`: its
  // file takes that process's record and stays. False when it could not be rewritten.
  bool HandOver(uint16_t slot, uint16_t to);

 private:
  void SweepStaleSlots();
  // True while some process holds `slot` (a caller holding its slot file's lock asks).
  bool HeldElsewhere(uint16_t slot) const;
  std::string PathOf(uint16_t slot) const { return dir_ + "/slot-" + std::to_string(slot); }
  std::string dir_;
  int fd_ = -1;
  uint16_t slot_ = 0;
  bool handed_over_ = false;
  struct HeldSlot {
    int fd = -1;
    int count = 0;
  };
  std::mutex held_mu_;
  std::map<uint16_t, HeldSlot> held_;
};

}  // namespace softrdma::core
