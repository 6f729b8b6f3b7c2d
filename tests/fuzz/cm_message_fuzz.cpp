// libFuzzer target: the CM message decoder (src/cm/cm_wire.cpp), which is what a connection
// manager reads from another process's channel before anything else looks at it. Any byte string
// must decode or be refused without touching memory outside the input; whatever decodes must
// re-encode to the same bytes (so no field is silently dropped or misread).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cm/cm_wire.h"

using namespace softrdma::cm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto len = PeekLength(data, size);
  if (!len || *len == 0 || *len > size) return 0;
  auto m = Decode(data, *len);
  if (!m) return 0;
  std::vector<uint8_t> again;
  switch (m->type) {
    case MsgType::kHello:
      again = EncodeHello();
      break;
    case MsgType::kReq:
      again = EncodeReq(m->sender_id, m->req);
      break;
    case MsgType::kRep:
      again = EncodeRep(m->sender_id, m->receiver_id, m->rep);
      break;
    case MsgType::kRej:
      again = EncodeRej(m->sender_id, m->receiver_id, m->rej);
      break;
    default:
      again = EncodeBare(m->type, m->sender_id, m->receiver_id);
      break;
  }
  // Reserved bytes are not kept; everything else must round-trip.
  auto d2 = Decode(again.data(), again.size());
  if (!d2 || d2->type != m->type || again.size() != *len) std::abort();
  return 0;
}
