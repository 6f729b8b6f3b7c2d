// One-sided operations on a same-host peer's memory, done by the requester itself: RDMA WRITE,
// READ and atomics reach a region the peer published (link/shared_windows.h) without waiting for
// the peer to wake up and answer. Only when nothing is outstanding on the QP, so the operation
// cannot overtake an earlier one; anything the checks refuse takes the long way, where the
// responder answers with the error the IBTA prescribes.
#include <infiniband/verbs.h>

#include <cstring>

#include "core/hca.h"
#include "core/limits.h"
#include "core/qp.h"
#include "link/place.h"
#include "link/placement_guard.h"
#include "link/shared_windows.h"

namespace softrdma::core {
namespace {

// CAS or FETCH_ADD on the word at `where`, its original value placed at `result` (a local buffer,
// possibly in pages the application made read-only: link/placement_guard.h). False, and nothing
// done, when the word is not 8-byte aligned in this process's mapping: not a CPU atomic here, so
// the responder decides. Otherwise the status of the work request: LOC_PROT_ERR when the result
// could not be placed (the atomic is done, as an HCA's is when its write of the result faults).
bool ApplyAtomic(uint8_t* where, int opcode, uint64_t compare_add, uint64_t swap, uint8_t* result,
                 ibv_wc_status* status) {
  if (reinterpret_cast<uintptr_t>(where) & 7) return false;
  auto* target = reinterpret_cast<uint64_t*>(where);
  uint64_t orig = compare_add;
  if (opcode == IBV_WR_ATOMIC_CMP_AND_SWP)
    __atomic_compare_exchange_n(target, &orig, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  else
    orig = __atomic_fetch_add(target, compare_add, __ATOMIC_SEQ_CST);
  *status = link::StoreGuarded(result, orig) ? IBV_WC_SUCCESS : IBV_WC_LOC_PROT_ERR;
  return true;
}

}  // namespace

// A local piece of a direct operation: the host address of `s`, or nullptr when its key does not
// grant `access` there (the long way then reports it, as LOC_PROT_ERR).
uint8_t* Qp::ResolveLocalPieceLocked(const ibv_sge& s, int access) {
  if (uint8_t* p = hca_.mrs().ResolveLocalCached(s.lkey, pd_, s.addr, s.length, access, mr_cache_))
    return p;
  return ResolveLocalPieceFullyLocked(s, access);
}

// Past the cache: may ask the kernel (a region on demand, ~1 us).
uint8_t* Qp::ResolveLocalPieceFullyLocked(const ibv_sge& s, int access) {
  KeyCheck why;
  return hca_.mrs().Resolve(s.lkey, pd_, s.addr, s.length, access, true, &why, 0, nullptr,
                            &mr_cache_);
}

bool Qp::TryDirectLocked(SendWqe& w) {
  uint32_t right;
  int local_access = IBV_ACCESS_LOCAL_WRITE;
  switch (w.opcode) {
    case IBV_WR_RDMA_WRITE:
      // Writes of every size: handing large ones over by reference, for the receiver's core to
      // copy while ours posts the next, was slower (ib_write_bw 64 KiB: 36.6-39.1 GB/s by
      // reference above 16 KiB, 48.1-49.7 GB/s direct; 1 MiB: 44.5-45.2 and 46.3-47.1 GB/s;
      // memcpy on this host 57.3 and 48.0 GB/s).
      right = IBV_ACCESS_REMOTE_WRITE;
      local_access = 0;
      break;
    case IBV_WR_RDMA_READ:
      right = IBV_ACCESS_REMOTE_READ;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      right = IBV_ACCESS_REMOTE_ATOMIC;
      if (w.num_sge != 1 || w.sge[0].length != 8 || (w.remote_addr & 7)) return false;
      break;
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_WRITE_WITH_IMM:  // takes a receive WQE too (direct_recv.cpp)
      right = link::kRecvRight;       // into the peer's receive buffers (direct_recv.cpp)
      local_access = 0;
      break;
    default:
      return false;
  }
  // A WRITE with immediate of no bytes is how rsockets returns credits.
  const bool empty_ok = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (head_ != next_ || !av_.channel || (w.length == 0 && !empty_ok) || w.length > kMaxMsgSize)
    return false;
  link::PeerWindows* peer = av_.channel->direct();
  if (!peer) return false;

  // Local memory first: a bad lkey is reported by the long way, as LOC_PROT_ERR.
  uint8_t* local[kMaxSge];
  uint32_t lens[kMaxSge];
  uint32_t n = 0;
  bool inline_data = w.num_sge == 0;
  bool remote_seen = right == link::kRecvRight;  // SENDs find their buffers later
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    const ibv_sge& s = w.sge[i];
    if (s.length == 0) continue;
    local[n] =
        hca_.mrs().ResolveLocalCached(s.lkey, pd_, s.addr, s.length, local_access, mr_cache_);
    if (!local[n]) {
      // A remote range the peer does not share (its regions on demand) makes the full check
      // useless, and a post went through here twice before its frame asked a third time.
      if (!remote_seen &&
          !peer->Reach(w.rkey, attr_.dest_qp_num, w.remote_addr, w.length, right, &window_memo_))
        return false;
      remote_seen = true;
      if (!(local[n] = ResolveLocalPieceFullyLocked(s, local_access))) return false;
    }
    lens[n++] = s.length;
  }
  w.status = IBV_WC_SUCCESS;  // an atomic whose result could not be placed says otherwise
  if (right == link::kRecvRight) return TryDirectSendLocked(w, peer, local, lens, n);
  // A WRITE's source the application took away (unmapped, PROT_NONE) since it registered it: the
  // long way fails it as the sender's (requester.cpp). A SEND's is probed by TryDirectSendLocked.
  if (w.opcode == IBV_WR_RDMA_WRITE && !link::Readable(local, lens, n)) return false;

