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

namespace {

using namespace semantics;

// What the child reports for each completion of its SRQ's CQ.
struct ChildWc {
  uint64_t wr_id;
  uint32_t status, byte_len, qp_num, src_qp, imm, wc_flags;
  char data[16];
};

constexpr uint64_t kChildWrBase = 1000;

// The SRQ's owner: opens the domain file given, reports its SRQ number, then obeys the parent:
// 'P' posts one receive, 'W' waits for one completion and reports it ('N' when none came),
// 'Q' reports how many completions came within a quiet spell, 'X' exits.
int SrqOwner(ChildPipe p, const std::string& file) {
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
