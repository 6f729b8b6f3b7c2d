// The link header that delimits frames on a byte stream, and the hello that opens a connection.
// This is the only code that parses bytes an untrusted peer chose before the core sees them, so it
// is small, bounds-checked, and fuzzed (tests/fuzz/frame_decoder_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "link/link.h"

namespace softrdma::link {

constexpr uint8_t kWireVersion = 2;
constexpr uint32_t kMaxFramePayload = 0x80000000u;  // the port's max_msg_sz

#pragma pack(push, 1)
struct LinkHeader {
  uint8_t frame_len[4];  // big-endian: bytes after this header (IB headers + payload)
  uint8_t version;
  uint8_t hdr_len;  // IB header bytes that follow; the rest of frame_len is payload
  uint8_t flags;    // kLinkFlag*
  uint8_t reserved;
};
struct Hello {
  uint8_t magic[4];  // "SRDM"
  uint8_t version;
  uint8_t features;  // kHello*: what the sender reads beyond version 2's first form
  uint8_t reserved[2];
  uint8_t node_id[kNodeIdBytes];
};
#pragma pack(pop)
static_assert(sizeof(LinkHeader) == 8);
static_assert(offsetof(LinkHeader, flags) == 6);

// The frame is a datagram: once the receiver has consumed it (delivered or dropped), it counts
// the frame's bytes, link header included, in its next credit.
constexpr uint8_t kLinkFlagDatagram = 0x01;
// A link-only frame without IB headers: its kCreditBytes of "header" are the big-endian count of
// datagram bytes the sender of the credit has consumed on this connection so far.
constexpr uint8_t kLinkFlagCredit = 0x02;
constexpr uint32_t kCreditBytes = 8;
constexpr size_t kCreditFrameBytes = sizeof(LinkHeader) + kCreditBytes;
// An RC request with an acknowledgement riding on it: the kRiderAckBytes after the link header
// are a big-endian PSN (top byte zero) that acknowledges, for the request's destination QP, every
// request up to it, as an ACK frame just before this one would. They count in frame_len, not in
// hdr_len. Sent only to peers whose hello has kHelloReadsRiderAcks.
constexpr uint8_t kLinkFlagAck = 0x04;
constexpr uint32_t kRiderAckBytes = 4;
// Hello.features: the sender reads kLinkFlagAck. Peers before it send zero there and never read it.
constexpr uint8_t kHelloReadsRiderAcks = 0x01;
static_assert(sizeof(Hello) == 24);
static_assert(offsetof(Hello, features) == 5);

struct DecodedHeader {
  uint32_t hdr_len;
  uint32_t payload_len;
  uint8_t flags;
  uint32_t rider_bytes;  // kRiderAckBytes with kLinkFlagAck, else 0
};

// Validates a link header. Returns false for anything a well-behaved peer never sends.
bool DecodeLinkHeader(const uint8_t* p, DecodedHeader* out);
// frame_len counts the rider when `flags` has kLinkFlagAck.
void EncodeLinkHeader(uint8_t* p, uint32_t hdr_len, uint32_t payload_len, uint8_t flags = 0);
// The link header of `f` and, when an ACK rides on it, the rider: the bytes written
// (FrameHeadBytes(f), at most kMaxFrameHeadBytes).
constexpr size_t kMaxFrameHeadBytes = sizeof(LinkHeader) + kRiderAckBytes;
size_t EncodeFrameHead(uint8_t* p, const OutFrame& f);
inline size_t FrameHeadBytes(const OutFrame& f) {
  return sizeof(LinkHeader) + (f.rider_ack != kNoRiderAck ? kRiderAckBytes : 0);
}
// The PSN a rider acknowledges; false for a rider no well-behaved peer sends.
bool DecodeRiderAck(const uint8_t* rider, uint32_t* psn);
// A whole credit frame (kCreditFrameBytes).
void EncodeCredit(uint8_t* p, uint64_t consumed);
// The count of a credit frame whose link header was decoded; `body` follows that header.
uint64_t DecodeCredit(const uint8_t* body);
bool DecodeHello(const uint8_t* p, NodeId* out, uint8_t* features = nullptr);
void EncodeHello(uint8_t* p, const NodeId& id);

}  // namespace softrdma::link
