// A child process owning an XRC SRQ of a file-named domain, driven by its parent through a pipe
// (xrc_process_test, xrc_sharing_test).
#pragma once

#include <infiniband/verbs.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "support/semantics_harness.h"

namespace semantics {

struct ChildWc {
  uint64_t wr_id;
  uint32_t status, byte_len, qp_num, src_qp, imm, wc_flags;
  char data[16];
};

inline constexpr uint64_t kChildWrBase = 1000;

// The SRQ's owner: opens the domain file given, reports its SRQ number, then obeys the parent:
// 'P' posts one receive, 'W' waits for one completion and reports it ('N' when none came),
// 'Q' reports how many completions came within a quiet spell, 'X' exits.
inline int SrqOwner(ChildPipe p, const std::string& file) {
  Verbs v;
  if (!v.Open()) return 10;
  int fd = open(file.c_str(), O_RDONLY);
  if (fd < 0) return 11;
  ibv_xrcd_init_attr xa{};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = fd;
  xa.oflags = O_CREAT;
  ibv_xrcd* xrcd = ibv_open_xrcd(v.ctx, &xa);
  ibv_cq* cq = v.NewCq(16);
  Buffer* buf = v.NewBuffer(4096);
  if (!xrcd || !cq || !buf) return 12;
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  sa.comp_mask =
      IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  sa.srq_type = IBV_SRQT_XRC;
  sa.pd = v.pd;
  sa.xrcd = xrcd;
  sa.cq = cq;
  ibv_srq* srq = ibv_create_srq_ex(v.ctx, &sa);
  uint32_t srqn = 0;
  if (!srq || ibv_get_srq_num(srq, &srqn)) return 13;
  if (!p.Send(srqn)) return 14;
  int posted = 0;
  for (;;) {
    char cmd = 0;
    if (!p.Recv(&cmd)) return 15;
    if (cmd == 'P') {
      ibv_sge sge = buf->Sge(static_cast<size_t>(posted) * 64, 64);
      ibv_recv_wr wr{};
      ibv_recv_wr* bad = nullptr;
      wr.wr_id = kChildWrBase + static_cast<uint64_t>(posted++);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      if (ibv_post_srq_recv(srq, &wr, &bad)) return 16;
    } else if (cmd == 'W') {
      ibv_wc wc{};
      if (!PollOne(cq, &wc)) {
        if (!p.Send('N')) return 17;
        continue;
      }
      ChildWc r{wc.wr_id,  wc.status,   wc.byte_len, wc.qp_num,
                wc.src_qp, wc.imm_data, wc.wc_flags, {}};
      size_t slot = wc.wr_id >= kChildWrBase ? wc.wr_id - kChildWrBase : 0;
      std::memcpy(r.data, buf->data() + slot * 64, sizeof r.data);
      if (!p.Send('C') || !p.Send(r)) return 18;
    } else if (cmd == 'Q') {
      if (!p.Send(static_cast<uint32_t>(Drain(cq, milliseconds(200)).size()))) return 19;
    } else {
      break;
    }
  }
  ibv_destroy_srq(srq);
  ibv_close_xrcd(xrcd);
  close(fd);
  return 0;
}

}  // namespace semantics
