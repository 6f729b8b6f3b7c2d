// What takes an inbound frame's payload between its header and its end: a QP, or the owner of an
// XRC SRQ taking a message another process relayed (core/xrc_relay.h). The HCA keeps it in the
// frame's RxTarget::hold as this base, so the frame's end reaches whichever it is.
#pragma once

#include "link/link.h"

namespace softrdma::core {

class FrameReceiver {
 public:
  virtual ~FrameReceiver() = default;
  virtual void RxEnd(link::Channel& ch, link::RxTarget& t) = 0;
  // The channel died before the frame ended.
  virtual void RxAbort(link::RxTarget& t) = 0;
};

}  // namespace softrdma::core
