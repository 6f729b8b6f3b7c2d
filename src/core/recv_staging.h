// Receive buffers that same-host peers cannot write directly — regions under
// link::SharedMemory::kMinShareBytes stay private, and a region's partial first or last page is
// outside its window — are still published for direct SENDs when the WQE is small: its slot
// names a staging buffer of the QP instead, and the owner copies what a sender placed there into
// the WQE's buffers when it collects the completion. One copy more on the owner's side, against a
// frame through the ring and its acknowledgement (ibv_rc_pingpong's 4 KiB buffer, one page, took
// 7 us per round trip on frames, 2.6 us where its buffer was shared).
#pragma once

#include <cstdint>
#include <memory>

#include "core/mr.h"
#include "link/shared_windows.h"

namespace softrdma::core {

class RecvStaging {
 public:
  // A WQE of at most this many bytes is staged.
  static constexpr uint32_t kSlotBytes = 4096;

  // A staging buffer per receive slot, registered (locally writable) in `pd` and shared with
  // peers; nullptr when it cannot be made or shared.
  static std::unique_ptr<RecvStaging> Make(MrTable& mrs, const Pd* pd);
  ~RecvStaging();
  RecvStaging(const RecvStaging&) = delete;
  RecvStaging& operator=(const RecvStaging&) = delete;

  uint32_t key() const { return key_; }
  // The address of slot `index`'s buffer in the region's key (its iova is its host address).
  uint64_t SlotAddr(uint32_t index) const { return reinterpret_cast<uint64_t>(SlotBytes(index)); }
  uint8_t* SlotBytes(uint32_t index) const {
    return base_ + (index % link::kDirectRecvSlots) * kSlotBytes;
  }

 private:
  RecvStaging(MrTable& mrs, uint8_t* base) : mrs_(mrs), base_(base) {}
  static constexpr uint64_t kBytes = uint64_t{kSlotBytes} * link::kDirectRecvSlots;
  MrTable& mrs_;
  uint8_t* base_;
  uint32_t key_ = 0;
};

}  // namespace softrdma::core
