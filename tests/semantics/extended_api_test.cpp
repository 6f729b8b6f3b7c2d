// The extended verbs: ibv_create_qp_ex with send_ops_flags and the ibv_wr_* builders (every
// opcode, SGE lists, inline data, UD addressing; a failed or aborted batch posts nothing),
// ibv_create_cq_ex with start/next/end_poll and the wc_read_* readers including completion
// timestamps, ibv_query_device_ex, ibv_query_gid_ex and ibv_query_gid_table.
#include "support/semantics_harness.h"

namespace semantics {
namespace {

using ExtendedApi = VerbsTest;

constexpr uint64_t kAllOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                             IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                             IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                             IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
constexpr uint64_t kWcFlags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                              IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID |
                              IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                              IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

// One completion as the ibv_wc_read_* readers report it.
struct ExWc {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t byte_len, imm, qp_num, src_qp, slid;
  unsigned wc_flags;
  uint64_t ts, wallclock;
};

// Polls an extended CQ with start/next/end_poll until `n` completions or the deadline.
std::vector<ExWc> PollEx(ibv_cq_ex* cq, size_t n, milliseconds timeout = kWait) {
  std::vector<ExWc> out;
  auto deadline = Clock::now() + timeout;
  int spins = 0;
  while (out.size() < n && Clock::now() < deadline) {
    ibv_poll_cq_attr attr{};
    int r = ibv_start_poll(cq, &attr);
    if (r == ENOENT) {
      Backoff(&spins);
      continue;
    }
    if (r != 0) break;
    do {
      ExWc w;
      w.wr_id = cq->wr_id;
      w.status = cq->status;
      w.opcode = ibv_wc_read_opcode(cq);
      w.byte_len = ibv_wc_read_byte_len(cq);
      w.imm = ntohl(ibv_wc_read_imm_data(cq));
      w.qp_num = ibv_wc_read_qp_num(cq);
      w.src_qp = ibv_wc_read_src_qp(cq);
      w.slid = ibv_wc_read_slid(cq);
      w.wc_flags = ibv_wc_read_wc_flags(cq);
      w.ts = ibv_wc_read_completion_ts(cq);
      w.wallclock = ibv_wc_read_completion_wallclock_ns(cq);
      out.push_back(w);
    } while (out.size() < n && ibv_next_poll(cq) == 0);
    ibv_end_poll(cq);
  }
  return out;
}

struct ExPair {
  ibv_cq_ex* scq;
  ibv_cq_ex* rcq;
  Qp* a;  // extended, every send op
  Qp* b;
};

void MakeExPair(Verbs& v, ibv_qp_type type, uint64_t ops, ExPair* p) {
  p->scq = v.NewCqEx(kWcFlags);
  p->rcq = v.NewCqEx(kWcFlags);
  ASSERT_NE(p->scq, nullptr) << strerror(errno);
  ASSERT_NE(p->rcq, nullptr) << strerror(errno);
  QpOpts oa, ob;
  oa.type = ob.type = type;
  oa.send_ops_flags = ops;
  oa.send_cq = ibv_cq_ex_to_cq(p->scq);
  ob.recv_cq = ibv_cq_ex_to_cq(p->rcq);
  ASSERT_TRUE(v.NewPair(oa, ob, &p->a, &p->b)) << strerror(errno);
  ASSERT_NE(p->a->ex(), nullptr) << "ibv_qp_to_qp_ex on a QP created with send_ops_flags";
}

TEST_F(ExtendedApi, WrBuildersPostEveryOpcodeAndCqExReadsEveryField) {
  ExPair p;
  ASSERT_NO_FATAL_FAILURE(MakeExPair(v, IBV_QPT_RC, kAllOps, &p));
  ibv_qp_ex* qpx = p.a->ex();
  Buffer* local = Buf(8192);
  Buffer* remote = Buf(8192);
  Buffer* rbuf = Buf(4096);
  for (size_t i = 0; i < local->len; ++i) local->data()[i] = static_cast<uint8_t>(i * 3 + 1);
  for (size_t i = 0; i < remote->len; ++i) remote->data()[i] = static_cast<uint8_t>(i * 5 + 2);
  remote->u64(1000) = 100;  // the atomic target, at offset 8000
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostRecv(p.b->qp, *rbuf, i * 1024, 1024, 10 + i), 0);
  uint8_t inline_src[40];
  for (int i = 0; i < 40; ++i) inline_src[i] = static_cast<uint8_t>(200 + i);
  const ibv_sge two[2] = {local->Sge(100, 32), local->Sge(300, 32)};

