// XRC receive (target) QPs shared between processes: ibv_open_qp(3) and the OFED 1.5 legacy
// ibv_reg_xrc_rcv_qp(3). With a kernel, such a QP is a kernel object that lives while any process
// holds a handle to it, whoever created it. Here a QP lives in a process, so the domain keeps a
// host-wide table (a file in the run directory, mapped by every process of the domain) with one
// record per shared target: its attributes, which processes hold it, and which one serves it
// (executes its requests). The creator serves first; when it exits while others still hold the
// QP, the record names a holder as the next server and the creator's slot file is rewritten to
// reach that holder, so senders re-resolve and go on (docs/architecture.md §13).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/xrc.h"

namespace softrdma::core {

struct TargetRecord {
  static constexpr int kMaxHolders = 32;
  struct Holder {
    int32_t pid;
    uint16_t slot;
    uint16_t handles;
  };
  std::atomic<uint32_t> qpn;         // 0: a free record
  std::atomic<uint32_t> generation;  // bumped by every modify, so the server sees a change
  uint32_t epsn;                     // the next PSN the new server expects (at hand-over)
  int32_t server_pid;
  uint16_t server_slot;
  uint16_t pad;
  int32_t attr_mask;  // every attribute set so far
  ibv_qp_attr attr;   // as set so far; qp_state is the QP's state
  Holder holders[kMaxHolders];
};

// One domain's table. Records are only ever changed under Lock(); a server reads `generation`
// without it.
class TargetTable {
 public:
  static constexpr int kRecords = 128;
  // Maps (creating if needed) the table of the domain of file (dev, ino); nullptr on failure.
  static TargetTable* Open(uint64_t dev, uint64_t ino);

  // Holds the table against every other thread and process.
  class Guard {
   public:
    explicit Guard(TargetTable& t);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    TargetTable& t_;
  };

  TargetRecord* FindLocked(uint32_t qpn);
  // A free record for `qpn`, or nullptr when the table is full.
  TargetRecord* AddLocked(uint32_t qpn);
  void EraseLocked(TargetRecord* r);
  // The handles live processes hold (holders whose process is gone are forgotten).
  int CountLocked(TargetRecord* r);
  // This process holds one more handle (-1: no room for another holder), or one fewer (every
  // one of ours: `all_of_ours`, at exit). Both return CountLocked after the change.
  int AddHolderLocked(TargetRecord* r, uint16_t slot);
  int ReleaseLocked(TargetRecord* r, bool all_of_ours = false);
  // A live holder other than this process, or nullptr.
  const TargetRecord::Holder* SuccessorLocked(TargetRecord* r);

  // Removes the table file at `path` (this user's) when no live process holds any of its
  // targets: every holder was killed, and no exit handler removed it. True when removed.
  static bool RemoveIfAbandoned(const std::string& path);

 private:
  TargetTable() = default;
  bool MapLocked();
  uint64_t dev_ = 0, ino_ = 0;
  std::mutex mu_;  // flock() does not keep this process's own threads apart
  int fd_ = -1;
  TargetRecord* records_ = nullptr;
};

// This process's view of the shared targets of every domain it opened through a file.
class SharedTargets {
 public:
  TargetTable* TableOf(const Xrcd& d);

 private:
  std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, TargetTable*> tables_;  // mapped until exit
};

bool ProcessAlive(int32_t pid);

}  // namespace softrdma::core
