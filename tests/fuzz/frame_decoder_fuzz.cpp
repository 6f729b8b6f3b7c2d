// libFuzzer target: the bytes an untrusted peer sends to a softrdma node over TCP.
//
// An input is what a peer writes on a connection: the 24-byte Hello, then frames (8-byte link
// header + IB headers + payload). Each input is taken two ways:
//
//  1. Pure decoding, in this thread: DecodeHello and DecodeLinkHeader (src/link/frame_codec.cpp)
//     walk the stream as TcpChannel does, and core::ParseFrame (the structural check that
//     Hca::OnFrameHeader applies) checks each frame's IB headers, each copied into a buffer of its
//     exact size so that ASan sees any read past it. Their results are checked against what they
//     promise (lengths in range, pointers inside the header, encode/decode round trip).
//  2. The real path: the input goes over a TCP connection to 127.0.0.1 into this process's own
//     endpoint, whose progress thread parses the stream (TcpChannel), dispatches every frame
//     through Hca::OnFrameHeader/OnFrameEnd/OnFrameAbort to real QPs (an RC responder, an RC
//     requester with requests outstanding, an RC QP on an SRQ, a UC and a UD QP), which place
//     payloads into memory regions that are heap blocks of exactly their registered size, so a
//     byte written outside a region is an ASan report. Then the harness half-closes the
//     connection and waits (bounded) for the node to close it: after a malformed frame it must
//     drop the connection; after the end of the stream it must notice the EOF.
//
// So that mutations reach deep paths without guessing process-specific numbers, a frame's
// destination QPN and its RETH/AtomicETH R_Key are read as small indices: QPN n % 7 selects one of
// the QPs above (6 = leave as is: a QP that does not exist), R_Key n % 4 one of the regions (3 =
// leave as is). Region 0 has the fixed iova 0x10000 (4096 bytes, every right), region 1 0x20000
// (64 bytes, remote read only), region 2 is local memory at its host address. The committed seeds
// (tests/fuzz/corpus, made by make_corpus.py) use these numbers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/cq.h"
#include "core/hca.h"
#include "core/mr.h"
#include "core/opcode.h"
#include "core/qp.h"
#include "core/recv_queue.h"
#include "core/wire.h"
#include "link/frame_codec.h"

using namespace softrdma;

namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr uint64_t kIova0 = 0x10000, kIova1 = 0x20000;
constexpr size_t kLen0 = 4096, kLen1 = 64, kLen2 = 1024;
constexpr int kIoTimeoutMs = 5000;

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "frame_decoder_fuzz: %s (errno %d: %s)\n", what, errno, strerror(errno));
  abort();
}
#define CHECK(cond)                            \
  do {                                         \
    if (!(cond)) Fail("check failed: " #cond); \
  } while (0)

enum QpIndex { kRcResponder, kRcRequester, kSink, kUc, kUd, kRcSrq, kNumQps };

struct Node {
  std::shared_ptr<core::Hca> hca;
  std::unique_ptr<core::Context> ctx;
  core::Pd pd{};
  std::unique_ptr<core::Cq> cq;
  std::unique_ptr<core::Srq> srq;
  // Exactly-sized heap blocks: ASan reports any access past a region.
  std::unique_ptr<uint8_t[]> mem0, mem1, mem2;
  uint32_t keys[3] = {};
  std::shared_ptr<core::Qp> qps[kNumQps];
  uint16_t port = 0;
};

Node* g_node = nullptr;

std::shared_ptr<core::Qp> NewQp(Node& n, ibv_qp_type type, bool with_srq) {
  core::Qp::Init init{};
  init.type = type;
  init.pd = &n.pd;
  init.send_cq = n.cq.get();
  init.recv_cq = n.cq.get();
  init.srq = with_srq ? n.srq.get() : nullptr;
  init.cap.max_send_wr = 8;
  init.cap.max_recv_wr = with_srq ? 0 : 8;
  init.cap.max_send_sge = 2;
  init.cap.max_recv_sge = with_srq ? 0 : 2;
  init.cap.max_inline_data = 64;
  int err = 0;
  auto qp = n.hca->CreateQp(*n.ctx, init, &err);
  CHECK(qp != nullptr);
  return qp;
}

// RESET, then up to INIT (sink) or RTS, connected to `dest` through the in-process link.
void Reconnect(Node& n, core::Qp& qp, uint32_t dest, bool to_rts) {
  ibv_qp_type type = qp.type();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  CHECK(qp.Modify(a, IBV_QP_STATE) == 0);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  mask |= type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
  CHECK(qp.Modify(a, mask) == 0);
  if (!to_rts) return;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (type != IBV_QPT_UD) {
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = dest;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    a.ah_attr.dlid = n.hca->lid();
    a.ah_attr.port_num = 1;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  CHECK(qp.Modify(a, mask) == 0);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  a.timeout = 0;  // no retransmission: the requester's outstanding requests stay outstanding
  a.retry_cnt = 1;
  a.rnr_retry = 1;
  a.max_rd_atomic = 4;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (type == IBV_QPT_RC)
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  CHECK(qp.Modify(a, mask) == 0);
}

ibv_sge Local(Node& n, size_t offset, uint32_t len) {
  return ibv_sge{reinterpret_cast<uintptr_t>(n.mem2.get()) + offset, len, n.keys[2]};
}

void PostRecvs(Node& n, core::Qp& qp, size_t offset) {
  ibv_sge one = Local(n, offset, 64);
  ibv_sge two[2] = {Local(n, offset + 64, 24), Local(n, offset + 88, 40)};
  ibv_recv_wr wr[2] = {};
  wr[0].wr_id = 1;
  wr[0].sg_list = &one;
  wr[0].num_sge = 1;
  wr[0].next = &wr[1];
  wr[1].wr_id = 2;
  wr[1].sg_list = two;
  wr[1].num_sge = 2;
  const ibv_recv_wr* bad = nullptr;
  CHECK(qp.PostRecv(wr, &bad) == 0);
}

// Every QP back to a known state, receives posted, the requester with four requests outstanding
// (PSNs 0..3: SEND, RDMA WRITE, RDMA READ, FETCH_ADD) that its peer, left in INIT, never answers.
void ResetNode(Node& n) {
  for (int i = 0; i < 2 && n.hca->Progress(true); ++i) {
  }
  ibv_wc wc[64];
  for (int i = 0; i < 64 && n.cq->Poll(64, wc) > 0; ++i) {
  }
  n.ctx->async_events().Purge([](const ibv_async_event&) { return true; });

  uint32_t requester = n.qps[kRcRequester]->qpn();
  Reconnect(n, *n.qps[kSink], 0, false);
  Reconnect(n, *n.qps[kRcResponder], requester, true);
  Reconnect(n, *n.qps[kRcRequester], n.qps[kSink]->qpn(), true);
  Reconnect(n, *n.qps[kUc], n.qps[kSink]->qpn(), true);
  Reconnect(n, *n.qps[kUd], 0, true);
  Reconnect(n, *n.qps[kRcSrq], requester, true);
  PostRecvs(n, *n.qps[kRcResponder], 0);
  PostRecvs(n, *n.qps[kUc], 128);
  PostRecvs(n, *n.qps[kUd], 256);
  while (n.srq->size() < 4) {
    ibv_sge s = Local(n, 384, 128);
    ibv_recv_wr wr{};
    wr.wr_id = 3;
    wr.sg_list = &s;
    wr.num_sge = 1;
    const ibv_recv_wr* bad = nullptr;
    CHECK(n.srq->Post(&wr, &bad) == 0);
  }

  ibv_sge s_send = Local(n, 512, 8), s_read = Local(n, 576, 16), s_atomic = Local(n, 640, 8);
  ibv_send_wr wr[4] = {};
  wr[0].opcode = IBV_WR_SEND;
  wr[0].sg_list = &s_send;
  wr[0].num_sge = 1;
  wr[1].opcode = IBV_WR_RDMA_WRITE;
  wr[1].sg_list = &s_send;
  wr[1].num_sge = 1;
  wr[1].wr.rdma.remote_addr = kIova0;
  wr[1].wr.rdma.rkey = 0x1234;
  wr[2].opcode = IBV_WR_RDMA_READ;
  wr[2].sg_list = &s_read;
  wr[2].num_sge = 1;
  wr[2].wr.rdma.remote_addr = kIova0;
  wr[2].wr.rdma.rkey = 0x1234;
  wr[3].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr[3].sg_list = &s_atomic;
  wr[3].num_sge = 1;
  wr[3].wr.atomic.remote_addr = kIova0;
  wr[3].wr.atomic.rkey = 0x1234;
  wr[3].wr.atomic.compare_add = 1;
  for (int i = 0; i < 4; ++i) {
    wr[i].wr_id = 100 + i;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].next = i < 3 ? &wr[i + 1] : nullptr;
  }
  const ibv_send_wr* bad = nullptr;
  CHECK(n.qps[kRcRequester]->PostSend(wr, &bad) == 0);
}

Node* Setup() {
  if (!getenv("SOFTRDMA_RUNDIR")) {
    static char dir[] = "/tmp/softrdma-fuzz-XXXXXX";
    if (!mkdtemp(dir)) Fail("mkdtemp");
    setenv("SOFTRDMA_RUNDIR", dir, 1);
  }
  auto* n = new Node();
  std::string err;
  n->hca = core::Hca::Get(&err);
  if (!n->hca) Fail(("cannot start the HCA: " + err).c_str());
  n->ctx = std::make_unique<core::Context>(n->hca);
  n->pd.handle = n->hca->NewPdHandle();
  n->cq = std::make_unique<core::Cq>(*n->ctx, 4096, nullptr, nullptr, false);
  n->srq = std::make_unique<core::Srq>(*n->ctx, &n->pd, 8, 1, nullptr);
  n->mem0.reset(new uint8_t[kLen0]());
  n->mem1.reset(new uint8_t[kLen1]());
  n->mem2.reset(new uint8_t[kLen2]());
  constexpr int kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  n->keys[0] = n->hca->mrs().Insert(core::Mr{&n->pd, n->mem0.get(), kLen0, kIova0, kRemote, 0});
  n->keys[1] = n->hca->mrs().Insert(
      core::Mr{&n->pd, n->mem1.get(), kLen1, kIova1, IBV_ACCESS_REMOTE_READ, 0});
  n->keys[2] = n->hca->mrs().Insert(core::Mr{
      &n->pd, n->mem2.get(), kLen2, reinterpret_cast<uintptr_t>(n->mem2.get()), kRemote, 0});
  n->qps[kRcResponder] = NewQp(*n, IBV_QPT_RC, false);
  n->qps[kRcRequester] = NewQp(*n, IBV_QPT_RC, false);
  n->qps[kSink] = NewQp(*n, IBV_QPT_RC, false);
  n->qps[kUc] = NewQp(*n, IBV_QPT_UC, false);
  n->qps[kUd] = NewQp(*n, IBV_QPT_UD, false);
  n->qps[kRcSrq] = NewQp(*n, IBV_QPT_RC, true);
  // The endpoint's TCP port, from GID 0: fe80::<ipv4:4><port:2><slot:2>.
  const ibv_gid& gid = n->hca->gids().at(0);
  n->port = static_cast<uint16_t>(gid.raw[12] << 8 | gid.raw[13]);
  CHECK(n->port != 0);
  return n;
}

// ---- 1. Pure decoding -------------------------------------------------------------------------

// Rewrites the small-index QPN and R_Key of a frame that parsed (see the file comment).
void Remap(Node& n, uint8_t* hdr, const core::Packet& p) {
  auto* bth = const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(p.bth));
  uint32_t q = wire::Load24(bth + 5);
  if (q % (kNumQps + 1) < kNumQps) wire::Store24(bth + 5, n.qps[q % (kNumQps + 1)]->qpn());
  auto remap_key = [&](uint8_t ext_offset, size_t key_offset) {
    uint8_t* k = bth + ext_offset + key_offset;
    uint32_t v = wire::Load32(k);
    if (v % 4 < 3) wire::Store32(k, n.keys[v % 4]);
  };
  if (p.info->has(core::kHasReth)) remap_key(p.info->reth, offsetof(wire::Reth, rkey));
  if (p.info->has(core::kHasAtomicEth))
    remap_key(p.info->atomic_eth, offsetof(wire::AtomicEth, rkey));
  (void)hdr;
}