  const uint64_t before = WallclockNs();
  ibv_wr_start(qpx);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  qpx->wr_id = 1;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, local->lkey(), local->addr(0), 64);
  qpx->wr_id = 2;
  ibv_wr_send_imm(qpx, htonl(0x1234));
  ibv_wr_set_sge_list(qpx, 2, two);
  qpx->wr_id = 3;
  ibv_wr_rdma_write(qpx, remote->rkey(), remote->addr(0));
  ibv_wr_set_sge(qpx, local->lkey(), local->addr(1024), 128);
  qpx->wr_id = 4;
  ibv_wr_rdma_write_imm(qpx, remote->rkey(), remote->addr(1024), htonl(0x5678));
  ibv_wr_set_inline_data(qpx, inline_src, sizeof inline_src);
  qpx->wr_id = 5;
  ibv_wr_rdma_read(qpx, remote->rkey(), remote->addr(2048));
  ibv_wr_set_sge(qpx, local->lkey(), local->addr(4096), 256);
  qpx->wr_id = 6;
  ibv_wr_atomic_fetch_add(qpx, remote->rkey(), remote->addr(8000), 10);
  ibv_wr_set_sge(qpx, local->lkey(), local->addr(6000), 8);
  qpx->wr_id = 7;
  ibv_wr_atomic_cmp_swp(qpx, remote->rkey(), remote->addr(8000), 110, 7);
  ibv_wr_set_sge(qpx, local->lkey(), local->addr(6008), 8);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  std::memset(inline_src, 0, sizeof inline_src);  // inline data was copied at post time

