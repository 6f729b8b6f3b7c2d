// Verbs multicast (ibv_attach_mcast): a UD send to QPN 0xFFFFFF with a multicast GID reaches
// every QP attached to the group, each receiving it with the group's GID in the GRH; a detached QP
// receives nothing more; only UD QPs and multicast GIDs may attach.
#include "support/semantics_harness.h"

namespace semantics {
namespace {

using Multicast = VerbsTest;

constexpr uint32_t kGrh = 40;
constexpr uint32_t kMcastQpn = 0xffffff;

ibv_gid Group(uint8_t last) {
  ibv_gid g{};
  g.raw[0] = 0xff;
  g.raw[1] = 0x0e;
  g.raw[15] = last;
  return g;
}

// The address of `group` (multicast LID `lid`) on port 1.
ibv_ah_attr GroupAh(const ibv_gid& group, uint16_t lid) {
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.grh.dgid = group;
  attr.grh.hop_limit = 64;
  attr.dlid = lid;
  attr.port_num = 1;
  return attr;
}

int SendToGroup(Qp* from, const Buffer& b, ibv_ah* ah, uint64_t wr_id, uint32_t qkey) {
  SendArgs s;
  s.wr_id = wr_id;
  s.sges = {b.Sge(0, 64)};
  s.ah = ah;
  s.remote_qpn = kMcastQpn;
  s.remote_qkey = qkey;
  return Post(from->qp, s);
}

TEST_F(Multicast, AttachedQpsReceiveGroupSendsUntilDetached) {
  QpOpts o;
  o.type = IBV_QPT_UD;
  Qp *sender, *r1;
  Pair(o, &sender, &r1);
  Qp *r2, *outsider;
  Pair(o, &r2, &outsider);
  const ibv_gid group = Group(0x42);
  ASSERT_EQ(ibv_attach_mcast(r1->qp, &group, 0xc001), 0);
  ASSERT_EQ(ibv_attach_mcast(r2->qp, &group, 0xc001), 0);
  ASSERT_EQ(ibv_attach_mcast(r2->qp, &group, 0xc001), 0) << "attaching twice is not an error";

  Buffer* sbuf = Buf(4096);
  Buffer* rbuf = Buf(4 * 4096);
  for (Qp* r : {r1, r2, outsider}) {
    size_t slot = r == r1 ? 0 : r == r2 ? 1 : 2;
    ASSERT_EQ(PostRecv(r->qp, *rbuf, slot * 4096, 1024, slot), 0);
  }
  ibv_ah_attr attr = GroupAh(group, 0xc001);
  ibv_ah* ah = v.AdoptAh(ibv_create_ah(v.pd, &attr));
  ASSERT_NE(ah, nullptr) << strerror(errno);
  std::memset(sbuf->data(), 0x5a, 64);
  ASSERT_EQ(SendToGroup(sender, *sbuf, ah, 1, o.qkey), 0);
  ASSERT_EQ(PollN(sender->scq, 1).size(), 1u);

  for (Qp* r : {r1, r2}) {
    ibv_wc wc;
    ASSERT_TRUE(PollOne(r->rcq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(wc.byte_len, 64 + kGrh);
    EXPECT_EQ(wc.qp_num, r->qpn());
    EXPECT_EQ(wc.src_qp, sender->qpn());
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    const auto* grh = reinterpret_cast<const ibv_grh*>(rbuf->data() + wc.wr_id * 4096);
    EXPECT_EQ(std::memcmp(grh->dgid.raw, group.raw, 16), 0) << "GRH must carry the group's GID";
    EXPECT_EQ(rbuf->data()[wc.wr_id * 4096 + kGrh], 0x5a);
  }
  EXPECT_TRUE(Drain(outsider->rcq).empty()) << "a QP that did not attach received group traffic";

  // After detaching, r2 hears nothing; r1 still does.
  ASSERT_EQ(ibv_detach_mcast(r2->qp, &group, 0xc001), 0);
  EXPECT_EQ(ibv_detach_mcast(r2->qp, &group, 0xc001), EINVAL) << "not attached any more";
  ASSERT_EQ(PostRecv(r1->qp, *rbuf, 0, 1024, 0), 0);
  ASSERT_EQ(PostRecv(r2->qp, *rbuf, 4096, 1024, 1), 0);
  // The member list a sender caches is at most 20 ms old.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(SendToGroup(sender, *sbuf, ah, 2, o.qkey), 0);
  ASSERT_EQ(PollN(sender->scq, 1).size(), 1u);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(r1->rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_TRUE(Drain(r2->rcq).empty()) << "a detached QP still received group traffic";
}

// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (mckey -l): the QP's group sends skip the members on its own
// device (here, every QP of this process); a sender without it still reaches them. UD only.
TEST_F(Multicast, ASenderThatBlocksLoopbackSkipsTheMembersOfItsOwnDevice) {
  QpOpts o;
  o.type = IBV_QPT_UD;
  QpOpts blocked = o;
  blocked.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  Qp *quiet, *member;
  Pair(blocked, o, &quiet, &member);
  ASSERT_NE(quiet, nullptr);
  Qp* loud = v.NewQp(o);
  ASSERT_NE(loud, nullptr);
  ASSERT_EQ(BringUp(loud->qp, o, v.RemoteOf(member)), 0);
  const ibv_gid group = Group(0x43);
  ASSERT_EQ(ibv_attach_mcast(member->qp, &group, 0xc002), 0);
  ASSERT_EQ(ibv_attach_mcast(quiet->qp, &group, 0xc002), 0);
  Buffer* sbuf = Buf(4096);
  Buffer* rbuf = Buf(2 * 4096);
  ASSERT_EQ(PostRecv(member->qp, *rbuf, 0, 1024, 1), 0);
  ASSERT_EQ(PostRecv(quiet->qp, *rbuf, 4096, 1024, 2), 0);
  ibv_ah_attr attr = GroupAh(group, 0xc002);
  ibv_ah* ah = v.AdoptAh(ibv_create_ah(v.pd, &attr));
  ASSERT_NE(ah, nullptr) << strerror(errno);
  ASSERT_EQ(SendToGroup(quiet, *sbuf, ah, 1, o.qkey), 0);
  ASSERT_EQ(PollN(quiet->scq, 1).size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(Drain(member->rcq).empty()) << "a member on the sender's own device received";
  EXPECT_TRUE(Drain(quiet->rcq).empty()) << "the sender received its own group send";
  ASSERT_EQ(SendToGroup(loud, *sbuf, ah, 2, o.qkey), 0);
  ASSERT_EQ(PollN(loud->scq, 1).size(), 1u);
  for (Qp* r : {member, quiet}) {
    ibv_wc wc;
    ASSERT_TRUE(PollOne(r->rcq, &wc)) << "a sender without the flag reaches every member";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    EXPECT_EQ(wc.src_qp, loud->qpn());
  }
  // Only UD QPs carry the flag.
  QpOpts rc;
  rc.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  errno = 0;
  EXPECT_EQ(v.NewQp(rc), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(Multicast, OnlyUdQpsAndMulticastGidsAttach) {
  QpOpts ud;
  ud.type = IBV_QPT_UD;
  Qp *a, *b;
  Pair(ud, &a, &b);
  ibv_gid unicast{};
  unicast.raw[0] = 0xfe;
  unicast.raw[1] = 0x80;
  EXPECT_EQ(ibv_attach_mcast(a->qp, &unicast, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(a->qp, nullptr, 0), EINVAL);
  Qp *rc1, *rc2;
  Pair(QpOpts{}, &rc1, &rc2);
  const ibv_gid group = Group(7);
  EXPECT_EQ(ibv_attach_mcast(rc1->qp, &group, 0xc002), EINVAL);
  EXPECT_EQ(ibv_detach_mcast(rc1->qp, &group, 0xc002), EINVAL);
}

}  // namespace
}  // namespace semantics
