// XRC targets held by several handles and processes: ibv_open_qp(3), and the OFED 1.5 legacy API
// of ibv_create_xrc_rcv_qp(3) (infiniband/ofed_xrc.h). In-process: handles, what is refused and
// with which errno, the legacy send QP. Across processes: a target outlives its creator while
// another process holds it, every message arriving once, and its slot stays reachable.
#include <infiniband/verbs.h>
#include <infiniband/ofed_xrc.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/semantics_harness.h"
#include "support/xrc_srq_owner.h"

namespace {

using namespace semantics;

std::string TempFile() {
  char path[] = "/tmp/softrdma-xrcd-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return {};
  close(fd);
  return path;
}

ibv_xrcd* OpenXrcd(ibv_context* ctx, int fd) {
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = O_CREAT;
  return ibv_open_xrcd(ctx, &a);
}

ibv_qp* NewTarget(ibv_context* ctx, ibv_xrcd* xrcd) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_RECV;
  a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  a.xrcd = xrcd;
  return ibv_create_qp_ex(ctx, &a);
}

ibv_qp* OpenTarget(ibv_context* ctx, ibv_xrcd* xrcd, uint32_t qpn) {
  ibv_qp_open_attr a{};
  a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  a.qp_num = qpn;
  a.xrcd = xrcd;
  a.qp_type = IBV_QPT_XRC_RECV;
  return ibv_open_qp(ctx, &a);
}

class XrcSharing : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    file = TempFile();
    ASSERT_FALSE(file.empty());
    fd = open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
  }
  void TearDown() override {
    VerbsTest::TearDown();
    if (fd >= 0) close(fd);
    unlink(file.c_str());
  }
  std::string file;
  int fd = -1;
};

TEST_F(XrcSharing, OpenQpGivesAHandleOnTheSameTargetThatOutlivesTheCreatorsHandle) {
  ibv_xrcd* x1 = OpenXrcd(v.ctx, fd);
  ibv_xrcd* x2 = OpenXrcd(v.ctx, fd);
  ASSERT_TRUE(x1 && x2);
  ibv_qp* created = NewTarget(v.ctx, x1);
  ASSERT_NE(created, nullptr) << strerror(errno);
  ibv_qp* opened = OpenTarget(v.ctx, x2, created->qp_num);
  ASSERT_NE(opened, nullptr) << strerror(errno);
  EXPECT_NE(opened, created);
  EXPECT_EQ(opened->qp_num, created->qp_num);
  EXPECT_EQ(opened->qp_type, IBV_QPT_XRC_RECV);

  // A change through one handle is the QP's: the other handle sees it.
  QpOpts o;
  o.type = IBV_QPT_XRC_RECV;
  ASSERT_EQ(ToInit(opened, o), 0);
  EXPECT_EQ(StateOf(created), IBV_QPS_INIT);

  EXPECT_EQ(ibv_close_xrcd(x1), EBUSY) << "its target is still open through it";
  ASSERT_EQ(ibv_destroy_qp(created), 0);
  EXPECT_EQ(StateOf(opened), IBV_QPS_INIT) << "the QP lives while a handle does";
  ibv_qp* again = OpenTarget(v.ctx, x1, opened->qp_num);
  ASSERT_NE(again, nullptr) << strerror(errno);
  const uint32_t qpn = opened->qp_num;
  ASSERT_EQ(ibv_destroy_qp(opened), 0);
  ASSERT_EQ(ibv_destroy_qp(again), 0);
  errno = 0;
  EXPECT_EQ(OpenTarget(v.ctx, x2, qpn), nullptr) << "gone with its last handle";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_close_xrcd(x1), 0);
  EXPECT_EQ(ibv_close_xrcd(x2), 0);
}