  auto sent = PollEx(p.scq, 7);
  const uint64_t after = WallclockNs();
  ASSERT_EQ(sent.size(), 7u);
  const ibv_wc_opcode expect_op[7] = {IBV_WC_SEND,       IBV_WC_SEND,      IBV_WC_RDMA_WRITE,
                                      IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD,
                                      IBV_WC_COMP_SWAP};
  for (size_t i = 0; i < sent.size(); ++i) {
    SCOPED_TRACE("send completion " + std::to_string(i));
    EXPECT_EQ(sent[i].wr_id, i + 1);
    EXPECT_EQ(sent[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(sent[i].status);
    EXPECT_EQ(sent[i].opcode, expect_op[i]);
    EXPECT_EQ(sent[i].qp_num, p.a->qpn());
    EXPECT_NE(sent[i].ts, 0u);
    if (i > 0) {
      EXPECT_GE(sent[i].ts, sent[i - 1].ts) << "timestamps went backwards";
    }
    EXPECT_GE(sent[i].wallclock, before);
    EXPECT_LE(sent[i].wallclock, after);
  }
  EXPECT_EQ(sent[4].byte_len, 256u);

  auto got = PollEx(p.rcq, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].wr_id, 10u);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[0].byte_len, 64u);
  EXPECT_FALSE(got[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[1].wr_id, 11u);
  EXPECT_EQ(got[1].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[1].byte_len, 64u);
  EXPECT_TRUE(got[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[1].imm, 0x1234u);
  EXPECT_EQ(got[2].wr_id, 12u);
  EXPECT_EQ(got[2].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(got[2].byte_len, 40u);
  EXPECT_TRUE(got[2].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[2].imm, 0x5678u);
  for (const ExWc& w : got) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_EQ(w.qp_num, p.b->qpn());
    EXPECT_EQ(w.src_qp, p.a->qpn());
    EXPECT_NE(w.ts, 0u);
  }

  EXPECT_EQ(std::memcmp(rbuf->data(), local->data(), 64), 0);
  EXPECT_EQ(std::memcmp(rbuf->data() + 1024, local->data() + 100, 32), 0) << "SGE list, part 1";
  EXPECT_EQ(std::memcmp(rbuf->data() + 1056, local->data() + 300, 32), 0) << "SGE list, part 2";
  EXPECT_EQ(std::memcmp(remote->data(), local->data() + 1024, 128), 0);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(remote->data()[1024 + i], 200 + i) << "inline byte " << i;
  EXPECT_EQ(std::memcmp(local->data() + 4096, remote->data() + 2048, 256), 0);
  EXPECT_EQ(local->u64(750), 100u) << "FETCH_ADD result";
  EXPECT_EQ(local->u64(751), 110u) << "CMP_AND_SWP result";
  EXPECT_EQ(remote->u64(1000), 7u);
}

// ibv_wr_post(3): "No work is executed to the queue until ibv_wr_complete() returns success", and
// ibv_wr_abort() discards the batch.
TEST_F(ExtendedApi, FailedOrAbortedBatchPostsNothing) {
  ExPair p;
  ASSERT_NO_FATAL_FAILURE(MakeExPair(v, IBV_QPT_RC, kAllOps, &p));
  ibv_qp_ex* qpx = p.a->ex();
  Buffer* buf = Buf(8192);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostRecv(p.b->qp, *buf, 4096 + i * 512, 512, 10 + i), 0);

  ibv_wr_start(qpx);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  qpx->wr_id = 1;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, buf->lkey(), buf->addr(0), 11);
  ibv_wr_abort(qpx);

  ibv_sge many[8];
  for (auto& s : many) s = buf->Sge(0, 8);
  ibv_wr_start(qpx);
  qpx->wr_id = 2;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, buf->lkey(), buf->addr(0), 22);
  qpx->wr_id = 3;
  ibv_wr_send(qpx);
  ibv_wr_set_sge_list(qpx, 8, many);  // more SGEs than max_send_sge (4)
  EXPECT_NE(ibv_wr_complete(qpx), 0);

  EXPECT_TRUE(PollEx(p.scq, 1, kQuiet).empty()) << "a refused or aborted batch ran";
  ibv_wr_start(qpx);
  qpx->wr_id = 4;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, buf->lkey(), buf->addr(0), 44);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  auto sent = PollEx(p.scq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wr_id, 4u) << "a WR of a refused batch was executed later";
  auto got = PollEx(p.rcq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].byte_len, 44u);
  EXPECT_TRUE(PollEx(p.scq, 1, kQuiet).empty());
  EXPECT_TRUE(PollEx(p.rcq, 1, milliseconds(1)).empty());
}

