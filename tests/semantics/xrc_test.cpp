// XRC domains and XRC SRQs: ibv_open_xrcd's file semantics and errno values (those of the kernel's
// uverbs, which rdma-core passes through), SRQ numbers, and the references that keep a domain and
// a CQ from going while an XRC SRQ uses them.
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "support/semantics_harness.h"

namespace {

using namespace semantics;

class Xrc : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    char path[] = "/tmp/softrdma-xrcd-XXXXXX";
    file_fd = mkstemp(path);
    ASSERT_GE(file_fd, 0);
    file = path;
    cq = ibv_create_cq(v.ctx, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
  }
  void TearDown() override {
    if (cq) ibv_destroy_cq(cq);
    close(file_fd);
    unlink(file.c_str());
    VerbsTest::TearDown();
  }
  ibv_xrcd* Open(int fd, int oflags) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = fd;
    a.oflags = oflags;
    errno = 0;
    return ibv_open_xrcd(v.ctx, &a);
  }
  ibv_srq* XrcSrq(ibv_xrcd* x, ibv_cq* c) {
    ibv_srq_init_attr_ex a{};
    a.attr.max_wr = 8;
    a.attr.max_sge = 1;
    a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
    if (c) a.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
    a.srq_type = IBV_SRQT_XRC;
    a.pd = v.pd;
    a.xrcd = x;
    a.cq = c;
    errno = 0;
    return ibv_create_srq_ex(v.ctx, &a);
  }
  int file_fd = -1;
  std::string file;
  ibv_cq* cq = nullptr;
};

TEST_F(Xrc, APrivateDomainNeedsNoFile) {
  ibv_xrcd* x = Open(-1, O_CREAT);
  ASSERT_NE(x, nullptr) << strerror(errno);
  EXPECT_EQ(x->context, v.ctx);
  EXPECT_EQ(ibv_close_xrcd(x), 0);
}

