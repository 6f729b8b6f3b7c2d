// The link header that delimits frames on a byte stream, and the hello that opens a connection.
// This is the only code that parses bytes an untrusted peer chose before the core sees them, so it
// is small, bounds-checked, and fuzzed (tests/fuzz/frame_decoder_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "link/link.h"

namespace softrdma::link {

constexpr uint8_t kWireVersion = 1;
constexpr uint32_t kMaxFramePayload = 0x80000000u;  // the port's max_msg_sz

#pragma pack(push, 1)
struct LinkHeader {
  uint8_t frame_len[4];  // big-endian: bytes after this header (IB headers + payload)
  uint8_t version;
  uint8_t hdr_len;  // IB header bytes that follow; the rest of frame_len is payload
  uint8_t reserved[2];
};
struct Hello {
  uint8_t magic[4];  // "SRDM"
  uint8_t version;
  uint8_t reserved[3];
  uint8_t node_id[kNodeIdBytes];
};
#pragma pack(pop)
static_assert(sizeof(LinkHeader) == 8);
static_assert(sizeof(Hello) == 24);

struct DecodedHeader {
  uint32_t hdr_len;
  uint32_t payload_len;
};

// Validates a link header. Returns false for anything a well-behaved peer never sends.
bool DecodeLinkHeader(const uint8_t* p, DecodedHeader* out);
void EncodeLinkHeader(uint8_t* p, uint32_t hdr_len, uint32_t payload_len);
bool DecodeHello(const uint8_t* p, NodeId* out);
void EncodeHello(uint8_t* p, const NodeId& id);

}  // namespace softrdma::link
