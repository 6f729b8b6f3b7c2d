// Per-frame state the engines keep between a frame's header and its end. It lives in the link's
// RxTarget scratch area, so an inbound frame costs no allocation.
#pragma once

#include <cstring>
#include <type_traits>

#include "core/qp.h"

namespace softrdma::core {

struct Qp::RxWork {
  enum Kind : uint8_t { kDrop, kRecv, kWrite, kReadResponse, kAtomicResponse, kRelay };
  Kind kind;
  bool solicited;
  bool has_recv;
  bool is_response;
  ibv_wc_opcode wc_opcode;
  ibv_wc_status recv_status;
  uint8_t nak;  // kNoNak or the AETH NAK code to send at the end
  uint32_t psn;
  uint32_t imm;
  uint32_t wc_flags;
  uint32_t byte_len;
  uint32_t src_qp;
  uint16_t slid;
  uint8_t sl;
  uint64_t wr_id;
  uint64_t wqe_index;
  // XRC_RECV: the SRQ the XRCETH named (its PD checks keys, its CQ completes). Valid during the
  // header only; later steps look the number up again, since the SRQ may go meanwhile.
  Srq* xrc_srq;
  uint32_t xrc_srqn;
  RecvWqe recv;  // the receive WQE this message took, to give back if it never completes
  static constexpr uint8_t kNoNak = 0xff;
  // A frame's state from its header on. `recv` is left as it is: has_recv says whether it holds a
  // WQE, and zeroing its 32 SGEs with the rest cost every inbound frame 600 bytes of stores.
  void Clear() {
    std::memset(static_cast<void*>(this), 0, offsetof(RxWork, recv));
    kind = kDrop;
    nak = kNoNak;
  }
};

inline Qp::RxWork& WorkOf(link::RxTarget& t) {
  static_assert(std::is_trivially_copyable_v<Qp::RxWork>);
  static_assert(sizeof(Qp::RxWork) <= sizeof(t.scratch));  // see link.h
  return *reinterpret_cast<Qp::RxWork*>(t.scratch);
}

// States in which inbound requests execute.
inline bool ResponderActive(ibv_qp_state s) {
  return s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE;
}

}  // namespace softrdma::core