TEST_F(XrcSharing, OpenQpRefusesNumbersThatAreNoTargetOfTheDomain) {
  ibv_xrcd* x = OpenXrcd(v.ctx, fd);
  std::string other_file = TempFile();
  int other_fd = open(other_file.c_str(), O_RDONLY);
  ibv_xrcd* other = OpenXrcd(v.ctx, other_fd);
  ASSERT_TRUE(x && other);
  ibv_qp* target = NewTarget(v.ctx, x);
  ASSERT_NE(target, nullptr);
  Qp* rc = v.NewQp(QpOpts{});
  ASSERT_NE(rc, nullptr);

  const uint32_t never = (uint32_t{v.port.lid} << 13) | 0x1ffe;
  for (uint32_t qpn : {never, rc->qpn(), 0u}) {
    errno = 0;
    EXPECT_EQ(OpenTarget(v.ctx, x, qpn), nullptr) << std::hex << qpn;
    EXPECT_EQ(errno, EINVAL) << std::hex << qpn;
  }
  errno = 0;
  EXPECT_EQ(OpenTarget(v.ctx, other, target->qp_num), nullptr) << "a target of another domain";
  EXPECT_EQ(errno, EINVAL);

  ibv_qp_open_attr a{};
  a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD;  // no type
  a.qp_num = target->qp_num;
  a.xrcd = x;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(v.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask |= IBV_QP_OPEN_ATTR_TYPE;
  a.qp_type = IBV_QPT_XRC_SEND;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(v.ctx, &a), nullptr) << "only receive QPs are opened";
  EXPECT_EQ(errno, EINVAL);

  ASSERT_EQ(ibv_destroy_qp(target), 0);
  EXPECT_EQ(ibv_close_xrcd(x), 0);
  EXPECT_EQ(ibv_close_xrcd(other), 0);
  close(other_fd);
  unlink(other_file.c_str());
}

// ---- The OFED 1.5 legacy API.

class LegacyXrc : public XrcSharing {
 protected:
  void SetUp() override {
    XrcSharing::SetUp();
    dom = ibv_open_xrc_domain(v.ctx, fd, O_CREAT);
    ASSERT_NE(dom, nullptr) << strerror(errno);
    EXPECT_EQ(dom->context, v.ctx);
  }
  void TearDown() override {
    if (dom) {
      EXPECT_EQ(ibv_close_xrc_domain(dom), 0);
    }
    XrcSharing::TearDown();
  }
  uint32_t NewRcvQp() {
    ibv_xrc_qp_init_attr init{};
    init.xrc_domain = dom;
    uint32_t qpn = 0;
    EXPECT_EQ(ibv_create_xrc_rcv_qp(&init, &qpn), 0);
    return qpn;
  }
  ibv_xrc_domain* dom = nullptr;
};

TEST_F(LegacyXrc, CallsOnANumberThatIsNoReceiveQpOfTheDomainReturnEinval) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  const uint32_t never = (uint32_t{v.port.lid} << 13) | 0x1ffe;
  Qp* rc = v.NewQp(QpOpts{});
  ASSERT_NE(rc, nullptr);
  for (uint32_t qpn : {never, rc->qpn()}) {
    EXPECT_EQ(ibv_reg_xrc_rcv_qp(dom, qpn), EINVAL) << std::hex << qpn;
    EXPECT_EQ(ibv_unreg_xrc_rcv_qp(dom, qpn), EINVAL) << std::hex << qpn;
    EXPECT_EQ(ibv_query_xrc_rcv_qp(dom, qpn, &attr, IBV_QP_STATE, &init), EINVAL);
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    EXPECT_EQ(
        ibv_modify_xrc_rcv_qp(dom, qpn, &attr,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        EINVAL);
  }
  EXPECT_EQ(StateOf(rc->qp), IBV_QPS_RESET) << "the RC QP of that number is left alone";

  // The creator is registered; once it unregisters, the number is gone.
  uint32_t qpn = NewRcvQp();
  ASSERT_NE(qpn, 0u);
  EXPECT_EQ(ibv_query_xrc_rcv_qp(dom, qpn, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RESET);
  EXPECT_EQ(ibv_reg_xrc_rcv_qp(dom, qpn), 0) << "registered already: nothing changes";
  EXPECT_EQ(ibv_unreg_xrc_rcv_qp(dom, qpn), 0);
  EXPECT_EQ(ibv_unreg_xrc_rcv_qp(dom, qpn), EINVAL) << "this process is not registered any more";
  EXPECT_EQ(ibv_query_xrc_rcv_qp(dom, qpn, &attr, IBV_QP_STATE, &init), EINVAL);
  EXPECT_EQ(ibv_reg_xrc_rcv_qp(dom, qpn), EINVAL);

  // Bad arguments.
  ibv_xrc_qp_init_attr no_domain{};
  EXPECT_EQ(ibv_create_xrc_rcv_qp(&no_domain, &qpn), EINVAL);
  EXPECT_EQ(ibv_create_xrc_rcv_qp(nullptr, &qpn), EINVAL);
  EXPECT_EQ(ibv_reg_xrc_rcv_qp(nullptr, qpn), EINVAL);
  EXPECT_EQ(ibv_close_xrc_domain(nullptr), EINVAL);
}

TEST_F(LegacyXrc, AReceiveQpOfAnotherDomainIsUnknownInThisOne) {
  uint32_t qpn = NewRcvQp();
  ibv_xrc_domain* mine = ibv_open_xrc_domain(v.ctx, -1, O_CREAT);
  ASSERT_NE(mine, nullptr) << strerror(errno);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_reg_xrc_rcv_qp(mine, qpn), EINVAL);
  EXPECT_EQ(ibv_query_xrc_rcv_qp(mine, qpn, &attr, IBV_QP_STATE, &init), EINVAL);
  EXPECT_EQ(ibv_close_xrc_domain(mine), 0);
  EXPECT_EQ(ibv_unreg_xrc_rcv_qp(dom, qpn), 0);
}

