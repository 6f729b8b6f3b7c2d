// XRC domains and the numbers of XRC shared receive queues. A domain groups the receive side of
// XRC: the XRC SRQs a sender picks by number and the XRC_RECV QPs its messages enter through.
// Domains opened through the same file (ibv_open_xrcd with an fd) are one domain, found again by
// the file's inode while any handle to it is open. See docs/architecture.md §13.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace softrdma::core {

class Cq;
class Srq;

struct Xrcd {
  uint32_t id;
  // The file it was opened through (0, 0: a private domain). Processes that opened the same file
  // are in one domain: a relayed message names it by these.
  uint64_t dev = 0, ino = 0;
  bool shared() const { return dev != 0 || ino != 0; }
};

class XrcRegistry {
 public:
  // ibv_open_xrcd(3) on this process's domains: `fd` -1 makes a private domain; otherwise the
  // domain of the file's inode, made when `oflags` has O_CREAT. Errors as the kernel's: EBADF
  // (fd), EINVAL (unknown flags; no domain and no O_CREAT; a domain and O_EXCL).
  std::shared_ptr<Xrcd> Open(int fd, int oflags, int* err);

  // Makes `srq` an XRC SRQ of `xrcd` completing on `cq`, and numbers it: `slot` in the top bits,
  // as in QP numbers, so a number names its process. 0 when the table is full.
  uint32_t AddSrq(uint16_t slot, Srq* srq, std::shared_ptr<Xrcd> xrcd, Cq* cq);
  void RemoveSrq(uint32_t srqn);
  // The XRC SRQ numbered `srqn` if it belongs to `xrcd`, else nullptr. The caller holds `mu()`
  // for as long as it uses the SRQ: an SRQ leaves the table before it is destroyed.
  Srq* FindSrqLocked(uint32_t srqn, const Xrcd* xrcd);
  // The same for a message another process relays, naming the domain by its file.
  Srq* FindSrqLocked(uint32_t srqn, uint64_t dev, uint64_t ino);
  std::mutex& mu() { return mu_; }

 private:
  std::mutex mu_;
  uint32_t next_id_ = 1;
  std::map<std::pair<dev_t, ino_t>, std::weak_ptr<Xrcd>> by_inode_;
  std::unordered_map<uint32_t, Srq*> srqs_;
  uint32_t next_srq_index_ = 1;
};

}  // namespace softrdma::core