// Walks the stream as TcpChannel does; remaps the frames that a node would dispatch.
void DecodeStream(Node& n, std::vector<uint8_t>& s) {
  if (s.size() < sizeof(link::Hello)) return;
  {
    std::vector<uint8_t> hello(s.begin(), s.begin() + sizeof(link::Hello));
    link::NodeId id;
    if (!link::DecodeHello(hello.data(), &id)) return;
    CHECK(std::memcmp(id.bytes, hello.data() + 8, sizeof id.bytes) == 0);
    std::vector<uint8_t> again(sizeof(link::Hello));
    link::EncodeHello(again.data(), id);
    link::NodeId id2;
    CHECK(link::DecodeHello(again.data(), &id2));
  }
  size_t at = sizeof(link::Hello);
  for (int frames = 0; frames < 4096 && s.size() - at >= sizeof(link::LinkHeader); ++frames) {
    std::vector<uint8_t> lh(s.begin() + at, s.begin() + at + sizeof(link::LinkHeader));
    link::DecodedHeader h;
    if (!link::DecodeLinkHeader(lh.data(), &h)) return;
    CHECK(h.hdr_len >= 1 && h.hdr_len <= link::kMaxHeaderBytes);
    CHECK(h.payload_len <= link::kMaxFramePayload);
    uint8_t re[sizeof(link::LinkHeader)];
    link::EncodeLinkHeader(re, h.hdr_len, h.payload_len, h.flags);
    link::DecodedHeader h2;
    CHECK(link::DecodeLinkHeader(re, &h2) && h2.hdr_len == h.hdr_len &&
          h2.payload_len == h.payload_len && h2.flags == h.flags);
    CHECK(!(h.flags & link::kLinkFlagCredit) ||
          (h.hdr_len == link::kCreditBytes && h.payload_len == 0));
    at += sizeof(link::LinkHeader);
    if (s.size() - at < h.hdr_len) return;
    std::vector<uint8_t> hdr(s.begin() + at, s.begin() + at + h.hdr_len);
    core::Packet p{};
    if (!core::ParseFrame(hdr.data(), hdr.size(), h.payload_len, &p)) return;  // node hangs up
    const uint8_t* lo = hdr.data();
    const uint8_t* hi = hdr.data() + hdr.size();
    auto inside = [&](const void* q, size_t len) {
      auto* b = static_cast<const uint8_t*>(q);
      return b >= lo && b + len <= hi;
    };
    CHECK(inside(p.lrh, sizeof(wire::Lrh)) && inside(p.bth, sizeof(wire::Bth)));
    CHECK(!p.grh || inside(p.grh, sizeof(wire::Grh)));
    CHECK(p.info && p.info->valid() && p.payload_len == h.payload_len);
    CHECK(reinterpret_cast<const uint8_t*>(p.bth) + p.info->length == hi);
    Remap(n, hdr.data(), p);
    std::memcpy(s.data() + at, hdr.data(), hdr.size());
    at += h.hdr_len;
    if (s.size() - at < h.payload_len) return;  // truncated: the node sees EOF mid-frame
    at += h.payload_len;
  }
}

