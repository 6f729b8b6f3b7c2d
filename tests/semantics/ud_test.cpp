// Unreliable datagram: a received datagram is preceded by the 40-byte GRH carrying the sender's
// GID, the completion has IBV_WC_GRH, byte_len = payload + 40, and the sender's QPN and LID; a
// Q_Key mismatch drops the datagram without consuming a receive (a Q_Key with the high bit set
// means "the sending QP's own Q_Key"); ibv_create_ah_from_wc on the completion reaches the sender.
// The cross-process case uses a forked sender, so its GID and LID differ from the receiver's.
#include "support/semantics_harness.h"

namespace semantics {
namespace {

using Ud = VerbsTest;

constexpr uint32_t kGrh = 40;
constexpr uint32_t kQkey = 0x11111111;

void Pattern(uint8_t* p, size_t n, int seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed * 41 + i);
}
bool HasPattern(const uint8_t* p, size_t n, int seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<uint8_t>(seed * 41 + i)) return false;
  return true;
}
bool SameGid(const ibv_gid& a, const ibv_gid& b) {
  return std::memcmp(a.raw, b.raw, 16) == 0;
}

// The datagrams a sender emits in these tests: (payload length, pattern seed, Q_Key).
struct Datagram {
  uint32_t len;
  int seed;
  uint32_t qkey;
};
const Datagram kDatagrams[] = {
    {100, 1, kQkey},      // delivered into receive 0
    {60, 2, kQkey ^ 1},   // wrong Q_Key: dropped, consumes nothing
    {256, 3, kQkey},      // delivered into receive 1
    {8, 4, 0x80000000u},  // high bit: the sender QP's own Q_Key (== kQkey), receive 2
    {0, 5, kQkey},        // empty datagram: only the GRH, receive 3
};
constexpr int kDelivered = 4;

// Sends kDatagrams from `q` to `to` through `ah`; payloads live at 1 KiB strides of `b`.
bool SendDatagrams(Qp* q, const Buffer& b, ibv_ah* ah, uint32_t to_qpn) {
  int n = 0;
  for (const Datagram& d : kDatagrams) {
    Pattern(b.data() + n * 1024, d.len, d.seed);
    SendArgs s;
    s.wr_id = n;
    if (d.len) s.sges = {b.Sge(n * 1024, d.len)};
    s.ah = ah;
    s.remote_qpn = to_qpn;
    s.remote_qkey = d.qkey;
    if (Post(q->qp, s)) return false;
    ++n;
  }
  auto wcs = PollN(q->scq, n);
  if (wcs.size() != size_t(n)) return false;
  for (auto& wc : wcs)
    if (wc.status != IBV_WC_SUCCESS) return false;
  return true;
}

// Checks the receiver's completions of kDatagrams sent by `sender` (qpn, lid, gid) to `me`.
void CheckDelivered(Qp* me, const Buffer& rbuf, const Remote& sender,
                    std::vector<ibv_wc>* wcs_out) {
  auto wcs = PollN(me->rcq, kDelivered);
  ASSERT_EQ(wcs.size(), size_t(kDelivered));
  int k = 0;
  for (const Datagram& d : kDatagrams) {
    if (d.qkey == (kQkey ^ 1)) continue;
    SCOPED_TRACE("datagram seed " + std::to_string(d.seed));
    const ibv_wc& wc = wcs[k];
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(wc.wr_id, uint64_t(k)) << "a dropped datagram consumed a receive";
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, d.len + kGrh);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    EXPECT_EQ(wc.qp_num, me->qpn());
    EXPECT_EQ(wc.src_qp, sender.qpn);
    EXPECT_EQ(wc.slid, sender.lid);
    const uint8_t* slot = rbuf.data() + k * 1024;
    const auto* grh = reinterpret_cast<const ibv_grh*>(slot);
    EXPECT_TRUE(SameGid(grh->sgid, sender.gid)) << "GRH sgid is not the sender's GID";
    EXPECT_EQ(ntohl(grh->version_tclass_flow) >> 28, 6u) << "GRH IP version";
    EXPECT_EQ(grh->next_hdr, 0x1b);
    EXPECT_TRUE(HasPattern(slot + kGrh, d.len, d.seed));
    ++k;
  }
  EXPECT_TRUE(Drain(me->rcq).empty()) << "the wrong-Q_Key datagram was delivered";
  *wcs_out = wcs;
}

QpOpts UdOpts() {
  QpOpts o;
  o.type = IBV_QPT_UD;
  o.qkey = kQkey;
  return o;
}

