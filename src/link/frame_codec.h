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
  uint8_t reserved[3];
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
static_assert(sizeof(Hello) == 24);

struct DecodedHeader {
  uint32_t hdr_len;
  uint32_t payload_len;
  uint8_t flags;
};

// Validates a link header. Returns false for anything a well-behaved peer never sends.
bool DecodeLinkHeader(const uint8_t* p, DecodedHeader* out);
void EncodeLinkHeader(uint8_t* p, uint32_t hdr_len, uint32_t payload_len, uint8_t flags = 0);
// A whole credit frame (kCreditFrameBytes).
void EncodeCredit(uint8_t* p, uint64_t consumed);
// The count of a credit frame whose link header was decoded; `body` follows that header.
uint64_t DecodeCredit(const uint8_t* body);
bool DecodeHello(const uint8_t* p, NodeId* out);
void EncodeHello(uint8_t* p, const NodeId& id);

}  // namespace softrdma::link
