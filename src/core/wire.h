// IBTA transport headers as they travel between softrdma nodes.
//
// Every multi-byte field is big-endian on the wire, as in InfiniBand and RoCE, so a capture can be
// rewritten as RoCEv2 and dissected. The structs are packed and pinned by static_assert; accessors
// convert byte order so that no other code touches raw fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace softrdma::wire {

inline uint16_t Load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}
inline uint32_t Load24(const uint8_t* p) {
  return uint32_t{p[0]} << 16 | uint32_t{p[1]} << 8 | p[2];
}
inline uint32_t Load32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
inline uint64_t Load64(const uint8_t* p) {
  return uint64_t{Load32(p)} << 32 | Load32(p + 4);
}
inline void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void Store24(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 16);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v);
}
inline void Store32(uint8_t* p, uint32_t v) {
  Store16(p, static_cast<uint16_t>(v >> 16));
  Store16(p + 2, static_cast<uint16_t>(v));
}
inline void Store64(uint8_t* p, uint64_t v) {
  Store32(p, static_cast<uint32_t>(v >> 32));
  Store32(p + 4, static_cast<uint32_t>(v));
}

constexpr uint32_t kPsnMask = 0xffffff;
constexpr uint32_t kQpnMask = 0xffffff;

#pragma pack(push, 1)

// Base Transport Header (IBTA 9.2).
struct Bth {
  uint8_t opcode;
  uint8_t flags;  // SE:1 MigReq:1 PadCnt:2 TVer:4
  uint8_t pkey[2];
  uint8_t dest_qp[4];  // reserved:8 DestQP:24
  uint8_t ack_psn[4];  // AckReq:1 reserved:7 PSN:24

  static constexpr uint8_t kSolicited = 0x80;
  static constexpr uint8_t kMigReq = 0x40;

  bool solicited() const { return flags & kSolicited; }
  uint16_t pkey_value() const { return Load16(pkey); }
  uint32_t qpn() const { return Load24(dest_qp + 1); }
  uint32_t psn() const { return Load24(ack_psn + 1); }
  bool ack_req() const { return ack_psn[0] & 0x80; }
  void Set(uint8_t op, bool se, uint16_t pk, uint32_t dqpn, uint32_t p, bool ackreq) {
    opcode = op;
    flags = static_cast<uint8_t>((se ? kSolicited : 0) | kMigReq);
    Store16(pkey, pk);
    dest_qp[0] = 0;
    Store24(dest_qp + 1, dqpn);
    ack_psn[0] = ackreq ? 0x80 : 0;
    Store24(ack_psn + 1, p);
  }
};

// RDMA Extended Transport Header (IBTA 9.3.3).
struct Reth {
  uint8_t va[8];
  uint8_t rkey[4];
  uint8_t dma_len[4];
  uint64_t addr() const { return Load64(va); }
  uint32_t key() const { return Load32(rkey); }
  uint32_t length() const { return Load32(dma_len); }
  void Set(uint64_t a, uint32_t k, uint32_t len) {
    Store64(va, a);
    Store32(rkey, k);
    Store32(dma_len, len);
  }
};

// ACK Extended Transport Header (IBTA 9.3.5): syndrome + message sequence number.
struct Aeth {
  uint8_t syndrome;
  uint8_t msn[3];
  uint32_t msn_value() const { return Load24(msn); }
  void Set(uint8_t s, uint32_t m) {
    syndrome = s;
    Store24(msn, m);
  }
};

// Atomic Extended Transport Header (IBTA 9.3.4).
struct AtomicEth {
  uint8_t va[8];
  uint8_t rkey[4];
  uint8_t swap_add[8];
  uint8_t compare[8];
  uint64_t addr() const { return Load64(va); }
  uint32_t key() const { return Load32(rkey); }
  uint64_t swap_add_value() const { return Load64(swap_add); }
  uint64_t compare_value() const { return Load64(compare); }
  void Set(uint64_t a, uint32_t k, uint64_t sa, uint64_t cmp) {
    Store64(va, a);
    Store32(rkey, k);
    Store64(swap_add, sa);
    Store64(compare, cmp);
  }
};

// Atomic Acknowledge Extended Transport Header: the original remote value.
struct AtomicAckEth {
  uint8_t orig[8];
  uint64_t value() const { return Load64(orig); }
  void Set(uint64_t v) { Store64(orig, v); }
};

// Immediate data: carried opaquely; verbs hands it over already in network order.
struct ImmDt {
  uint8_t data[4];
};

// Invalidate Extended Transport Header (SEND_WITH_INV).
struct Ieth {
  uint8_t rkey[4];
  uint32_t key() const { return Load32(rkey); }
  void Set(uint32_t k) { Store32(rkey, k); }
};

// Datagram Extended Transport Header (UD).
struct Deth {
  uint8_t qkey[4];
  uint8_t src_qp[4];  // reserved:8 SrcQP:24
  uint32_t qkey_value() const { return Load32(qkey); }
  uint32_t src_qpn() const { return Load24(src_qp + 1); }
  void Set(uint32_t qk, uint32_t sqpn) {
    Store32(qkey, qk);
    src_qp[0] = 0;
    Store24(src_qp + 1, sqpn);
  }
};

// XRC Extended Transport Header.
struct XrcEth {
  uint8_t srqn[4];
  uint32_t value() const { return Load24(srqn + 1); }
  void Set(uint32_t n) {
    srqn[0] = 0;
    Store24(srqn + 1, n);
  }
};

