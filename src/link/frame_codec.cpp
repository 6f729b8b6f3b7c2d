#include "link/frame_codec.h"

#include <cstring>
#include <time.h>

namespace softrdma::link {

bool DecodeLinkHeader(const uint8_t* p, DecodedHeader* out) {
  const auto* h = reinterpret_cast<const LinkHeader*>(p);
  uint32_t frame_len = uint32_t{h->frame_len[0]} << 24 | uint32_t{h->frame_len[1]} << 16 |
                       uint32_t{h->frame_len[2]} << 8 | h->frame_len[3];
  if (h->version != kWireVersion) return false;
  if (h->hdr_len == 0 || h->hdr_len > kMaxHeaderBytes) return false;
  if (frame_len < h->hdr_len) return false;
  if (frame_len - h->hdr_len > kMaxFramePayload) return false;
  if (h->flags & ~(kLinkFlagDatagram | kLinkFlagCredit | kLinkFlagAck)) return false;
  if ((h->flags & kLinkFlagCredit) &&
      (h->flags != kLinkFlagCredit || h->hdr_len != kCreditBytes || frame_len != kCreditBytes))
    return false;
  // Acknowledgements ride on RC requests only, never on datagrams.
  const uint32_t rider = (h->flags & kLinkFlagAck) ? kRiderAckBytes : 0;
  if (rider && (h->flags & kLinkFlagDatagram)) return false;
  if (frame_len - h->hdr_len < rider) return false;
  out->hdr_len = h->hdr_len;
  out->payload_len = frame_len - h->hdr_len - rider;
  out->flags = h->flags;
  out->rider_bytes = rider;
  return true;
}

void EncodeCredit(uint8_t* p, uint64_t consumed) {
  EncodeLinkHeader(p, kCreditBytes, 0, kLinkFlagCredit);
  for (uint32_t i = 0; i < kCreditBytes; ++i)
    p[sizeof(LinkHeader) + i] = static_cast<uint8_t>(consumed >> (8 * (kCreditBytes - 1 - i)));
}

uint64_t DecodeCredit(const uint8_t* body) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < kCreditBytes; ++i) v = v << 8 | body[i];
  return v;
}

void EncodeLinkHeader(uint8_t* p, uint32_t hdr_len, uint32_t payload_len, uint8_t flags) {
  auto* h = reinterpret_cast<LinkHeader*>(p);
  uint32_t frame_len = hdr_len + payload_len + ((flags & kLinkFlagAck) ? kRiderAckBytes : 0);
  h->frame_len[0] = static_cast<uint8_t>(frame_len >> 24);
  h->frame_len[1] = static_cast<uint8_t>(frame_len >> 16);
  h->frame_len[2] = static_cast<uint8_t>(frame_len >> 8);
  h->frame_len[3] = static_cast<uint8_t>(frame_len);
  h->version = kWireVersion;
  h->hdr_len = static_cast<uint8_t>(hdr_len);
  h->flags = flags;
  h->reserved = 0;
}

size_t EncodeFrameHead(uint8_t* p, const OutFrame& f) {
  const bool rider = f.rider_ack != kNoRiderAck;
  uint8_t flags = (f.datagram ? kLinkFlagDatagram : 0) | (rider ? kLinkFlagAck : 0);
  EncodeLinkHeader(p, f.hdr_len, f.payload_len, flags);
  if (!rider) return sizeof(LinkHeader);
  uint8_t* r = p + sizeof(LinkHeader);
  r[0] = 0;
  r[1] = static_cast<uint8_t>(f.rider_ack >> 16);
  r[2] = static_cast<uint8_t>(f.rider_ack >> 8);
  r[3] = static_cast<uint8_t>(f.rider_ack);
  return sizeof(LinkHeader) + kRiderAckBytes;
}

bool DecodeRiderAck(const uint8_t* rider, uint32_t* psn) {
  if (rider[0] != 0) return false;
  *psn = uint32_t{rider[1]} << 16 | uint32_t{rider[2]} << 8 | rider[3];
  return true;
}

bool DecodeHello(const uint8_t* p, NodeId* out, uint8_t* features) {
  const auto* h = reinterpret_cast<const Hello*>(p);
  if (std::memcmp(h->magic, "SRDM", 4) != 0 || h->version != kWireVersion) return false;
  std::memcpy(out->bytes, h->node_id, kNodeIdBytes);
  if (features) *features = h->features;
  return true;
}

void EncodeHello(uint8_t* p, const NodeId& id) {
  auto* h = reinterpret_cast<Hello*>(p);
  std::memcpy(h->magic, "SRDM", 4);
  h->version = kWireVersion;
  h->features = kHelloReadsRiderAcks;
  std::memset(h->reserved, 0, sizeof h->reserved);
  std::memcpy(h->node_id, id.bytes, kNodeIdBytes);
}

void OutFrame::OwnPayload() {
  if (nseg == 0 || (!owned.empty() && nseg == 1 && seg[0].iov_base == owned.data())) return;
  std::vector<uint8_t> copy(payload_len);
  size_t at = 0;
  for (int i = 0; i < nseg; ++i) {
    if (seg[i].iov_len) std::memcpy(copy.data() + at, seg[i].iov_base, seg[i].iov_len);
    at += seg[i].iov_len;
  }
  owned = std::move(copy);
  nseg = 1;
  seg[0] = iovec{owned.data(), owned.size()};
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int64_t CoarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace softrdma::link
