// Memory regions and the process-wide key table. Every byte the device reads or writes on behalf of
// a work request or a remote peer goes through Resolve(), which checks key, PD, bounds and rights.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

namespace softrdma::core {

struct Pd {
  uint32_t handle;
};

struct Mr {
  const Pd* pd;
  uint8_t* addr;  // host address of the first byte
  uint64_t length;
  uint64_t iova;  // the address remote peers use for the first byte
  int access;     // ibv_access_flags
  uint32_t key;   // lkey == rkey
};

enum class KeyCheck { kOk, kBadKey, kBadPd, kBadRange, kBadAccess };

class MrTable {
 public:
  // Assigns a fresh unpredictable key and publishes the region.
  uint32_t Insert(const Mr& mr);
  bool Remove(uint32_t key);
  bool Update(uint32_t key, const Mr& mr);  // rereg: same key, new attributes
  bool Get(uint32_t key, Mr* out) const;
  size_t size() const;

  // Translates [va, va+len) under `key` into host memory, checking that the key exists, belongs to
  // `pd`, covers the range, and grants every bit of `access`. `local` selects address space:
  // local SGEs address host memory directly, remote requests address the region's iova.
  uint8_t* Resolve(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, int access, bool local,
                   KeyCheck* why) const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<uint32_t, Mr> by_key_;
};

}  // namespace softrdma::core
