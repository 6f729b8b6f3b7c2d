// Connection-manager messages between two softrdma processes (docs/wire-protocol.md §10).
//
// The messages play the parts of the IB CM MADs (REQ, REP, RTU, REJ, DREQ, DREP; SIDR for UD)
// on a TCP channel between the two processes' CM services. Every message starts with a 16-byte
// header; multi-byte fields are big-endian. Layouts are packed and pinned by static_assert, and
// Decode() validates a message completely before anyone looks at it: a message that fails is a
// protocol violation and costs the sender its channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace softrdma::cm {

constexpr uint32_t kCmMagic = 0x5352434d;  // "SRCM"
constexpr uint8_t kCmWireVersion = 1;
constexpr size_t kMaxPrivateData = 255;  // the length travels in one byte

enum class MsgType : uint8_t {
  kHello = 1,
  kReq = 2,  // REQ, or SIDR_REQ when qp_type is UD
  kRep = 3,  // REP, or SIDR_REP
  kRtu = 4,
  kRej = 5,
  kDreq = 6,
  kDrep = 7,
};

#pragma pack(push, 1)

struct MsgHeader {
  uint8_t version;
  uint8_t type;
  uint8_t length[2];       // whole message, header included
  uint8_t sender_id[4];    // the sender's communication id
  uint8_t receiver_id[4];  // the receiver's communication id (0 in a REQ)
  uint8_t reserved[4];
};
static_assert(sizeof(MsgHeader) == 16);
static_assert(offsetof(MsgHeader, sender_id) == 4 && offsetof(MsgHeader, receiver_id) == 8);

struct HelloBody {
  uint8_t magic[4];
  uint8_t reserved[4];
};
static_assert(sizeof(HelloBody) == 8);

// An address as sockaddr family + IPv6 (IPv4 mapped as ::ffff:a.b.c.d) + port.
struct WireAddr {
  uint8_t family;  // 4 or 6
  uint8_t reserved;
  uint8_t port[2];
  uint8_t ip[16];
};
static_assert(sizeof(WireAddr) == 20);

// The sender's side of a connection, as both REQ and REP carry it: its QP, how to reach it, and
// what it offers.
struct WireConnEnd {
  uint8_t qpn[4];
  uint8_t psn[4];
  uint8_t gid[16];
  uint8_t lid[2];
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t flow_control;
  uint8_t rnr_retry_count;
  uint8_t flags;  // kFlagSrq
  uint8_t private_data_len;
  uint8_t ece_vendor_id[4];
  uint8_t ece_options[4];
  uint8_t qkey[4];
};
static_assert(sizeof(WireConnEnd) == 44);
static_assert(offsetof(WireConnEnd, private_data_len) == 31);

struct ReqBody {
  uint8_t port_space[2];
  uint8_t qp_type;
  uint8_t retry_count;  // applies to both QPs
  WireAddr src;
  WireAddr dst;
  WireConnEnd end;
};
static_assert(sizeof(ReqBody) == 88);
static_assert(offsetof(ReqBody, src) == 4 && offsetof(ReqBody, end) == 44);

struct RepBody {
  WireConnEnd end;
  uint8_t status[4];  // SIDR_REP: 0 = accepted
};
static_assert(sizeof(RepBody) == 48);

struct RejBody {
  uint8_t reason[4];
  uint8_t private_data_len;
  uint8_t reserved[3];
};
static_assert(sizeof(RejBody) == 8);

#pragma pack(pop)

constexpr uint8_t kFlagSrq = 0x01;
constexpr size_t kMaxMessage = sizeof(MsgHeader) + sizeof(ReqBody) + kMaxPrivateData;

// REJ reasons (IBTA table 112 where one fits).
constexpr uint32_t kRejNoListener = 8;                 // invalid service id
constexpr uint32_t kRejConsumer = 28;                  // rdma_reject()
constexpr uint32_t kRejVendorOptionNotSupported = 35;  // rdma_reject_ece()
constexpr uint32_t kRejBacklogFull = 4;                // no resources

// Host-side forms of the messages.
struct Addr {
  uint8_t family = 0;  // 4 or 6
  uint16_t port = 0;
  uint8_t ip[16] = {};
};

struct ConnEnd {
  uint32_t qpn = 0, psn = 0;
  uint8_t gid[16] = {};
  uint16_t lid = 0;
  uint8_t responder_resources = 0, initiator_depth = 0, flow_control = 0, rnr_retry_count = 0,
          flags = 0;
  uint32_t ece_vendor_id = 0, ece_options = 0, qkey = 0;
  std::vector<uint8_t> private_data;
};

struct Req {
  uint16_t port_space = 0;
  uint8_t qp_type = 0;
  uint8_t retry_count = 0;
  Addr src, dst;
  ConnEnd end;
};

struct Rep {
  ConnEnd end;
  uint32_t status = 0;
};

struct Rej {
  uint32_t reason = 0;
  std::vector<uint8_t> private_data;
};

struct Message {
  MsgType type{};
  uint32_t sender_id = 0, receiver_id = 0;
  Req req;  // kReq
  Rep rep;  // kRep
  Rej rej;  // kRej
};

std::vector<uint8_t> EncodeHello();
std::vector<uint8_t> EncodeReq(uint32_t sender, const Req& r);
std::vector<uint8_t> EncodeRep(uint32_t sender, uint32_t receiver, const Rep& r);
std::vector<uint8_t> EncodeRej(uint32_t sender, uint32_t receiver, const Rej& r);
// RTU, DREQ, DREP: a header alone.
std::vector<uint8_t> EncodeBare(MsgType type, uint32_t sender, uint32_t receiver);

// Length of the message at the start of `p` once its header is in (0 if fewer than 16 bytes),
// or nullopt when the header already shows a violation.
std::optional<size_t> PeekLength(const uint8_t* p, size_t n);
// A whole message; nullopt on any violation (bad version, type, length, field ranges).
std::optional<Message> Decode(const uint8_t* p, size_t n);

}  // namespace softrdma::cm
