#include "core/opcode.h"

namespace softrdma::core {
namespace {

using wire::Aeth;
using wire::AtomicAckEth;
using wire::AtomicEth;
using wire::Bth;
using wire::Deth;
using wire::Ieth;
using wire::ImmDt;
using wire::Reth;
using wire::XrcEth;

// Lays the extension headers out in IBTA order: XRCETH, DETH, RETH, AtomicETH, AETH,
// AtomicAckETH, ImmDt, IETH.
constexpr OpInfo Make(const char* name, uint32_t mask) {
  OpInfo o{name, mask | kValid, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t at = sizeof(Bth);
  auto place = [&at, mask](uint32_t bit, uint8_t size, uint8_t& field) {
    if (mask & bit) {
      field = at;
      at = static_cast<uint8_t>(at + size);
    }
  };
  place(kHasXrcEth, sizeof(XrcEth), o.xrceth);
  place(kHasRelayEth, sizeof(wire::XrcRelayEth), o.relay);
  place(kHasDeth, sizeof(Deth), o.deth);
  place(kHasReth, sizeof(Reth), o.reth);
  place(kHasAtomicEth, sizeof(AtomicEth), o.atomic_eth);
  place(kHasAeth, sizeof(Aeth), o.aeth);
  place(kHasAtomicAck, sizeof(AtomicAckEth), o.atomic_ack);
  place(kHasImm, sizeof(ImmDt), o.imm);
  place(kHasIeth, sizeof(Ieth), o.ieth);
  o.length = at;
  return o;
}

constexpr uint32_t kSendReq = kIsRequest | kIsSend | kHasPayload | kConsumesRecv;
constexpr uint32_t kWriteReq = kIsRequest | kIsWrite | kHasPayload;
constexpr uint32_t kReadResp = kIsResponse | kIsRead | kHasPayload;

// The operations of the connected transports, before the transport's extra header is added.
struct Row {
  uint8_t code;
  const char* name;
  uint32_t mask;
};
constexpr Row kConnectedOps[] = {
    {op::kSendFirst, "SEND_FIRST", kSendReq | kIsFirst},
    {op::kSendMiddle, "SEND_MIDDLE", kSendReq | kIsMiddle},
    {op::kSendLast, "SEND_LAST", kSendReq | kIsLast | kCompletesRecv},
    {op::kSendLastImm, "SEND_LAST_WITH_IMMEDIATE", kSendReq | kIsLast | kHasImm | kCompletesRecv},
    {op::kSendOnly, "SEND_ONLY", kSendReq | kIsOnly | kCompletesRecv},
    {op::kSendOnlyImm, "SEND_ONLY_WITH_IMMEDIATE", kSendReq | kIsOnly | kHasImm | kCompletesRecv},
    {op::kWriteFirst, "RDMA_WRITE_FIRST", kWriteReq | kIsFirst | kHasReth},
    {op::kWriteMiddle, "RDMA_WRITE_MIDDLE", kWriteReq | kIsMiddle},
    {op::kWriteLast, "RDMA_WRITE_LAST", kWriteReq | kIsLast},
    {op::kWriteLastImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE",
     kWriteReq | kIsLast | kHasImm | kConsumesRecv | kCompletesRecv},
    {op::kWriteOnly, "RDMA_WRITE_ONLY", kWriteReq | kIsOnly | kHasReth},
    {op::kWriteOnlyImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
     kWriteReq | kIsOnly | kHasReth | kHasImm | kConsumesRecv | kCompletesRecv},
    {op::kReadRequest, "RDMA_READ_REQUEST", kIsRequest | kIsRead | kIsOnly | kHasReth},
    {op::kReadResponseFirst, "RDMA_READ_RESPONSE_FIRST", kReadResp | kIsFirst | kHasAeth},
    {op::kReadResponseMiddle, "RDMA_READ_RESPONSE_MIDDLE", kReadResp | kIsMiddle},
    {op::kReadResponseLast, "RDMA_READ_RESPONSE_LAST", kReadResp | kIsLast | kHasAeth},
    {op::kReadResponseOnly, "RDMA_READ_RESPONSE_ONLY", kReadResp | kIsOnly | kHasAeth},
    {op::kAcknowledge, "ACKNOWLEDGE", kIsResponse | kIsOnly | kHasAeth},
    {op::kAtomicAcknowledge, "ATOMIC_ACKNOWLEDGE",
     kIsResponse | kIsAtomic | kIsOnly | kHasAeth | kHasAtomicAck},
    {op::kCompareSwap, "COMPARE_SWAP", kIsRequest | kIsAtomic | kIsOnly | kHasAtomicEth},
    {op::kFetchAdd, "FETCH_ADD", kIsRequest | kIsAtomic | kIsOnly | kHasAtomicEth},
    {op::kSendLastInv, "SEND_LAST_WITH_INVALIDATE", kSendReq | kIsLast | kHasIeth | kCompletesRecv},
    {op::kSendOnlyInv, "SEND_ONLY_WITH_INVALIDATE", kSendReq | kIsOnly | kHasIeth | kCompletesRecv},
};

// UC carries sends and writes only (IBTA table 38).
constexpr bool InUc(uint8_t code) {
  return code <= op::kWriteOnlyImm;
}

constexpr std::array<OpInfo, 256> BuildTable() {
  std::array<OpInfo, 256> t{};
  for (const Row& r : kConnectedOps) {
    t[op::kRc | r.code] = Make(r.name, r.mask);
    t[op::kXrc | r.code] =
        Make(r.name, r.mask | ((r.mask & kIsRequest) ? uint32_t{kHasXrcEth} : 0u));
    if (InUc(r.code)) t[op::kUc | r.code] = Make(r.name, r.mask);
  }
  t[op::kUd | op::kSendOnly] = Make("UD_SEND_ONLY", kSendReq | kIsOnly | kHasDeth | kCompletesRecv);
  t[op::kUd | op::kSendOnlyImm] =
      Make("UD_SEND_ONLY_WITH_IMMEDIATE", kSendReq | kIsOnly | kHasDeth | kHasImm | kCompletesRecv);
  t[op::kXrcRelaySend] =
      Make("XRC_RELAY_SEND", kIsRelay | kIsOnly | kHasXrcEth | kHasRelayEth | kHasPayload);
  t[op::kXrcRelayAnswer] = Make("XRC_RELAY_ANSWER", kIsRelay | kIsOnly | kHasAeth);
  return t;
}

constexpr std::array<OpInfo, 256> kTable = BuildTable();

// Pin a few rows against the IBTA layouts so a table edit cannot silently shift a header.
static_assert(kTable[op::kRc | op::kWriteOnlyImm].length == 12 + 16 + 4);
static_assert(kTable[op::kRc | op::kWriteOnlyImm].imm == 28);
static_assert(kTable[op::kRc | op::kCompareSwap].length == 12 + 28);
static_assert(kTable[op::kRc | op::kAtomicAcknowledge].atomic_ack == 16);
static_assert(kTable[op::kUd | op::kSendOnlyImm].deth == 12 &&
              kTable[op::kUd | op::kSendOnlyImm].imm == 20);
static_assert(kTable[op::kXrc | op::kWriteOnly].xrceth == 12 &&
              kTable[op::kXrc | op::kWriteOnly].reth == 16);
static_assert(!kTable[op::kUc | op::kReadRequest].valid());
static_assert(kTable[op::kXrcRelaySend].relay == 16 && kTable[op::kXrcRelaySend].length == 48);
static_assert(kTable[op::kXrcRelayAnswer].length == 16);
static_assert(!kTable[0xff].valid());

}  // namespace

const OpInfo& Opcode(uint8_t opcode) {
  return kTable[opcode];
}

}  // namespace softrdma::core