TEST_F(LegacyXrc, ASendQpOfTypeXrcReachesTheSrqEachWorkRequestNames) {
  ibv_cq* scq = v.NewCq(16);
  ibv_cq* cq_a = v.NewCq(16);
  ibv_cq* cq_b = v.NewCq(16);
  Buffer* buf = Buf(4096);
  ASSERT_TRUE(scq && cq_a && cq_b && buf);

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq_a = ibv_create_xrc_srq(v.pd, dom, cq_a, &sa);
  ibv_srq* srq_b = ibv_create_xrc_srq(v.pd, dom, cq_b, &sa);
  ASSERT_TRUE(srq_a && srq_b) << strerror(errno);
  uint32_t num = 0;
  ASSERT_EQ(ibv_get_srq_num(srq_a, &num), 0);
  EXPECT_EQ(ibv_xrc_srq_num(srq_a), num);
  EXPECT_NE(ibv_xrc_srq_num(srq_b), num);
  EXPECT_EQ(ibv_close_xrc_domain(dom), EBUSY) << "its SRQs are alive";

  ibv_xrc_qp_init_attr si{};
  si.send_cq = scq;
  si.recv_cq = scq;
  si.cap.max_send_wr = 8;
  si.cap.max_send_sge = 1;
  si.qp_type = IBV_QPT_XRC;
  si.xrc_domain = dom;
  ibv_qp* sender = ibv_create_qp(v.pd, &si);  // ofed_xrc.h's overload of OFED 1.5's call
  ASSERT_NE(sender, nullptr) << strerror(errno);
  EXPECT_EQ(sender->qp_type, IBV_QPT_XRC_SEND);
  uint32_t rcv = NewRcvQp();

  QpOpts ro;
  ro.type = IBV_QPT_XRC_RECV;
  ibv_qp_attr a = FullAttr(ro, Remote{}, IBV_QPS_INIT);
  ASSERT_EQ(ibv_modify_xrc_rcv_qp(dom, rcv, &a, InitMask(IBV_QPT_XRC_RECV)), 0);
  a = FullAttr(ro, Remote{sender->qp_num, v.port.lid, v.gid, 0}, IBV_QPS_RTR);
  ASSERT_EQ(ibv_modify_xrc_rcv_qp(dom, rcv, &a, RtrMask(IBV_QPT_XRC_RECV)), 0);
  QpOpts so;
  so.type = IBV_QPT_XRC_SEND;
  so.retry_cnt = 1;
  ASSERT_EQ(BringUp(sender, so, Remote{rcv, v.port.lid, v.gid, 0}), 0);

  ASSERT_EQ(PostSrqRecv(srq_a, *buf, 1024, 64, 11), 0);
  ASSERT_EQ(PostSrqRecv(srq_b, *buf, 2048, 64, 22), 0);
  auto send = [&](uint64_t id, uint32_t srqn, const char* text) {
    std::strcpy(reinterpret_cast<char*>(buf->data()) + id * 64, text);
    ibv_sge sge = buf->Sge(id * 64, static_cast<uint32_t>(std::strlen(text) + 1));
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.xrc_remote_srq_num = srqn;  // OFED 1.5's field, spelled as then
    return ibv_post_send(sender, &wr, &bad);
  };
  ASSERT_EQ(send(1, ibv_xrc_srq_num(srq_b), "to b"), 0);
  ASSERT_EQ(send(2, ibv_xrc_srq_num(srq_a), "to a"), 0);
  ibv_wc wc;
  for (uint64_t id : {1, 2}) {
    ASSERT_TRUE(PollOne(scq, &wc));
    EXPECT_EQ(wc.wr_id, id);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  }
  ASSERT_TRUE(PollOne(cq_b, &wc));
  EXPECT_EQ(wc.wr_id, 22u);
  EXPECT_EQ(wc.qp_num, rcv);
  EXPECT_STREQ(reinterpret_cast<char*>(buf->data()) + 2048, "to b");
  ASSERT_TRUE(PollOne(cq_a, &wc));
  EXPECT_EQ(wc.wr_id, 11u);
  EXPECT_STREQ(reinterpret_cast<char*>(buf->data()) + 1024, "to a");

  // An SRQ number nobody has: the remote invalid request error, the QP stops.
  ASSERT_EQ(send(3, ibv_xrc_srq_num(srq_a) + 0x1000, "nobody"), 0);
  ASSERT_TRUE(PollOne(scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(Drain(cq_a).size() + Drain(cq_b).size(), 0u);

  ASSERT_EQ(ibv_destroy_qp(sender), 0);
  ASSERT_EQ(ibv_unreg_xrc_rcv_qp(dom, rcv), 0);
  ASSERT_EQ(ibv_destroy_srq(srq_a), 0);
  ASSERT_EQ(ibv_destroy_srq(srq_b), 0);
}

// ---- Across processes: the creator goes, the target stays with a registered process.

// The creator: opens the legacy domain of `file`, creates the receive QP and reports its
// number, connects it to the initiator the parent names, then waits for 'X' and exits (its
// atexit handlers run: the hand-over), registered or not ('U' first unregisters).
int Creator(ChildPipe p, const std::string& file, bool use_gid) {
  Verbs v;
  if (!v.Open()) return 10;
  int fd = open(file.c_str(), O_RDONLY);
  ibv_xrc_domain* dom = fd >= 0 ? ibv_open_xrc_domain(v.ctx, fd, O_CREAT) : nullptr;
  if (!dom) return 11;
  ibv_xrc_qp_init_attr init{};
  init.xrc_domain = dom;
  uint32_t qpn = 0;
  if (ibv_create_xrc_rcv_qp(&init, &qpn)) return 12;
  if (!p.Send(Remote{qpn, v.port.lid, v.gid, 0})) return 13;
  Remote initiator;
  if (!p.Recv(&initiator)) return 14;
  QpOpts o;
  o.type = IBV_QPT_XRC_RECV;
  o.use_gid = use_gid;
  ibv_qp_attr a = FullAttr(o, Remote{}, IBV_QPS_INIT);
  if (ibv_modify_xrc_rcv_qp(dom, qpn, &a, InitMask(o.type))) return 15;
  a = FullAttr(o, initiator, IBV_QPS_RTR);
  if (ibv_modify_xrc_rcv_qp(dom, qpn, &a, RtrMask(o.type))) return 16;
  if (!p.Send('R')) return 17;
  for (;;) {
    char cmd = 0;
    if (!p.Recv(&cmd)) return 18;
    if (cmd == 'U' && ibv_unreg_xrc_rcv_qp(dom, qpn)) return 19;
    if (cmd == 'X') exit(0);  // not _exit: the exit handlers hand the target over
  }
}

// Opens a device (which sweeps stale slot files) and reports its slot.
int Starter(ChildPipe p) {
  Verbs v;
  if (!v.Open()) return 10;
  return p.Send(static_cast<uint32_t>(v.port.lid)) ? 0 : 11;
}

class XrcHandOver : public XrcSharing {
 protected:
  static constexpr int kMessages = 300;
  static constexpr int kWindow = 8;
  static constexpr int kSpare = 32;

  void SetUp() override {
    XrcSharing::SetUp();
    dom = ibv_open_xrc_domain(v.ctx, fd, O_CREAT);
    ASSERT_NE(dom, nullptr);
    scq = v.NewCq(64);
    // Room for duplicates: a message taken twice shows as such, not as a stall for receives.
    rcq = v.NewCq(kMessages + kSpare + 16);
    buf = Buf(size_t{kMessages + kSpare} * 64 + 4096);
    ASSERT_TRUE(scq && rcq && buf);
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = kMessages + kSpare;
    sa.attr.max_sge = 1;
    srq = ibv_create_xrc_srq(v.pd, dom, rcq, &sa);
    ASSERT_NE(srq, nullptr);
    for (int i = 0; i < kMessages + kSpare; ++i)
      ASSERT_EQ(PostSrqRecv(srq, *buf, 4096 + size_t(i) * 64, 64, uint64_t(i)), 0);
    ibv_xrc_qp_init_attr si{};
    si.send_cq = scq;
    si.recv_cq = scq;
    si.cap.max_send_wr = kWindow;
    si.cap.max_send_sge = 1;
    si.qp_type = IBV_QPT_XRC;
    si.xrc_domain = dom;
    sender = ibv_create_qp(v.pd, &si);
    ASSERT_NE(sender, nullptr);
  }
  void TearDown() override {
    if (sender) ibv_destroy_qp(sender);
    if (rcv) ibv_unreg_xrc_rcv_qp(dom, rcv);
    if (srq) ibv_destroy_srq(srq);
    if (dom) ibv_close_xrc_domain(dom);
    XrcSharing::TearDown();
  }

  // The creator in a child; this process registers for its QP and connects the sender to it.
  // `timeout`: the sender's (0: the harness's).
  void StartCreator(uint8_t timeout = 0) {
    std::string f = file;
    ASSERT_TRUE(creator.Start([f](int up, int down) {
      return Creator(ChildPipe{up, down}, f, /*use_gid=*/true);
    }));
    Remote target;
    ASSERT_TRUE(creator.Recv(&target));
    rcv = target.qpn;
    ASSERT_NE(rcv >> 13, v.port.lid) << "the receive QP is the child's";
    ASSERT_TRUE(creator.Send(Remote{sender->qp_num, v.port.lid, v.gid, 0}));
    char ready = 0;
    ASSERT_TRUE(creator.Recv(&ready));
    ASSERT_EQ(ibv_reg_xrc_rcv_qp(dom, rcv), 0);
    QpOpts so;
    so.type = IBV_QPT_XRC_SEND;
    so.use_gid = true;
    if (timeout) so.timeout = timeout;
    ASSERT_EQ(BringUp(sender, so, target), 0);
  }

  // A signaled SEND of `sge` to XRC SRQ `srqn`.
  int PostTo(uint32_t srqn, uint64_t id, ibv_sge sge) {
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.xrc_remote_srq_num = srqn;
    return ibv_post_send(sender, &wr, &bad);
  }

  int Post(int i) {
    char* text = reinterpret_cast<char*>(buf->data()) + (i % kWindow) * 64;
    std::snprintf(text, 64, "message %d", i);
    ibv_sge sge = buf->Sge((i % kWindow) * 64, static_cast<uint32_t>(std::strlen(text) + 1));
    return PostTo(ibv_xrc_srq_num(srq), static_cast<uint64_t>(i), sge);
  }

  // Sends messages [from, to) with kWindow outstanding; calls `at(i)` once message i completed.
  void Stream(int from, int to, const std::function<void(int)>& at = {}) {
    int next = from, done = from;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (done < to) {
      while (next < to && next - done < kWindow) ASSERT_EQ(Post(next++), 0);
      ibv_wc wc{};
      int n = ibv_poll_cq(scq, 1, &wc);
      ASSERT_GE(n, 0);
      if (n == 0) {
        ASSERT_LT(Clock::now(), deadline) << done << " of " << to << " sends completed";
        continue;
      }
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "send " << wc.wr_id << ": " << WcStr(wc);
      ASSERT_EQ(wc.wr_id, uint64_t(done));
      if (at) at(done);
      ++done;
    }
  }

  // Receives [from, to) once each, in order, through the receive QP.
  void ExpectReceived(int from, int to) {
    std::vector<ibv_wc> wcs = PollN(rcq, size_t(to - from), milliseconds(10000));
    ASSERT_EQ(wcs.size(), size_t(to - from));
    for (int i = from; i < to; ++i) {
      const ibv_wc& wc = wcs[size_t(i - from)];
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
      EXPECT_EQ(wc.qp_num, rcv);
      char want[64];
      std::snprintf(want, sizeof want, "message %d", i);
      ASSERT_STREQ(reinterpret_cast<char*>(buf->data()) + 4096 + wc.wr_id * 64, want)
          << "receive " << i << " (each message once, in order)";
    }
    EXPECT_EQ(Drain(rcq).size(), 0u) << "a message arrived twice";
  }

  void ExitCreator(bool unregister_first) {
    if (unregister_first) {
      ASSERT_TRUE(creator.Send('U'));
    }
    ASSERT_TRUE(creator.Send('X'));
    int st = creator.Wait(milliseconds(10000));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "creator status " << st;
  }

  // The creator serves the target and relays a message to an SRQ of a third process that is
  // stopped before it takes it; every registration goes meanwhile and the creator exits. See the
  // tests below. `timeout`: the sender's.
  void RelayIntoAStoppedHolderThenExit(uint8_t timeout) {
    ASSERT_NO_FATAL_FAILURE(StartCreator(timeout));
    ForkedPeer holder;  // an SRQ of the domain, in a process that holds no registration
    std::string f = file;
    ASSERT_TRUE(holder.Start([f](int up, int down) { return SrqOwner(ChildPipe{up, down}, f); }));
    uint32_t srqn = 0;
    ASSERT_TRUE(holder.Recv(&srqn));
    ASSERT_TRUE(holder.Send('P') && holder.Send('P'));
    ASSERT_TRUE(creator.Send('U'));
    ASSERT_NO_FATAL_FAILURE(Stream(0, 4));  // the creator serves (and has heard the 'U')
    ASSERT_NO_FATAL_FAILURE(ExpectReceived(0, 4));
    auto holder_completion = [&](ChildWc* c) {
      char tag = 0;
      return holder.Send('W') && holder.Recv(&tag, milliseconds(10000)) && tag == 'C' &&
             holder.Recv(c);
    };
    // One message opens the way to the holder; the next reaches it while it is stopped.
    ibv_wc wc{};
    ChildWc c{};
    ASSERT_EQ(PostTo(srqn, 100, buf->Sge(0, 8)), 0);
    ASSERT_TRUE(PollOne(scq, &wc, milliseconds(5000)));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << WcStr(wc);
    ASSERT_TRUE(holder_completion(&c));
    ASSERT_EQ(c.status, IBV_WC_SUCCESS);
    ASSERT_EQ(kill(holder.pid(), SIGSTOP), 0);
    ASSERT_EQ(PostTo(srqn, 101, buf->Sge(0, 8)), 0);
    std::this_thread::sleep_for(milliseconds(100));  // relayed into the stopped holder
    ASSERT_EQ(ibv_unreg_xrc_rcv_qp(dom, rcv), 0);    // the last registration
    rcv = 0;
    ASSERT_TRUE(creator.Send('X'));
    std::this_thread::sleep_for(milliseconds(300));  // the creator is in its exit by now
    ASSERT_EQ(kill(holder.pid(), SIGCONT), 0);
    ASSERT_TRUE(holder_completion(&c)) << "the holder did not complete the message";
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    ASSERT_TRUE(PollOne(scq, &wc, milliseconds(10000))) << "no completion: the sender hangs";
    EXPECT_EQ(wc.wr_id, 101u);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "a message its receiver completed: " << WcStr(wc);
    int cst = creator.Wait(milliseconds(10000));
    EXPECT_TRUE(WIFEXITED(cst) && WEXITSTATUS(cst) == 0) << "creator status " << cst;
    EXPECT_TRUE(holder.Send('X'));
    EXPECT_EQ(holder.Wait(), 0);
  }

  ibv_xrc_domain* dom = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  Buffer* buf = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp* sender = nullptr;
  uint32_t rcv = 0;
  ForkedPeer creator;
};

TEST_F(XrcHandOver, ARegisteredProcessTakesTheReceiveQpOverWhenItsCreatorExitsMidStream) {
  ASSERT_NO_FATAL_FAILURE(StartCreator());
  bool gone = false;
  // The creator leaves while messages stream through its QP (and one may be relayed to us).
  ASSERT_NO_FATAL_FAILURE(Stream(0, kMessages, [&](int i) {
    if (i == kMessages / 3) {
      ASSERT_TRUE(creator.Send('U') && creator.Send('X'));
    }
    if (i == 2 * kMessages / 3) {
      int st = creator.Wait(milliseconds(10000));
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "creator status " << st;
      gone = true;
    }
  }));
  EXPECT_TRUE(gone);
  ASSERT_NO_FATAL_FAILURE(ExpectReceived(0, kMessages));
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_xrc_rcv_qp(dom, rcv, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTR);
}

TEST_F(XrcHandOver, ItsSlotStaysReachableWhenAProcessStartsAfterTheCreatorLeft) {
  ASSERT_NO_FATAL_FAILURE(StartCreator());
  ASSERT_NO_FATAL_FAILURE(Stream(0, 10));
  ASSERT_NO_FATAL_FAILURE(ExitCreator(/*unregister_first=*/false));
  const uint16_t slot = static_cast<uint16_t>(rcv >> 13);
  const std::string slot_file =
      std::string(getenv("SOFTRDMA_RUNDIR") ? getenv("SOFTRDMA_RUNDIR") : "/dev/shm/softrdma") +
      "/slot-" + std::to_string(slot);
  struct stat st {};
  ASSERT_EQ(stat(slot_file.c_str(), &st), 0) << "handed over, not removed";
  // A starting process sweeps slot files nobody locks; this one is held for its target.
  ForkedPeer starter;
  ASSERT_TRUE(starter.Start([](int up, int down) { return Starter(ChildPipe{up, down}); }));
  uint32_t its_slot = 0;
  ASSERT_TRUE(starter.Recv(&its_slot));
  EXPECT_NE(its_slot, slot);
  EXPECT_EQ(starter.Wait(), 0);
  EXPECT_EQ(stat(slot_file.c_str(), &st), 0) << "swept although a process holds its target";
  ASSERT_NO_FATAL_FAILURE(Stream(10, 40));
  ASSERT_NO_FATAL_FAILURE(ExpectReceived(0, 40));

  // The last registration goes: the target, and with it the slot, are gone.
  ASSERT_EQ(ibv_unreg_xrc_rcv_qp(dom, rcv), 0);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_xrc_rcv_qp(dom, rcv, &attr, IBV_QP_STATE, &init), EINVAL);
  rcv = 0;
  EXPECT_NE(stat(slot_file.c_str(), &st), 0) << "the last holder removes the slot's file";
  EXPECT_NE(stat((slot_file + ".held").c_str(), &st), 0);
}

// The creator serves the target while every registration goes (ours last: the number is gone
// for new users) and relays a message to an SRQ of a third process, which is stopped before it
// takes it. The creator exits meanwhile; the third process then completes the message. Its sender
// must hear so: the exiting server waits for the answer to what it relayed and acknowledges it.
// (Before, a server whose target had lost its last registration elsewhere exited at once: the
// receiver completed a message whose sender failed with RETRY_EXC_ERR — the legacy_xrc flake.)
TEST_F(XrcHandOver, AServerExitingAfterTheLastRegistrationWentStillAnswersWhatItRelayed) {
  // A sender that does not resend while the holder is stopped.
  RelayIntoAStoppedHolderThenExit(/*timeout=*/20);  // ~4 s
}

// The same with the sender resending meanwhile (every ~67 ms): the resends reach a target whose
// last registration has gone, and are dropped, but the server keeps the QP until the message it
// relayed is answered.
TEST_F(XrcHandOver, AServerStillAnswersWhatItRelayedWhenTheSenderResendsMeanwhile) {
  RelayIntoAStoppedHolderThenExit(/*timeout=*/14);
}

TEST_F(XrcHandOver, AKilledCreatorTakesTheQpWithItAndItsSenderFailsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCreator());
  ASSERT_NO_FATAL_FAILURE(Stream(0, 10));
  ASSERT_NO_FATAL_FAILURE(ExpectReceived(0, 10));
  creator.Kill();  // no exit handler: nobody takes the QP over
  ASSERT_EQ(Post(10), 0);
  ibv_wc wc{};
  ASSERT_TRUE(PollOne(scq, &wc, milliseconds(5000))) << "no completion: the sender hangs";
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << WcStr(wc);
  EXPECT_EQ(Drain(rcq).size(), 0u);
  // Our registration stays until we drop it; then nobody can register for the number again.
  EXPECT_EQ(ibv_unreg_xrc_rcv_qp(dom, rcv), 0);
  EXPECT_EQ(ibv_reg_xrc_rcv_qp(dom, rcv), EINVAL);
  rcv = 0;
}

}  // namespace
