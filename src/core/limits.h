// The limits softrdma0 advertises and enforces. One place, so ibv_query_device and the checks in
// every create/post path cannot disagree.
#pragma once

#include <cstdint>

namespace softrdma::core {

constexpr uint32_t kVendorId = 0x534f46;    // "SOF": no vendor library recognises it
constexpr uint32_t kVendorPartId = 0x5244;  // not in perftest's device table: it stays generic
constexpr uint32_t kHwVersion = 1;
constexpr uint32_t kMaxQpWr = 16384;
constexpr uint32_t kMaxSge = 32;
constexpr uint32_t kMaxInlineData = 1024;
constexpr uint32_t kMaxCqe = (1u << 22) - 1;
constexpr uint32_t kMaxCq = 65536;
constexpr uint32_t kMaxMr = 1u << 22;
constexpr uint32_t kMaxPd = 1u << 20;
constexpr uint32_t kMaxAh = 1u << 20;
constexpr uint32_t kMaxSrq = 1u << 16;
constexpr uint32_t kMaxSrqWr = 16384;
constexpr uint32_t kMaxRdAtomic = 128;
constexpr uint32_t kMaxMsgSize = 0x80000000u;  // 2 GiB, as Soft-RoCE
constexpr uint32_t kMtuBytes = 4096;           // active and max MTU of port 1
constexpr uint32_t kMaxMcastGroups = 8192;
constexpr uint32_t kMaxMcastQpAttach = 56;
constexpr uint32_t kGidTableLen = 16;
constexpr uint8_t kPortNum = 1;

// QP numbers are host-unique: the upper bits carry the process's slot (which is also its LID), so
// a peer handed only a QPN still finds the process. See docs/architecture.md, "Addressing".
constexpr uint32_t kQpIndexBits = 13;
constexpr uint32_t kMaxQp = (1u << kQpIndexBits) - 1;
constexpr uint32_t kMaxSlot = 2046;  // slot 2047 would reach the multicast QPN 0xffffff

}  // namespace softrdma::core
