// XRC across processes: the initiator and the target QP in this process, the XRC SRQ in a forked
// child that opened the same domain file. The target relays each SEND to the child, which
// completes it on its SRQ's CQ; the initiator's completion says how it went. Also the refusals: an
// SRQ of another domain file, and an SRQ number whose process is gone.
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/semantics_harness.h"
#include "support/xrc_srq_owner.h"

namespace {

using namespace semantics;

// What the child reports for each completion of its SRQ's CQ.
class XrcProcesses : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    file = MakeFile();
    ASSERT_FALSE(file.empty());
    file_fd = open(file.c_str(), O_RDONLY);
    ASSERT_GE(file_fd, 0);
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = file_fd;
    xa.oflags = O_CREAT;
    xrcd = ibv_open_xrcd(v.ctx, &xa);
    ASSERT_NE(xrcd, nullptr);
    cq = v.NewCq(16);
    buf = Buf(4096);
    ASSERT_TRUE(cq && buf);

    ASSERT_EQ(NewXrcPair(v, xrcd, cq, 2, &send_qp, &recv_qp), 0) << strerror(errno);
  }
  void TearDown() override {
    if (send_qp) ibv_destroy_qp(send_qp);
    if (recv_qp) ibv_destroy_qp(recv_qp);
    if (xrcd) ibv_close_xrcd(xrcd);
    if (file_fd >= 0) close(file_fd);
    for (const std::string& f : files_) unlink(f.c_str());
    VerbsTest::TearDown();
  }
  std::string MakeFile() {
    char path[] = "/tmp/softrdma-xrcd-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return {};
    close(fd);
    files_.emplace_back(path);
    return path;
  }
  // Starts the SRQ's owner on `domain_file`; its SRQ number in `srqn`.
  void StartOwner(const std::string& domain_file) {
    ASSERT_TRUE(child.Start([domain_file](int up, int down) {
      return SrqOwner(ChildPipe{up, down}, domain_file);
    }));
    ASSERT_TRUE(child.Recv(&srqn));
  }
  int Send(uint64_t wr_id, const char* text, bool with_imm = false) {
    std::strcpy(reinterpret_cast<char*>(buf->data()) + wr_id * 64, text);
    ibv_sge sge = buf->Sge(wr_id * 64, static_cast<uint32_t>(std::strlen(text) + 1));
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    wr.imm_data = htonl(0x5eed);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.qp_type.xrc.remote_srqn = srqn;
    return ibv_post_send(send_qp, &wr, &bad);
  }
  // Send completions 1..n arrive in order, each a success.
  void ExpectSendsSucceed(uint64_t n) {
    ibv_wc wc;
    for (uint64_t id = 1; id <= n; ++id) {
      ASSERT_TRUE(PollOne(cq, &wc));
      EXPECT_EQ(wc.wr_id, id);
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    }
  }
  bool ChildCompletion(ChildWc* out) {
    char tag = 0;
    return child.Send('W') && child.Recv(&tag, milliseconds(10000)) && tag == 'C' &&
           child.Recv(out);
  }

  std::string file;
  int file_fd = -1;
  ibv_xrcd* xrcd = nullptr;
  ibv_cq* cq = nullptr;
  Buffer* buf = nullptr;
  ibv_qp* send_qp = nullptr;
  ibv_qp* recv_qp = nullptr;
  ForkedPeer child;
  uint32_t srqn = 0;

 private:
  std::vector<std::string> files_;
};

TEST_F(XrcProcesses, ASendThroughOurTargetCompletesOnTheOwnersSrqCq) {
  StartOwner(file);
  ASSERT_NE(srqn >> 13, v.port.lid) << "the SRQ is the child's";
  ASSERT_TRUE(child.Send('P') && child.Send('P'));
  ASSERT_EQ(Send(1, "first"), 0);
  ASSERT_EQ(Send(2, "second", true), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectSendsSucceed(2));
  ChildWc c{};
  ASSERT_TRUE(ChildCompletion(&c));
  EXPECT_EQ(c.wr_id, kChildWrBase);
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(c.byte_len, 6u);
  EXPECT_EQ(c.qp_num, recv_qp->qp_num) << "an XRC receive names the target QP it came through";
  EXPECT_EQ(c.src_qp, send_qp->qp_num);
  EXPECT_STREQ(c.data, "first");
  EXPECT_FALSE(c.wc_flags & IBV_WC_WITH_IMM);
  ASSERT_TRUE(ChildCompletion(&c));
  EXPECT_EQ(c.wr_id, kChildWrBase + 1);
  EXPECT_STREQ(c.data, "second");
  EXPECT_TRUE(c.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(c.imm), 0x5eedu);
  ASSERT_TRUE(child.Send('X'));
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(XrcProcesses, WithoutAReceiveTheSenderWaitsAndTheMessageArrivesOncePosted) {
  StartOwner(file);
  ASSERT_EQ(Send(1, "patient"), 0);
  ASSERT_EQ(Send(2, "queued behind"), 0);
  EXPECT_TRUE(Drain(cq, milliseconds(100)).empty()) << "RNR: nothing completes without a receive";
  ASSERT_TRUE(child.Send('P') && child.Send('P'));
  ASSERT_NO_FATAL_FAILURE(ExpectSendsSucceed(2));
  ChildWc c{};
  ASSERT_TRUE(ChildCompletion(&c));
  EXPECT_STREQ(c.data, "patient");
  ASSERT_TRUE(ChildCompletion(&c));
  EXPECT_STREQ(c.data, "queued behind");
  ASSERT_TRUE(child.Send('X'));
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(XrcProcesses, AnSrqOfAnotherDomainFileFailsTheSenderAndGetsNothing) {
  StartOwner(MakeFile());
  ASSERT_TRUE(child.Send('P'));
  ASSERT_EQ(Send(1, "not yours"), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
  uint32_t got = 99;
  ASSERT_TRUE(child.Send('Q') && child.Recv(&got));
  EXPECT_EQ(got, 0u) << "nothing reaches another domain's SRQ";
  ASSERT_TRUE(child.Send('X'));
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(XrcProcesses, AnSrqNumberWhoseProcessIsGoneFailsTheSender) {
  StartOwner(file);
  ASSERT_TRUE(child.Send('X'));
  ASSERT_EQ(child.Wait(), 0);
  ASSERT_EQ(Send(1, "too late"), 0);
  ibv_wc wc;
  ASSERT_TRUE(PollOne(cq, &wc, milliseconds(10000)));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
}

}  // namespace