TEST_F(Ud, InProcessDatagramsCarryGrhAndQkeyFilters) {
  QpOpts o = UdOpts();
  Qp *a, *b;
  Pair(o, &a, &b);
  Buffer* sbuf = Buf(8 * 1024);
  Buffer* rbuf = Buf(8 * 1024);
  for (int i = 0; i < kDelivered + 1; ++i) ASSERT_EQ(PostRecv(b->qp, *rbuf, i * 1024, 1024, i), 0);
  // Addressed by LID only (no GRH in the AH), as ibv_ud_pingpong without -g: the receiver still
  // gets a GRH, as RoCE always carries one.
  ibv_ah* ah = v.AhTo(v.RemoteOf(b), false);
  ASSERT_NE(ah, nullptr);
  ASSERT_TRUE(SendDatagrams(a, *sbuf, ah, b->qpn()));
  std::vector<ibv_wc> wcs;
  ASSERT_NO_FATAL_FAILURE(CheckDelivered(b, *rbuf, v.RemoteOf(a), &wcs));

  // Answer the first datagram through an AH built from its completion.
  ibv_ah* back =
      v.AdoptAh(ibv_create_ah_from_wc(v.pd, &wcs[0], reinterpret_cast<ibv_grh*>(rbuf->data()), 1));
  ASSERT_NE(back, nullptr) << strerror(errno);
  ASSERT_EQ(PostRecv(a->qp, *sbuf, 7 * 1024, 1024, 99), 0);
  Pattern(rbuf->data() + 6 * 1024, 32, 9);
  SendArgs s;
  s.wr_id = 50;
  s.sges = {rbuf->Sge(6 * 1024, 32)};
  s.ah = back;
  s.remote_qpn = wcs[0].src_qp;
  s.remote_qkey = kQkey;
  ASSERT_EQ(Post(b->qp, s), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(a->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 99u);
  EXPECT_EQ(wc.src_qp, b->qpn());
  EXPECT_EQ(wc.byte_len, 32 + kGrh);
  EXPECT_TRUE(HasPattern(sbuf->data() + 7 * 1024 + kGrh, 32, 9));
}

struct Reply {
  int status = -1;
  uint32_t wr_id = 0, src_qp = 0, byte_len = 0, wc_flags = 0;
  ibv_gid sgid{};
  bool payload_ok = false;
};

TEST_F(Ud, DatagramsFromAnotherProcessCarryItsGidAndLidAndCanBeAnswered) {
  const QpOpts o = UdOpts();
  ForkedPeer child;
  ASSERT_TRUE(child.Start([o](int up, int down) {
    ChildPipe p{up, down};
    Verbs cv;
    if (!cv.Open()) return 10;
    Qp* q = cv.NewQp(o);
    Buffer* b = cv.NewBuffer(16 * 1024);
    if (!q || !b || BringUp(q->qp, o, Remote{})) return 11;
    Remote parent;
    if (!p.Send(cv.RemoteOf(q)) || !p.Recv(&parent)) return 12;
    PostRecv(q->qp, *b, 8 * 1024, 1024, 77);
    ibv_ah* ah = cv.AhTo(parent, true);  // GID addressing: the GID names the parent's endpoint
    if (!ah || !SendDatagrams(q, *b, ah, parent.qpn)) return 13;
    p.Send('S');
    Reply r;
    ibv_wc wc;
    if (PollOne(q->rcq, &wc)) {
      r.status = wc.status;
      r.wr_id = static_cast<uint32_t>(wc.wr_id);
      r.src_qp = wc.src_qp;
      r.byte_len = wc.byte_len;
      r.wc_flags = wc.wc_flags;
      r.sgid = reinterpret_cast<const ibv_grh*>(b->data() + 8 * 1024)->sgid;
      r.payload_ok = HasPattern(b->data() + 8 * 1024 + kGrh, 48, 11);
    }
    p.Send(r);
    char c;
    p.Recv(&c);
    return 0;
  }));
  Remote sender;
  ASSERT_TRUE(child.Recv(&sender));
  EXPECT_NE(sender.lid, v.port.lid) << "a forked child must have its own LID";
  EXPECT_FALSE(SameGid(sender.gid, v.gid)) << "a forked child must have its own GID";
  Qp* me = v.NewQp(o);
  ASSERT_NE(me, nullptr);
  ASSERT_EQ(BringUp(me->qp, o, Remote{}), 0);
  Buffer* rbuf = Buf(8 * 1024);
  for (int i = 0; i < kDelivered + 1; ++i) ASSERT_EQ(PostRecv(me->qp, *rbuf, i * 1024, 1024, i), 0);
  ASSERT_TRUE(child.Send(v.RemoteOf(me)));
  char c;
  ASSERT_TRUE(child.Recv(&c));
  std::vector<ibv_wc> wcs;
  ASSERT_NO_FATAL_FAILURE(CheckDelivered(me, *rbuf, sender, &wcs));
  const auto* grh = reinterpret_cast<const ibv_grh*>(rbuf->data());
  EXPECT_TRUE(SameGid(grh->dgid, v.gid)) << "GRH dgid is not the receiver's GID";

  ibv_ah* back = v.AdoptAh(ibv_create_ah_from_wc(v.pd, &wcs[0], const_cast<ibv_grh*>(grh), 1));
  ASSERT_NE(back, nullptr) << strerror(errno);
  Buffer* sbuf = Buf(64);
  Pattern(sbuf->data(), 48, 11);
  SendArgs s;
  s.wr_id = 1;
  s.sges = {sbuf->Sge(0, 48)};
  s.ah = back;
  s.remote_qpn = wcs[0].src_qp;
  s.remote_qkey = kQkey;
  ASSERT_EQ(Post(me->qp, s), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(me->scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  Reply r;
  ASSERT_TRUE(child.Recv(&r));
  EXPECT_EQ(r.status, IBV_WC_SUCCESS) << "the reply through ibv_create_ah_from_wc was lost";
  EXPECT_EQ(r.wr_id, 77u);
  EXPECT_EQ(r.src_qp, me->qpn());
  EXPECT_EQ(r.byte_len, 48 + kGrh);
  EXPECT_TRUE(r.wc_flags & IBV_WC_GRH);
  EXPECT_TRUE(SameGid(r.sgid, v.gid));
  EXPECT_TRUE(r.payload_ok);
  child.Send('q');
  EXPECT_EQ(child.Wait(), 0);
}

}  // namespace
}  // namespace semantics

namespace semantics {
namespace {

// Datagrams a process sent right before destroying its QP and exiting still arrive: a destroy
// waits (bounded) until queued frames are written to their sockets. Without that, a burst larger
// than the socket buffers died in the sender's queue with the process (udaddy's server exits
// right after its replies; its client then waited forever).
TEST_F(Ud, DatagramsSentJustBeforeDestroyAndExitArrive) {
  const QpOpts base = UdOpts();
  constexpr int kCount = 8000;
  constexpr uint32_t kLen = 4096;
  QpOpts ro = base;
  ro.max_recv_wr = kCount;
  ro.cq_depth = kCount + 16;
  Qp* me = v.NewQp(ro);
  ASSERT_NE(me, nullptr);
  ASSERT_EQ(BringUp(me->qp, ro, Remote{}), 0);
  Buffer* rbuf = Buf(size_t{kCount} * (kLen + kGrh));
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(PostRecv(me->qp, *rbuf, size_t(i) * (kLen + kGrh), kLen + kGrh, i), 0);
  ForkedPeer child;
  Remote target = v.RemoteOf(me);
  ASSERT_TRUE(child.Start([base, target](int, int) {
    Verbs cv;
    if (!cv.Open()) return 10;
    QpOpts so = base;
    so.max_send_wr = kCount;
    so.cq_depth = kCount + 16;
    Qp* q = cv.NewQp(so);
    Buffer* b = cv.NewBuffer(kLen);
    if (!q || !b || BringUp(q->qp, so, Remote{})) return 11;
    ibv_ah* ah = cv.AhTo(target, true);  // a first-time peer: its connection is being opened
    if (!ah) return 12;
    for (int i = 0; i < kCount; ++i) {
      SendArgs s;
      s.wr_id = i;
      s.sges = {b->Sge(0, kLen)};
      s.ah = ah;
      s.remote_qpn = target.qpn;
      s.remote_qkey = kQkey;
      if (Post(q->qp, s)) return 13;
    }
    if (PollN(q->scq, kCount).size() != size_t(kCount)) return 14;
    if (ibv_destroy_qp(q->qp)) return 15;
    _exit(0);  // at once: nothing after the destroy may help the frames out
  }));
  auto wcs = PollN(me->rcq, kCount, std::chrono::milliseconds(10000));
  EXPECT_EQ(wcs.size(), size_t(kCount)) << "datagrams died with the sending process";
  EXPECT_EQ(child.Wait(), 0);
}

}  // namespace
}  // namespace semantics
