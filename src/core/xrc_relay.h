// XRC across processes: a SEND that enters an XRC target QP in one process but names an XRC SRQ
// of another process of the same domain (two processes that opened the same file) is relayed to
// that process over the ordinary link. The owner checks the domain, takes the SRQ's WQE, places
// the data, completes on the SRQ's CQ and answers; the target acknowledges the initiator only
// then. See docs/architecture.md §13 and docs/wire-protocol.md, "XRC relay".
#pragma once

#include "core/qp.h"

namespace softrdma::core {

class Hca;

// Messages larger than this are not relayed (the target holds a relayed message in memory until
// it is answered): NAK invalid request, as for an unknown SRQ.
constexpr uint32_t kMaxRelayBytes = 4u << 20;

// The owner's side: Hca::OnFrameHeader for op::kXrcRelaySend.
void ReceiveXrcRelay(Hca& hca, link::Channel& ch, const Packet& p, link::RxTarget& t);

}  // namespace softrdma::core