TEST_F(Xrc, OpeningTakesTheFileAndTheFlagsOrFails) {
  ibv_xrcd_init_attr a{};
  a.fd = -1;
  a.oflags = O_CREAT;
  a.comp_mask = IBV_XRCD_INIT_ATTR_OFLAGS;
  EXPECT_EQ(ibv_open_xrcd(v.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS | IBV_XRCD_INIT_ATTR_RESERVED;
  EXPECT_EQ(ibv_open_xrcd(v.ctx, &a), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(Open(-1, O_CREAT | O_TRUNC), nullptr);
  EXPECT_EQ(errno, EINVAL) << "flags other than O_CREAT and O_EXCL";
  EXPECT_EQ(Open(1 << 20, O_CREAT), nullptr) << "no such file descriptor";
  EXPECT_EQ(errno, EBADF);
}

TEST_F(Xrc, AFileNamesOneDomainWhileAHandleToItIsOpen) {
  EXPECT_EQ(Open(file_fd, 0), nullptr) << "no domain for the file yet, and no O_CREAT";
  EXPECT_EQ(errno, EINVAL);
  ibv_xrcd* first = Open(file_fd, O_CREAT | O_EXCL);
  ASSERT_NE(first, nullptr) << strerror(errno);
  EXPECT_EQ(Open(file_fd, O_CREAT | O_EXCL), nullptr) << "the domain exists";
  EXPECT_EQ(errno, EINVAL);
  int again_fd = open(file.c_str(), O_RDONLY);  // another file description, the same inode
  ASSERT_GE(again_fd, 0);
  ibv_xrcd* second = Open(again_fd, 0);
  ASSERT_NE(second, nullptr) << strerror(errno);
  close(again_fd);
  EXPECT_EQ(ibv_close_xrcd(first), 0);
  ibv_xrcd* third = Open(file_fd, 0);
  EXPECT_NE(third, nullptr) << "the second handle keeps the domain";
  if (third) {
    EXPECT_EQ(ibv_close_xrcd(third), 0);
  }
  EXPECT_EQ(ibv_close_xrcd(second), 0);
  EXPECT_EQ(Open(file_fd, 0), nullptr) << "the last handle closed: the domain is gone";
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Xrc, AnXrcSrqHasANumberAndNeedsADomainAndACq) {
  ibv_xrcd* x = Open(-1, O_CREAT);
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(XrcSrq(x, nullptr), nullptr);
  EXPECT_EQ(errno, EINVAL) << "no CQ";
  EXPECT_EQ(XrcSrq(nullptr, cq), nullptr);
  EXPECT_EQ(errno, EINVAL) << "no domain";
  std::set<uint32_t> numbers;
  ibv_srq* srqs[3];
  for (ibv_srq*& s : srqs) {
    s = XrcSrq(x, cq);
    ASSERT_NE(s, nullptr) << strerror(errno);
    uint32_t n = 0;
    ASSERT_EQ(ibv_get_srq_num(s, &n), 0);
    EXPECT_NE(n, 0u);
    EXPECT_LT(n, 1u << 24) << "an XRCETH carries 24 bits";
    numbers.insert(n);
  }
  EXPECT_EQ(numbers.size(), 3u) << "numbers are distinct";

  ibv_srq_init_attr basic{};
  basic.attr.max_wr = 4;
  basic.attr.max_sge = 1;
  ibv_srq* plain = ibv_create_srq(v.pd, &basic);
  ASSERT_NE(plain, nullptr);
  uint32_t n = 0;
  EXPECT_EQ(ibv_get_srq_num(plain, &n), EINVAL) << "only XRC SRQs are named by number";
  EXPECT_EQ(ibv_destroy_srq(plain), 0);

  EXPECT_EQ(ibv_close_xrcd(x), EBUSY) << "XRC SRQs use the domain";
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY) << "XRC SRQs complete on the CQ";
  for (ibv_srq* s : srqs) EXPECT_EQ(ibv_destroy_srq(s), 0);
  EXPECT_EQ(ibv_close_xrcd(x), 0);
}

// ---- XRC QPs ----------------------------------------------------------------------------------

// One initiator (XRC_SEND) connected to one target (XRC_RECV) of a domain with two XRC SRQs, each
// completing on its own CQ: the sender picks the SRQ per message.
class XrcTraffic : public Xrc {
 protected:
  void SetUp() override {
    Xrc::SetUp();
    xrcd = Open(-1, O_CREAT);
    ASSERT_NE(xrcd, nullptr);
    for (int i = 0; i < 2; ++i) {
      srq_cq[i] = ibv_create_cq(v.ctx, 16, nullptr, nullptr, 0);
      ASSERT_NE(srq_cq[i], nullptr);
      srq[i] = XrcSrq(xrcd, srq_cq[i]);
      ASSERT_NE(srq[i], nullptr) << strerror(errno);
      ASSERT_EQ(ibv_get_srq_num(srq[i], &srqn[i]), 0);
    }
    buf = Buf(4096);
    ASSERT_NE(buf, nullptr);

    ASSERT_EQ(NewXrcPair(v, xrcd, cq, 1, &send_qp, &recv_qp), 0) << strerror(errno);
  }
  void TearDown() override {
    if (send_qp) {
      EXPECT_EQ(ibv_destroy_qp(send_qp), 0);
    }
    if (recv_qp) {
      EXPECT_EQ(ibv_destroy_qp(recv_qp), 0);
    }
    for (int i = 0; i < 2; ++i) {
      if (srq[i]) {
        EXPECT_EQ(ibv_destroy_srq(srq[i]), 0);
      }
      if (srq_cq[i]) {
        EXPECT_EQ(ibv_destroy_cq(srq_cq[i]), 0);
      }
    }
    if (xrcd) {
      EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
    }
    Xrc::TearDown();
  }
  int PostSrqRecv(int i, uint64_t wr_id, size_t off) {
    ibv_sge sge{buf->addr() + off, 64, buf->lkey()};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_srq_recv(srq[i], &wr, &bad);
  }
  int SendTo(uint32_t remote_srqn, uint64_t wr_id, size_t off, uint32_t len) {
    ibv_sge sge{buf->addr() + off, len, buf->lkey()};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.qp_type.xrc.remote_srqn = remote_srqn;
    return ibv_post_send(send_qp, &wr, &bad);
  }
  ibv_xrcd* xrcd = nullptr;
  ibv_cq* srq_cq[2] = {};
  ibv_srq* srq[2] = {};
  uint32_t srqn[2] = {};
  Buffer* buf = nullptr;
  ibv_qp* send_qp = nullptr;
  ibv_qp* recv_qp = nullptr;
};

TEST_F(XrcTraffic, TheSenderPicksTheSrqAndItsCqGetsTheCompletion) {
  ASSERT_EQ(PostSrqRecv(0, 100, 1024), 0);
  ASSERT_EQ(PostSrqRecv(1, 200, 2048), 0);
  std::memcpy(buf->data(), "to-srq-one", 11);
  std::memcpy(buf->data() + 64, "to-srq-zero", 12);
  ASSERT_EQ(SendTo(srqn[1], 1, 0, 11), 0);
  ASSERT_EQ(SendTo(srqn[0], 2, 64, 12), 0);
  ibv_wc wc;
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(PollOne(cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, id);
  }
  ASSERT_TRUE(PollOne(srq_cq[1], &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 200u);
  EXPECT_EQ(wc.byte_len, 11u);
  EXPECT_EQ(wc.qp_num, recv_qp->qp_num);
  EXPECT_EQ(std::memcmp(buf->data() + 2048, "to-srq-one", 11), 0);
  ASSERT_TRUE(PollOne(srq_cq[0], &wc));
  EXPECT_EQ(wc.wr_id, 100u);
  EXPECT_EQ(wc.byte_len, 12u);
  EXPECT_EQ(std::memcmp(buf->data() + 1024, "to-srq-zero", 12), 0);
  EXPECT_TRUE(Drain(srq_cq[0]).empty());
  EXPECT_TRUE(Drain(srq_cq[1]).empty());
}

TEST_F(XrcTraffic, AnRdmaWriteThroughTheTargetChecksKeysWithTheSrqsPd) {
  std::memcpy(buf->data(), "written", 8);
  ibv_sge sge{buf->addr(), 8, buf->lkey()};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = 7;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = buf->addr() + 3000;
  wr.wr.rdma.rkey = buf->rkey();
  wr.qp_type.xrc.remote_srqn = srqn[0];
  ASSERT_EQ(ibv_post_send(send_qp, &wr, &bad), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::memcmp(buf->data() + 3000, "written", 8), 0);
  EXPECT_TRUE(Drain(srq_cq[0]).empty()) << "a WRITE consumes no receive";
}

TEST_F(XrcTraffic, AnSrqNumberTheTargetsDomainDoesNotHaveFailsTheSenderAndDeliversNothing) {
  // An SRQ of another domain, and a number no SRQ has.
  ibv_xrcd* other = Open(-1, O_CREAT);
  ASSERT_NE(other, nullptr);
  ibv_cq* other_cq = ibv_create_cq(v.ctx, 4, nullptr, nullptr, 0);
  ibv_srq* foreign = XrcSrq(other, other_cq);
  ASSERT_NE(foreign, nullptr);
  uint32_t foreign_n = 0;
  ASSERT_EQ(ibv_get_srq_num(foreign, &foreign_n), 0);
  ibv_sge sge{buf->addr(), 64, buf->lkey()};
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ASSERT_EQ(ibv_post_srq_recv(foreign, &rwr, &rbad), 0);
  ASSERT_EQ(PostSrqRecv(0, 1, 0), 0);
  ASSERT_EQ(SendTo(foreign_n, 9, 128, 8), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(cq, &wc));
  EXPECT_EQ(wc.wr_id, 9u);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_TRUE(Drain(other_cq).empty()) << "nothing reaches another domain's SRQ";
  EXPECT_TRUE(Drain(srq_cq[0]).empty());
  EXPECT_EQ(ibv_destroy_srq(foreign), 0);
  EXPECT_EQ(ibv_destroy_cq(other_cq), 0);
  EXPECT_EQ(ibv_close_xrcd(other), 0);
}

TEST_F(XrcTraffic, XrcQpsHaveNoReceiveQueueAndTheTargetNoSendQueue) {
  ibv_sge sge{buf->addr(), 8, buf->lkey()};
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  EXPECT_EQ(ibv_post_recv(send_qp, &rwr, &rbad), EINVAL);
  EXPECT_EQ(ibv_post_recv(recv_qp, &rwr, &rbad), EINVAL);
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  EXPECT_EQ(ibv_post_send(recv_qp, &wr, &bad), EINVAL);
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY) << "the target QP uses the domain";
}

}  // namespace
