#include "core/mr.h"

#include <infiniband/verbs.h>

#include <mutex>
#include <random>

#include "link/shared_memory.h"
#include "link/shared_windows.h"

namespace softrdma::core {
namespace {

uint32_t RandomKey() {
  static thread_local std::mt19937 gen(std::random_device{}());
  return static_cast<uint32_t>(gen());
}

}  // namespace

namespace {

constexpr int kRemoteRights =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Same-host peers reach a region's memory directly when it lies in the arena.
void PublishWindow(const Mr& m) {
  if (m.access & kRemoteRights)
    link::SharedWindows::Get().Publish(m.key, m.pd->handle, m.iova, m.addr, m.length,
                                       static_cast<uint32_t>(m.access & kRemoteRights));
}

}  // namespace

uint32_t MrTable::Insert(const Mr& mr) {
  // Large regions become readable by same-host peers (outside the table's lock: it parses maps).
  link::SharedMemory::Get().Share(mr.addr, mr.length);
  Mr m = mr;
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    for (;;) {
      uint32_t key = RandomKey();
      if (key == 0 || key == link::kWindowTombstone || by_key_.count(key))
        continue;  // 0 stays invalid so it never matches by chance
      m.key = key;
      by_key_.emplace(key, m);
      break;
    }
  }
  PublishWindow(m);
  return m.key;
}

bool MrTable::Remove(uint32_t key) {
  Mr old;
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return false;
    old = it->second;
    by_key_.erase(it);
  }
  link::SharedWindows::Get().Withdraw(key);  // no peer inside it once this returns
  link::SharedMemory::Get().Unshare(old.addr, old.length);
  return true;
}

bool MrTable::Update(uint32_t key, const Mr& mr) {
  link::SharedMemory::Get().Share(mr.addr, mr.length);
  Mr old;
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) {
      g.unlock();
      link::SharedMemory::Get().Unshare(mr.addr, mr.length);
      return false;
    }
    old = it->second;
    it->second = mr;
    it->second.key = key;
  }
  link::SharedWindows::Get().Withdraw(key);
  link::SharedMemory::Get().Unshare(old.addr, old.length);
  Mr m = mr;
  m.key = key;
  PublishWindow(m);
  return true;
}

bool MrTable::Get(uint32_t key, Mr* out) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  *out = it->second;
  return true;
}

size_t MrTable::size() const {
  std::shared_lock<std::shared_mutex> g(mu_);
  return by_key_.size();
}

uint8_t* MrTable::Resolve(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, int access,
                          bool local, KeyCheck* why) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) {
    *why = KeyCheck::kBadKey;
    return nullptr;
  }
  const Mr& m = it->second;
  if (m.pd != pd) {
    *why = KeyCheck::kBadPd;
    return nullptr;
  }
  uint64_t base = local ? reinterpret_cast<uint64_t>(m.addr) : m.iova;
  // Overflow-safe containment: va >= base and va + len <= base + length.
  if (va < base || va - base > m.length || len > m.length - (va - base)) {
    *why = KeyCheck::kBadRange;
    return nullptr;
  }
  if ((m.access & access) != access) {
    *why = KeyCheck::kBadAccess;
    return nullptr;
  }
  *why = KeyCheck::kOk;
  return m.addr + (va - base);
}

}  // namespace softrdma::core