  bool done = true;
  auto op = [&](uint8_t* remote) {
    switch (w.opcode) {
      case IBV_WR_RDMA_WRITE:
        if (inline_data) {
          link::PlaceBytes(remote, w.inline_buf, w.length);
        } else {
          for (uint32_t i = 0; i < n; remote += lens[i], ++i)
            link::PlaceBytes(remote, local[i], lens[i]);
        }
        break;
      case IBV_WR_RDMA_READ:
        // Into pages of ours the application may have made read-only (link/placement_guard.h);
        // refused, the READ goes the long way, which fails it.
        for (uint32_t i = 0; i < n && done; remote += lens[i], ++i)
          done = link::PlaceGuarded(local[i], remote, lens[i]);
        break;
      default:
        done = ApplyAtomic(remote, w.opcode, w.compare_add, w.swap, local[0], &w.status);
    }
  };
  return peer->With(w.rkey, attr_.dest_qp_num, w.remote_addr, w.length, right, op, &window_memo_) ==
             link::PeerWindows::Access::kDone &&
         done;
}

// Copying the work request into the queue, running the requester over it and retiring it cost
// more than a direct operation itself (ib_atomic_bw: a third of the library's time per atomic).
bool Qp::TryPostDirectLocked(const ibv_send_wr& wr) {
  link::PeerWindows* peer = nullptr;
  if (type_ != IBV_QPT_RC || state_ != IBV_QPS_RTS || head_ != tail_ || rnr_resume_at_ != 0 ||
      repath_pending_ || !av_.channel || !(peer = av_.channel->direct()))
    return false;
  if (wr.opcode == IBV_WR_SEND || wr.opcode == IBV_WR_SEND_WITH_IMM)
    return TryPostDirectSendLocked(wr, peer);
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      break;
    default:
      return false;
  }
  const bool atomic =
      wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  if (atomic && TryPostDirectAtomicLocked(wr, peer)) return true;
  if ((wr.opcode == IBV_WR_RDMA_WRITE || wr.opcode == IBV_WR_RDMA_READ) &&
      TryPostDirectRdmaLocked(wr, peer))
    return true;
  if (ValidateWr(wr) != 0) return false;  // refused by the queue's path, which says how
  SendWqe w;
  w.wr_id = wr.wr_id;
  w.opcode = wr.opcode;
  w.send_flags = wr.send_flags;
  w.imm_or_rkey = wr.imm_data;
  w.length = 0;
  if (wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    w.remote_addr = wr.wr.atomic.remote_addr;
    w.rkey = wr.wr.atomic.rkey;
    w.compare_add = wr.wr.atomic.compare_add;
    w.swap = wr.wr.atomic.swap;
  } else {
    w.remote_addr = wr.wr.rdma.remote_addr;
    w.rkey = wr.wr.rdma.rkey;
  }
  if (wr.send_flags & IBV_SEND_INLINE) {
    // Gathered into the inline slot of the WQE this one would have been (unused: the queue is
    // empty).
    w.inline_buf = SqAt(tail_).inline_buf;
    w.length = GatherInline(wr, w.inline_buf);
    w.num_sge = 0;
  } else {
    w.sge = wr.sg_list;
    w.num_sge = static_cast<uint32_t>(wr.num_sge);
    for (int i = 0; i < wr.num_sge; ++i) w.length += wr.sg_list[i].length;
  }
  if (!TryDirectLocked(w)) return false;
  PushSendCompletionLocked(w);
  if (w.status != IBV_WC_SUCCESS) EnterErrorLocked();
  return true;
}