// softrdma's own header (the opcodes IBTA leaves to manufacturers): a SEND that entered an XRC
// target QP in one process, relayed to the process that owns the XRC SRQ it names, with what the
// owner needs to check the domain and to complete (docs/wire-protocol.md, "XRC relay").
struct XrcRelayEth {
  uint8_t dev[8];  // the domain's file: device and inode, as fstat(2) gives them
  uint8_t ino[8];
  uint8_t tgt_qpn[4];  // the target QP (the completion's qp_num)
  uint8_t src_qpn[4];  // the initiator (the completion's src_qp)
  uint8_t imm[4];      // immediate data (network order, as it travelled) or invalidated rkey
  uint8_t flags;
  uint8_t sl;
  uint8_t slid[2];
  static constexpr uint8_t kImm = 1, kInv = 2, kSolicited = 4;
  uint64_t dev_value() const { return Load64(dev); }
  uint64_t ino_value() const { return Load64(ino); }
  uint32_t tgt_qpn_value() const { return Load32(tgt_qpn); }
  uint32_t src_qpn_value() const { return Load32(src_qpn); }
  uint16_t slid_value() const { return Load16(slid); }
};

// Global Route Header (IBTA 8.3), identical to the 40 bytes a UD receive buffer starts with.
struct Grh {
  uint8_t ver_tclass_flow[4];  // IPVer:4 TClass:8 FlowLabel:20
  uint8_t pay_len[2];
  uint8_t next_hdr;
  uint8_t hop_limit;
  uint8_t sgid[16];
  uint8_t dgid[16];
  void Set(uint8_t tclass, uint32_t flow, uint16_t len, uint8_t hops, const uint8_t* s,
           const uint8_t* d) {
    Store32(ver_tclass_flow, (6u << 28) | (uint32_t{tclass} << 20) | (flow & 0xfffff));
    Store16(pay_len, len);
    next_hdr = 0x1b;  // IBA transport follows
    hop_limit = hops;
    std::memcpy(sgid, s, 16);
    std::memcpy(dgid, d, 16);
  }
  uint8_t tclass() const { return static_cast<uint8_t>(Load32(ver_tclass_flow) >> 20); }
  uint32_t flow_label() const { return Load32(ver_tclass_flow) & 0xfffff; }
};

// Local Route Header (IBTA 7.7): carries the LIDs of UD datagrams so a receiver can report slid.
struct Lrh {
  uint8_t vl_lver;
  uint8_t sl_lnh;  // SL:4 reserved:2 LNH:2 (3 = IBA global: a GRH follows)
  uint8_t dlid[2];
  uint8_t pkt_len[2];
  uint8_t slid[2];
  uint8_t sl() const { return sl_lnh >> 4; }
  uint16_t dlid_value() const { return Load16(dlid); }
  uint16_t slid_value() const { return Load16(slid); }
  static constexpr uint8_t kLnhLocal = 2, kLnhGlobal = 3;
  bool has_grh() const { return (sl_lnh & 3) == kLnhGlobal; }
  void Set(uint8_t sl, uint16_t d, uint16_t s, bool grh) {
    vl_lver = 0;
    sl_lnh = static_cast<uint8_t>((sl << 4) | (grh ? kLnhGlobal : kLnhLocal));
    Store16(dlid, d);
    Store16(pkt_len, 0);
    Store16(slid, s);
  }
};

#pragma pack(pop)

static_assert(sizeof(Bth) == 12 && offsetof(Bth, dest_qp) == 4 && offsetof(Bth, ack_psn) == 8);
static_assert(sizeof(Reth) == 16 && offsetof(Reth, rkey) == 8 && offsetof(Reth, dma_len) == 12);
static_assert(sizeof(Aeth) == 4);
static_assert(sizeof(AtomicEth) == 28 && offsetof(AtomicEth, swap_add) == 12 &&
              offsetof(AtomicEth, compare) == 20);
static_assert(sizeof(AtomicAckEth) == 8);
static_assert(sizeof(ImmDt) == 4 && sizeof(Ieth) == 4 && sizeof(XrcEth) == 4);
static_assert(sizeof(Deth) == 8 && offsetof(Deth, src_qp) == 4);
static_assert(sizeof(XrcRelayEth) == 32 && offsetof(XrcRelayEth, tgt_qpn) == 16 &&
              offsetof(XrcRelayEth, imm) == 24 && offsetof(XrcRelayEth, slid) == 30);
static_assert(sizeof(Grh) == 40 && offsetof(Grh, sgid) == 8 && offsetof(Grh, dgid) == 24);
static_assert(sizeof(Lrh) == 8 && offsetof(Lrh, slid) == 6);

// AETH syndromes (IBTA 9.7.5.1): top 3 bits select ACK / RNR NAK / NAK.
namespace aeth {
constexpr uint8_t kAck = 0x1f;     // ACK, credit field "invalid" (no end-to-end credits)
constexpr uint8_t kRnrNak = 0x20;  // | 5-bit RNR timer code
constexpr uint8_t kNak = 0x60;     // | NAK code below
constexpr uint8_t kNakPsnSeqError = 0;
constexpr uint8_t kNakInvalidRequest = 1;
constexpr uint8_t kNakRemoteAccess = 2;
constexpr uint8_t kNakRemoteOperation = 3;
inline bool IsAck(uint8_t s) {
  return (s & 0xe0) == 0x00;
}
inline bool IsRnr(uint8_t s) {
  return (s & 0xe0) == kRnrNak;
}
inline bool IsNak(uint8_t s) {
  return (s & 0xe0) == kNak;
}
}  // namespace aeth

// PSN arithmetic on the 24-bit circle: negative when a is before b.
inline int32_t PsnDiff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>((a - b) << 8) >> 8;
}

}  // namespace softrdma::wire
