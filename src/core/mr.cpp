#include "core/mr.h"

#include <mutex>
#include <random>

namespace softrdma::core {
namespace {

uint32_t RandomKey() {
  static thread_local std::mt19937 gen(std::random_device{}());
  return static_cast<uint32_t>(gen());
}

}  // namespace

uint32_t MrTable::Insert(const Mr& mr) {
  std::unique_lock<std::shared_mutex> g(mu_);
  for (;;) {
    uint32_t key = RandomKey();
    if (key == 0 || by_key_.count(key)) continue;  // 0 stays invalid so it never matches by chance
    Mr m = mr;
    m.key = key;
    by_key_.emplace(key, m);
    return key;
  }
}

bool MrTable::Remove(uint32_t key) {
  std::unique_lock<std::shared_mutex> g(mu_);
  return by_key_.erase(key) == 1;
}

bool MrTable::Update(uint32_t key, const Mr& mr) {
  std::unique_lock<std::shared_mutex> g(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  it->second = mr;
  it->second.key = key;
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
