// The BTH opcode table: one row per IBTA opcode says which headers follow the BTH, where they sit,
// and what the packet means. Packet parsing and the responder/completer read this table instead of
// switching on opcodes (the idea of Linux rxe's rxe_opcode[], written anew).
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>

#include "core/wire.h"

namespace softrdma::core {

namespace op {
// IBTA 9.2.1: the top 3 bits select the transport, the low 5 bits the operation.
constexpr uint8_t kRc = 0x00, kUc = 0x20, kRd = 0x40, kUd = 0x60, kXrc = 0xa0;
constexpr uint8_t kSendFirst = 0x00, kSendMiddle = 0x01, kSendLast = 0x02, kSendLastImm = 0x03,
                  kSendOnly = 0x04, kSendOnlyImm = 0x05, kWriteFirst = 0x06, kWriteMiddle = 0x07,
                  kWriteLast = 0x08, kWriteLastImm = 0x09, kWriteOnly = 0x0a, kWriteOnlyImm = 0x0b,
                  kReadRequest = 0x0c, kReadResponseFirst = 0x0d, kReadResponseMiddle = 0x0e,
                  kReadResponseLast = 0x0f, kReadResponseOnly = 0x10, kAcknowledge = 0x11,
                  kAtomicAcknowledge = 0x12, kCompareSwap = 0x13, kFetchAdd = 0x14,
                  kSendLastInv = 0x16, kSendOnlyInv = 0x17;
// softrdma's own, between processes of one host (IBTA leaves 0xc0-0xff to manufacturers): an XRC
// SEND relayed from its target QP's process to its SRQ's owner, and the owner's answer.
constexpr uint8_t kXrcRelaySend = 0xc0, kXrcRelayAnswer = 0xc1;
}  // namespace op

// Header presence and meaning bits of one opcode.
enum OpMask : uint32_t {
  kHasReth = 1u << 0,
  kHasAeth = 1u << 1,
  kHasAtomicEth = 1u << 2,
  kHasAtomicAck = 1u << 3,
  kHasImm = 1u << 4,
  kHasIeth = 1u << 5,
  kHasDeth = 1u << 6,
  kHasXrcEth = 1u << 7,
  kHasPayload = 1u << 8,
  kIsRequest = 1u << 9,    // goes to the responder
  kIsResponse = 1u << 10,  // goes to the completer
  kIsSend = 1u << 11,
  kIsWrite = 1u << 12,
  kIsRead = 1u << 13,
  kIsAtomic = 1u << 14,
  kIsFirst = 1u << 15,
  kIsMiddle = 1u << 16,
  kIsLast = 1u << 17,
  kIsOnly = kIsFirst | kIsLast,
  kConsumesRecv = 1u << 18,   // takes a receive WQE
  kCompletesRecv = 1u << 19,  // the packet that generates the receive completion
  kHasRelayEth = 1u << 20,
  kIsRelay = 1u << 21,  // between processes of one host, never to a QP's responder or completer
  kValid = 1u << 31,
};

struct OpInfo {
  const char* name;
  uint32_t mask;
  uint8_t length;  // BTH plus every extension header
  // Offsets from the start of the BTH; 0 when absent.
  uint8_t reth, aeth, atomic_eth, atomic_ack, imm, ieth, deth, xrceth, relay;

  constexpr bool valid() const { return mask & kValid; }
  constexpr bool has(uint32_t m) const { return (mask & m) == m; }
};

const OpInfo& Opcode(uint8_t opcode);

// Which transport an opcode belongs to (the top 3 bits).
inline uint8_t OpTransport(uint8_t opcode) {
  return opcode & 0xe0;
}

// The transport bits of a QP type's packets (both halves of XRC speak XRC).
inline uint8_t QpTransport(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_UC:
      return op::kUc;
    case IBV_QPT_UD:
      return op::kUd;
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      return op::kXrc;
    default:
      return op::kRc;
  }
}

}  // namespace softrdma::core