// ---- 2. The real path -------------------------------------------------------------------------

bool WaitFd(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd, events, 0};
  int r = poll(&p, 1, static_cast<int>(left.count()));
  return r > 0 || (r < 0 && errno == EINTR);
}

// Waits for a non-blocking connect to finish; false (errno set) when it failed or timed out.
bool FinishConnect(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      errno = ETIMEDOUT;
      return false;
    }
    pollfd p{fd, POLLOUT, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    int soerr = 0;
    socklen_t len = sizeof soerr;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr != 0) {
      errno = soerr;
      return false;
    }
    return true;
  }
}

void SendToNode(Node& n, const std::vector<uint8_t>& s) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  linger lg{1, 0};  // abortive close: no TIME_WAIT pile-up over hundreds of thousands of runs
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(n.port);
  CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
  // Non-blocking: libFuzzer's SIGALRM (its -timeout watchdog) would interrupt a blocking connect.
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) Fail("connect to the node");
    if (!FinishConnect(fd, deadline)) Fail("connect to the node");
  }
  uint8_t sink[16384];
  size_t done = 0;
  bool peer_gone = false;
  // Write the input while draining what the node answers (it never blocks on us).
  while (done < s.size() && !peer_gone) {
    ssize_t w = send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      peer_gone = true;  // it hung up on a malformed frame: fine
      break;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) Fail("send");
    ssize_t r = recv(fd, sink, sizeof sink, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) peer_gone = true;
    if (r < 0 && !WaitFd(fd, POLLIN | POLLOUT, deadline)) Fail("node stopped reading");
  }
  shutdown(fd, SHUT_WR);
  // Every frame before the EOF is handled before the node closes the connection.
  for (;;) {
    ssize_t r = recv(fd, sink, sizeof sink, 0);
    if (r == 0 || (r < 0 && (errno == ECONNRESET || errno == EPIPE))) break;
    if (r > 0) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) Fail("recv");
    if (!WaitFd(fd, POLLIN, deadline)) Fail("the node kept a finished connection open");
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_node = Setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Node& n = *g_node;
  ResetNode(n);
  std::vector<uint8_t> stream(data, data + size);
  DecodeStream(n, stream);
  SendToNode(n, stream);
  return 0;
}
