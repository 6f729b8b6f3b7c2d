#include "cm/cm_wire.h"

#include <cstring>

#include "core/wire.h"

namespace softrdma::cm {

using wire::Load16;
using wire::Load32;
using wire::Store16;
using wire::Store32;

namespace {

std::vector<uint8_t> Start(MsgType type, uint32_t sender, uint32_t receiver, size_t body) {
  std::vector<uint8_t> out(sizeof(MsgHeader) + body, 0);
  auto* h = reinterpret_cast<MsgHeader*>(out.data());
  h->version = kCmWireVersion;
  h->type = static_cast<uint8_t>(type);
  Store32(h->sender_id, sender);
  Store32(h->receiver_id, receiver);
  return out;
}

void Finish(std::vector<uint8_t>* out, const std::vector<uint8_t>& private_data) {
  out->insert(out->end(), private_data.begin(), private_data.end());
  Store16(reinterpret_cast<MsgHeader*>(out->data())->length, static_cast<uint16_t>(out->size()));
}

void PutAddr(WireAddr* w, const Addr& a) {
  w->family = a.family;
  Store16(w->port, a.port);
  std::memcpy(w->ip, a.ip, 16);
}

bool GetAddr(const WireAddr& w, Addr* a) {
  if (w.family != 4 && w.family != 6) return false;
  a->family = w.family;
  a->port = Load16(w.port);
  std::memcpy(a->ip, w.ip, 16);
  return true;
}

void PutConnEnd(WireConnEnd* w, const ConnEnd& e) {
  Store32(w->qpn, e.qpn);
  Store32(w->psn, e.psn);
  std::memcpy(w->gid, e.gid, 16);
  Store16(w->lid, e.lid);
  w->responder_resources = e.responder_resources;
  w->initiator_depth = e.initiator_depth;
  w->flow_control = e.flow_control;
  w->rnr_retry_count = e.rnr_retry_count;
  w->flags = e.flags;
  w->private_data_len = static_cast<uint8_t>(e.private_data.size());
  Store32(w->ece_vendor_id, e.ece_vendor_id);
  Store32(w->ece_options, e.ece_options);
  Store32(w->qkey, e.qkey);
}

// All but the private data, which follows the message's fixed body.
bool GetConnEnd(const WireConnEnd& w, ConnEnd* e) {
  e->qpn = Load32(w.qpn);
  e->psn = Load32(w.psn);
  if (e->qpn > 0xffffff || e->psn > 0xffffff) return false;
  std::memcpy(e->gid, w.gid, 16);
  e->lid = Load16(w.lid);
  e->responder_resources = w.responder_resources;
  e->initiator_depth = w.initiator_depth;
  e->flow_control = w.flow_control;
  e->rnr_retry_count = w.rnr_retry_count;
  if (e->rnr_retry_count > 7) return false;
  e->flags = w.flags;
  e->ece_vendor_id = Load32(w.ece_vendor_id);
  e->ece_options = Load32(w.ece_options);
  e->qkey = Load32(w.qkey);
  return true;
}

}  // namespace

std::vector<uint8_t> EncodeHello() {
  auto out = Start(MsgType::kHello, 0, 0, sizeof(HelloBody));
  Store32(reinterpret_cast<HelloBody*>(out.data() + sizeof(MsgHeader))->magic, kCmMagic);
  Finish(&out, {});
  return out;
}

std::vector<uint8_t> EncodeReq(uint32_t sender, const Req& r) {
  auto out = Start(MsgType::kReq, sender, 0, sizeof(ReqBody));
  auto* b = reinterpret_cast<ReqBody*>(out.data() + sizeof(MsgHeader));
  Store16(b->port_space, r.port_space);
  b->qp_type = r.qp_type;
  b->retry_count = r.retry_count;
  PutAddr(&b->src, r.src);
  PutAddr(&b->dst, r.dst);
  PutConnEnd(&b->end, r.end);
  Finish(&out, r.end.private_data);
  return out;
}

std::vector<uint8_t> EncodeRep(uint32_t sender, uint32_t receiver, const Rep& r) {
  auto out = Start(MsgType::kRep, sender, receiver, sizeof(RepBody));
  auto* b = reinterpret_cast<RepBody*>(out.data() + sizeof(MsgHeader));
  PutConnEnd(&b->end, r.end);
  Store32(b->status, r.status);
  Finish(&out, r.end.private_data);
  return out;
}

std::vector<uint8_t> EncodeRej(uint32_t sender, uint32_t receiver, const Rej& r) {
  auto out = Start(MsgType::kRej, sender, receiver, sizeof(RejBody));
  auto* b = reinterpret_cast<RejBody*>(out.data() + sizeof(MsgHeader));
  Store32(b->reason, r.reason);
  b->private_data_len = static_cast<uint8_t>(r.private_data.size());
  Finish(&out, r.private_data);
  return out;
}

std::vector<uint8_t> EncodeBare(MsgType type, uint32_t sender, uint32_t receiver) {
  auto out = Start(type, sender, receiver, 0);
  Finish(&out, {});
  return out;
}

std::optional<size_t> PeekLength(const uint8_t* p, size_t n) {
  if (n < sizeof(MsgHeader)) return size_t{0};
  const auto* h = reinterpret_cast<const MsgHeader*>(p);
  size_t len = Load16(h->length);
  if (h->version != kCmWireVersion || len < sizeof(MsgHeader) || len > kMaxMessage) {
    return std::nullopt;
  }
  return len;
}

std::optional<Message> Decode(const uint8_t* p, size_t n) {
  auto len = PeekLength(p, n);
  if (!len || *len == 0 || *len != n) return std::nullopt;
  const auto* h = reinterpret_cast<const MsgHeader*>(p);
  Message m;
  m.type = static_cast<MsgType>(h->type);
  m.sender_id = Load32(h->sender_id);
  m.receiver_id = Load32(h->receiver_id);
  const uint8_t* body = p + sizeof(MsgHeader);
  size_t body_len = n - sizeof(MsgHeader);
  // The private data, if the message has any, follows its fixed body and is exactly as long as
  // the body says.
  auto take_private = [&](size_t fixed, uint8_t declared, std::vector<uint8_t>* out) {
    if (body_len != fixed + declared) return false;
    out->assign(body + fixed, body + fixed + declared);
    return true;
  };
  switch (m.type) {
    case MsgType::kHello: {
      if (body_len != sizeof(HelloBody)) return std::nullopt;
      if (Load32(reinterpret_cast<const HelloBody*>(body)->magic) != kCmMagic) return std::nullopt;
      return m;
    }
    case MsgType::kReq: {
      if (body_len < sizeof(ReqBody)) return std::nullopt;
      const auto* b = reinterpret_cast<const ReqBody*>(body);
      Req& r = m.req;
      r.port_space = Load16(b->port_space);
      r.qp_type = b->qp_type;
      r.retry_count = b->retry_count;
      if (r.retry_count > 7) return std::nullopt;
      if (!GetAddr(b->src, &r.src) || !GetAddr(b->dst, &r.dst)) return std::nullopt;
      if (!GetConnEnd(b->end, &r.end) ||
          !take_private(sizeof(ReqBody), b->end.private_data_len, &r.end.private_data)) {
        return std::nullopt;
      }
      return m;
    }
    case MsgType::kRep: {
      if (body_len < sizeof(RepBody)) return std::nullopt;
      const auto* b = reinterpret_cast<const RepBody*>(body);
      m.rep.status = Load32(b->status);
      if (!GetConnEnd(b->end, &m.rep.end) ||
          !take_private(sizeof(RepBody), b->end.private_data_len, &m.rep.end.private_data)) {
        return std::nullopt;
      }
      return m;
    }
    case MsgType::kRej: {
      if (body_len < sizeof(RejBody)) return std::nullopt;
      const auto* b = reinterpret_cast<const RejBody*>(body);
      m.rej.reason = Load32(b->reason);
      if (!take_private(sizeof(RejBody), b->private_data_len, &m.rej.private_data)) {
        return std::nullopt;
      }
      return m;
    }
    case MsgType::kRtu:
    case MsgType::kDreq:
    case MsgType::kDrep:
      if (body_len != 0) return std::nullopt;
      return m;
  }
  return std::nullopt;
}

}  // namespace softrdma::cm
