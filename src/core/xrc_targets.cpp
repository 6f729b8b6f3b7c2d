#include "core/xrc_targets.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "core/held_file.h"
#include "core/host_identity.h"

namespace softrdma::core {
namespace {

constexpr size_t kTableBytes = sizeof(TargetRecord) * TargetTable::kRecords;

std::string TablePath(uint64_t dev, uint64_t ino) {
  return RunDirectory() + "/xrcd-" + std::to_string(getuid()) + "-" + std::to_string(dev) + "-" +
         std::to_string(ino);
}

}  // namespace

bool ProcessAlive(int32_t pid) {
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

TargetTable* TargetTable::Open(uint64_t dev, uint64_t ino) {
  auto* t = new TargetTable();
  t->dev_ = dev;
  t->ino_ = ino;
  if (!t->MapLocked()) {
    delete t;
    return nullptr;
  }
  return t;
}

bool TargetTable::MapLocked() {
  int fd = open(TablePath(dev_, ino_).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0 || (static_cast<size_t>(st.st_size) < kTableBytes &&
                              ftruncate(fd, static_cast<off_t>(kTableBytes)) != 0)) {
    close(fd);
    return false;
  }
  void* p = mmap(nullptr, kTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return false;
  }
  // An earlier mapping stays: QPs may still read a record's generation through it.
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  records_ = static_cast<TargetRecord*>(p);
  return true;
}

TargetTable::Guard::Guard(TargetTable& t) : t_(t) {
  t_.mu_.lock();
  // The last process to empty the table unlinks its file; a holder of the old file opens the
  // new one (a few tries: the file may be unlinked again between our open and our lock).
  for (int i = 0; i < 8; ++i) {
    flock(t_.fd_, LOCK_EX);
    struct stat st {};
    if (fstat(t_.fd_, &st) == 0 && st.st_nlink > 0) return;
    flock(t_.fd_, LOCK_UN);
    if (!t_.MapLocked()) break;
  }
}

TargetTable::Guard::~Guard() {
  bool empty = true;
  for (int i = 0; i < kRecords && empty; ++i)
    empty = t_.records_[i].qpn.load(std::memory_order_relaxed) == 0;
  if (empty) unlink(TablePath(t_.dev_, t_.ino_).c_str());
  flock(t_.fd_, LOCK_UN);
  t_.mu_.unlock();
}

TargetRecord* TargetTable::FindLocked(uint32_t qpn) {
  if (qpn == 0) return nullptr;
  for (int i = 0; i < kRecords; ++i)
    if (records_[i].qpn.load(std::memory_order_relaxed) == qpn) return &records_[i];
  return nullptr;
}

TargetRecord* TargetTable::AddLocked(uint32_t qpn) {
  for (int i = 0; i < kRecords; ++i) {
    TargetRecord& r = records_[i];
    if (r.qpn.load(std::memory_order_relaxed) != 0) continue;
    r.generation.store(0, std::memory_order_relaxed);
    r.epsn = 0;
    r.server_pid = getpid();
    r.server_slot = 0;
    r.attr_mask = 0;
    r.attr = ibv_qp_attr{};
    r.attr.qp_state = IBV_QPS_RESET;
    for (auto& h : r.holders) h = TargetRecord::Holder{};
    r.qpn.store(qpn, std::memory_order_release);
    return &r;
  }
  return nullptr;
}

void TargetTable::EraseLocked(TargetRecord* r) {
  r->qpn.store(0, std::memory_order_release);
}

int TargetTable::CountLocked(TargetRecord* r) {
  int live = 0;
  for (auto& h : r->holders) {
    if (h.pid != 0 && h.pid != getpid() && !ProcessAlive(h.pid)) h = TargetRecord::Holder{};
    live += h.handles;
  }
  return live;
}

int TargetTable::AddHolderLocked(TargetRecord* r, uint16_t slot) {
  int32_t me = getpid();
  TargetRecord::Holder* free_one = nullptr;
  for (auto& h : r->holders) {
    if (h.pid == me) {
      ++h.handles;
      h.slot = slot;
      return CountLocked(r);
    }
    if (h.pid == 0 && !free_one) free_one = &h;
  }
  if (!free_one) return -1;
  *free_one = TargetRecord::Holder{me, slot, 1};
  return CountLocked(r);
}

int TargetTable::ReleaseLocked(TargetRecord* r, bool all_of_ours) {
  for (auto& h : r->holders)
    if (h.pid == getpid() && (all_of_ours || --h.handles == 0)) h = TargetRecord::Holder{};
  return CountLocked(r);
}

const TargetRecord::Holder* TargetTable::SuccessorLocked(TargetRecord* r) {
  CountLocked(r);
  for (auto& h : r->holders)
    if (h.pid != 0 && h.pid != getpid() && h.slot != 0) return &h;
  return nullptr;
}

bool TargetTable::RemoveIfAbandoned(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool removed = false;
  struct stat st {};
  // Under the lock Guard takes: no process is adding or handing over a target meanwhile.
  if (fstat(fd, &st) == 0 && st.st_uid == getuid() &&
      static_cast<size_t>(st.st_size) >= kTableBytes && flock(fd, LOCK_EX | LOCK_NB) == 0) {
    void* p = mmap(nullptr, kTableBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const auto* records = static_cast<const TargetRecord*>(p);
      bool held = false;
      for (int i = 0; i < kRecords && !held; ++i) {
        if (records[i].qpn.load(std::memory_order_relaxed) == 0) continue;
        for (const auto& h : records[i].holders) held = held || ProcessAlive(h.pid);
      }
      munmap(p, kTableBytes);
      // A process that still maps it opens a new file at its next Guard (nlink 0), as after
      // the last holder's own removal.
      if (!held) removed = RemoveLockedAbandoned(fd, path);
    }
  }
  close(fd);
  return removed;
}

TargetTable* SharedTargets::TableOf(const Xrcd& d) {
  if (!d.shared()) return nullptr;
  std::lock_guard<std::mutex> g(mu_);
  TargetTable*& t = tables_[{d.dev, d.ino}];
  if (!t) t = TargetTable::Open(d.dev, d.ino);
  return t;
}

}  // namespace softrdma::core