TEST_F(ExtendedApi, UdBuildersSetAddressAndInlineData) {
  ExPair p;
  ASSERT_NO_FATAL_FAILURE(
      MakeExPair(v, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, &p));
  ibv_qp_ex* qpx = p.a->ex();
  Buffer* buf = Buf(8192);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(PostRecv(p.b->qp, *buf, 4096 + i * 1024, 1024, i), 0);
  ibv_ah* ah = v.AhTo(v.RemoteOf(p.b), true);
  ASSERT_NE(ah, nullptr);
  char text[] = "inline datagram";
  for (int i = 0; i < 64; ++i) buf->data()[i] = static_cast<uint8_t>(i + 1);

  ibv_wr_start(qpx);
  qpx->wr_flags = IBV_SEND_SIGNALED;
  qpx->wr_id = 1;
  ibv_wr_send(qpx);
  ibv_wr_set_ud_addr(qpx, ah, p.b->qpn(), p.b->opts.qkey);
  ibv_wr_set_inline_data(qpx, text, sizeof text);
  qpx->wr_id = 2;
  ibv_wr_send_imm(qpx, htonl(99));
  ibv_wr_set_ud_addr(qpx, ah, p.b->qpn(), p.b->opts.qkey);
  ibv_wr_set_sge(qpx, buf->lkey(), buf->addr(0), 64);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);

  auto sent = PollEx(p.scq, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[1].status, IBV_WC_SUCCESS);
  auto got = PollEx(p.rcq, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].byte_len, sizeof text + 40);
  EXPECT_TRUE(got[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(got[0].src_qp, p.a->qpn());
  EXPECT_EQ(got[0].slid, v.port.lid);
  EXPECT_STREQ(reinterpret_cast<const char*>(buf->data() + 4096 + 40), text);
  EXPECT_EQ(got[1].byte_len, 64u + 40);
  EXPECT_TRUE(got[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[1].imm, 99u);
  EXPECT_EQ(std::memcmp(buf->data() + 5120 + 40, buf->data(), 64), 0);
}

TEST_F(ExtendedApi, QueryDeviceExAgreesWithQueryDeviceAndAdvertisesTimestamps) {
  ibv_device_attr base{};
  ASSERT_EQ(ibv_query_device(v.ctx, &base), 0);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(v.ctx, nullptr, &ex), 0);
  EXPECT_EQ(std::memcmp(&ex.orig_attr, &base, sizeof base), 0);
  EXPECT_NE(ex.completion_timestamp_mask, 0u);
  EXPECT_NE(ex.hca_core_clock, 0u);
  EXPECT_EQ(ex.orig_attr.atomic_cap, IBV_ATOMIC_HCA);
  EXPECT_GE(ex.orig_attr.max_qp_wr, 16384);
  EXPECT_GE(ex.orig_attr.max_sge, 16);
  EXPECT_EQ(ex.orig_attr.phys_port_cnt, 1);
}

TEST_F(ExtendedApi, GidQueriesAgreeWithEachOther) {
  ASSERT_GE(v.port.gid_tbl_len, 1);
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(v.ctx, 1, 0, &e, 0), 0);
  EXPECT_EQ(std::memcmp(e.gid.raw, v.gid.raw, 16), 0);
  EXPECT_EQ(e.gid_index, 0u);
  EXPECT_EQ(e.port_num, 1u);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  uint64_t low = 0;
  std::memcpy(&low, e.gid.raw + 8, 8);
  EXPECT_NE(low, 0u) << "GID 0 must have non-zero low 64 bits";

  std::vector<ibv_gid_entry> table(v.port.gid_tbl_len + 4);
  ssize_t n = ibv_query_gid_table(v.ctx, table.data(), table.size(), 0);
  ASSERT_GE(n, 1);
  ASSERT_LE(n, v.port.gid_tbl_len);
  for (ssize_t i = 0; i < n; ++i) {
    SCOPED_TRACE("gid " + std::to_string(i));
    ibv_gid g;
    ASSERT_EQ(ibv_query_gid(v.ctx, 1, table[i].gid_index, &g), 0);
    EXPECT_EQ(std::memcmp(g.raw, table[i].gid.raw, 16), 0);
    EXPECT_EQ(table[i].port_num, 1u);
    ibv_gid_entry one{};
    ASSERT_EQ(ibv_query_gid_ex(v.ctx, 1, table[i].gid_index, &one, 0), 0);
    EXPECT_EQ(std::memcmp(&one, &table[i], sizeof one), 0);
  }
  EXPECT_NE(ibv_query_gid_ex(v.ctx, 1, v.port.gid_tbl_len, &e, 0), 0) << "past the table";
  EXPECT_NE(ibv_query_gid_ex(v.ctx, 2, 0, &e, 0), 0) << "no port 2";
}

}  // namespace
}  // namespace semantics