// ib_atomic_bw's case, where copying the work request into a WQE and the generic checks were a
// fifth of the library's time per atomic. Anything unusual goes the general way.
bool Qp::TryPostDirectAtomicLocked(const ibv_send_wr& wr, link::PeerWindows* peer) {
  const ibv_sge* s = wr.sg_list;
  const uint64_t remote_addr = wr.wr.atomic.remote_addr;
  if (wr.num_sge != 1 || !s || cap_.max_send_sge == 0 || s->length != 8 || (remote_addr & 7) ||
      (wr.send_flags & IBV_SEND_INLINE))
    return false;
  uint8_t* local =
      hca_.mrs().ResolveLocalCached(s->lkey, pd_, s->addr, 8, IBV_ACCESS_LOCAL_WRITE, mr_cache_);
  if (!local) return false;
  bool aligned = true;
  ibv_wc_status status = IBV_WC_SUCCESS;
  auto op = [&](uint8_t* remote) {
    aligned =
        ApplyAtomic(remote, wr.opcode, wr.wr.atomic.compare_add, wr.wr.atomic.swap, local, &status);
  };
  if (peer->With(wr.wr.atomic.rkey, attr_.dest_qp_num, remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC, op,
                 &window_memo_) != link::PeerWindows::Access::kDone ||
      !aligned)
    return false;
  PushDirectCompletionLocked(wr, 8, status);
  return true;
}

// From this size a WRITE's source is read by the guarded copy, whose rep movsb is as fast as
// memcpy there (memcpy switches to it at 2-3 KiB here), and not probed: probing every page of a
// 64 KiB source cost ib_write_bw 3 % (113-116 against 117-118 GB/s). Below, the guarded copy is
// slower than glibc's AVX-512 memcpy (its words and rep movsb then: 2-8 ns from 128 bytes to
// 2 KiB, ib_write_bw 256 B 9.4 -> 8.0 GB/s; its SSE2 loop since: up to 3 ns at 512 bytes), and
// the source is probed instead.
constexpr uint32_t kGuardedWriteFrom = 4096;

// ib_write_bw's and ib_read_bw's case: the generic checks and the WQE made of the work request
// were ~40 % of the library's time per small WRITE (the two locked instructions of the window
// access most of the rest). Anything unusual (more pieces, an empty one, a key the cache does not
// answer, inline data beyond max_inline_data, an inline READ) goes the general way.
bool Qp::TryPostDirectRdmaLocked(const ibv_send_wr& wr, link::PeerWindows* peer) {
  const ibv_sge* s = wr.sg_list;
  if (wr.num_sge != 1 || !s || cap_.max_send_sge == 0 || s->length == 0 || s->length > kMaxMsgSize)
    return false;
  const uint32_t len = s->length;
  const bool read = wr.opcode == IBV_WR_RDMA_READ;
  uint8_t* local;
  if (wr.send_flags & IBV_SEND_INLINE) {
    // ibv_post_send(3): inline data is read from the pieces' addresses, their keys unchecked.
    if (read || len > cap_.max_inline_data) return false;
    local = reinterpret_cast<uint8_t*>(s->addr);
  } else {
    // A WRITE's source needs no right; a READ's target local write.
    local = hca_.mrs().ResolveLocalCached(s->lkey, pd_, s->addr, len,
                                          read ? IBV_ACCESS_LOCAL_WRITE : 0, mr_cache_);
    // A WRITE's source the application took away since it registered it (see TryDirectLocked):
    // a small one is probed here, a large one copied by the guarded copy below.
    if (!local || (!read && len < kGuardedWriteFrom && !link::Readable(local, len))) return false;
  }
  bool placed = true;
  auto op = [&](uint8_t* remote) {
    // A READ lands in pages of ours the application may have made read-only
    // (link/placement_guard.h): refused, it goes the general way, which fails it.
    if (read)
      placed = link::PlaceGuarded(local, remote, len);
    else if (len >= kGuardedWriteFrom)
      placed = link::GuardedPlace(remote, local, len);
    else
      link::PlaceBytes(remote, local, len);
  };
  if (peer->With(wr.wr.rdma.rkey, attr_.dest_qp_num, wr.wr.rdma.remote_addr, len,
                 read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE, op,
                 &window_memo_) != link::PeerWindows::Access::kDone ||
      !placed)
    return false;
  PushDirectCompletionLocked(wr, len, IBV_WC_SUCCESS);
  return true;
}

// The completion of a work request done by one of the paths above, as the queue's would be.
void Qp::PushDirectCompletionLocked(const ibv_send_wr& wr, uint32_t length, ibv_wc_status status) {
  if (!CompletesLocked(status, wr.send_flags)) return;  // before the WQE is made: most do not
  SendWqe w;
  w.wr_id = wr.wr_id;
  w.opcode = wr.opcode;
  w.send_flags = wr.send_flags;
  w.length = length;
  w.status = status;
  PushSendCompletionLocked(w);
  if (status != IBV_WC_SUCCESS) EnterErrorLocked();
}

}  // namespace softrdma::core
