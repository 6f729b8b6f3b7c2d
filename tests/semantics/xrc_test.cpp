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

}  // namespace
