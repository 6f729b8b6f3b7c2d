// softrdma-bench-scale: the scale probe of bench/shm_bench.sh, a plain libibverbs program (it is
// compiled against the system's <infiniband/verbs.h> and linked with -libverbs, so run it under
// `softrdma run --` to get softrdma's library).
//
//   softrdma-bench-scale qps [N]            (default 1000)
//     Two processes (fork) each create N RC QPs on one PD and one CQ, swap LIDs and QPNs over a
//     socketpair, connect QP i to the peer's QP i (LID addressing, no GRH), then each sends one
//     8-byte message on every QP and waits for all N send and N receive completions. Prints
//       scale-qps qps=N ok=1 setup_ms=.. create_ms=.. connect_ms=.. traffic_ms=.. destroy_ms=..
//                 bytes_per_qp=.. peer_bytes_per_qp=..
//     setup_ms is the wall time from both processes having opened the device to all 2N QPs in
//     RTS on both sides (create + connect, incl. the QPN exchange); create_ms and connect_ms are
//     this process's share. bytes_per_qp is this process's resident-memory growth (VmRSS, which
//     includes shared memory it touched) from before the first QP to after the traffic, / N.
//
//   softrdma-bench-scale mrs [N] [SIZE]     (default 10000 MRs of 4096 bytes)
//     One process registers N MRs, each on its own SIZE-byte piece of one buffer that is touched
//     beforehand (so the buffer's pages are not counted), then proves every MR works: an RDMA
//     write through a pair of connected QPs puts a distinct value into each MR by its rkey, and
//     every value is checked. Prints
//       scale-mrs mrs=N size=SIZE ok=1 reg_ms=.. bytes_per_mr=.. verify_ms=.. dereg_ms=..
//
// On failure it prints "scale-probe: <what failed>" on stderr and exits 1 (2: usage).
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPollSeconds = 60;  // bound for any wait on completions or on the peer
constexpr uint32_t kMsgBytes = 8;
// An int, not the enum: ibv_reg_mr's macro ANDs it with another enum's value (clang warns).
constexpr int kLocalWrite = IBV_ACCESS_LOCAL_WRITE;

[[noreturn]] void Fail(const char* what, int err = 0) {
  if (err)
    std::fprintf(stderr, "scale-probe [%d]: %s: %s\n", getpid(), what, std::strerror(err));
  else
    std::fprintf(stderr, "scale-probe [%d]: %s\n", getpid(), what);
  std::exit(1);
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

long RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) Fail("open /proc/self/statm", errno);
  long size = 0;
  long resident = 0;
  int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  if (n != 2) Fail("read /proc/self/statm");
  return resident * sysconf(_SC_PAGESIZE);
}

void WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) Fail("write to the peer", errno);
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Fail("read from the peer", errno);
    if (r == 0) Fail("the peer went away");
    c += r;
    n -= static_cast<size_t>(r);
  }
}

// Both processes reach this point before either goes on.
void Barrier(int fd) {
  char b = 1;
  WriteAll(fd, &b, 1);
  ReadAll(fd, &b, 1);
}

struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  uint16_t lid = 0;

  Device() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n == 0) Fail("no RDMA device (run me under `softrdma run --`)");
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (!ctx) Fail("ibv_open_device", errno);
    pd = ibv_alloc_pd(ctx);
    if (!pd) Fail("ibv_alloc_pd", errno);
    ibv_port_attr pa{};
    if (int e = ibv_query_port(ctx, 1, &pa)) Fail("ibv_query_port", e);
    lid = pa.lid;
  }
  ~Device() {
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
};

ibv_qp* CreateRcQp(ibv_pd* pd, ibv_cq* cq, uint32_t depth) {
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = depth;
  ia.cap.max_recv_wr = depth;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!qp) Fail("ibv_create_qp", errno);
  return qp;
}

void ToInit(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    Fail("ibv_modify_qp to INIT", e);
}

// INIT -> RTR -> RTS towards (dlid, dqpn), LID addressing.
void ToRts(ibv_qp* qp, uint16_t dlid, uint32_t dqpn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = dqpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = dlid;
  a.ah_attr.port_num = 1;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    Fail("ibv_modify_qp to RTR", e);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    Fail("ibv_modify_qp to RTS", e);
}

// Polls `cq` until `want` completions arrived, all successful; returns them by wr_id.
void PollAll(ibv_cq* cq, size_t want, std::vector<ibv_wc>* out = nullptr) {
  auto deadline = Clock::now() + std::chrono::seconds(kPollSeconds);
  ibv_wc wc[64];
  size_t got = 0;
  while (got < want) {
    int n = ibv_poll_cq(cq, 64, wc);
    if (n < 0) Fail("ibv_poll_cq");
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "scale-probe [%d]: completion wr_id %llu: %s\n", getpid(),
                     static_cast<unsigned long long>(wc[i].wr_id), ibv_wc_status_str(wc[i].status));
        std::exit(1);
      }
      if (out) out->push_back(wc[i]);
    }
    got += static_cast<size_t>(n);
    if (n == 0 && Clock::now() > deadline) Fail("timed out waiting for completions");
  }
}

struct QpFigures {
  double create_ms = 0;
  double connect_ms = 0;
  double traffic_ms = 0;
  double destroy_ms = 0;
  long rss_delta = 0;
};

// One side of the QP scale test; `fd` reaches the other side.
QpFigures QpSide(int fd, uint32_t n, bool parent, double* setup_ms) {
  QpFigures f;
  Device dev;
  ibv_cq* cq = ibv_create_cq(dev.ctx, static_cast<int>(2 * n + 16), nullptr, nullptr, 0);
  if (!cq) Fail("ibv_create_cq", errno);
  // Per QP: a receive slot and a send slot of kMsgBytes.
  std::vector<uint64_t> buf(2 * n, 0);
  ibv_mr* mr = ibv_reg_mr(dev.pd, buf.data(), buf.size() * sizeof(uint64_t), kLocalWrite);
  if (!mr) Fail("ibv_reg_mr", errno);

  Barrier(fd);
  long rss0 = RssBytes();
  auto t0 = Clock::now();
  std::vector<ibv_qp*> qps(n);
  std::vector<uint32_t> qpns(n);
  for (uint32_t i = 0; i < n; ++i) {
    qps[i] = CreateRcQp(dev.pd, cq, 2);
    qpns[i] = qps[i]->qp_num;
    ToInit(qps[i]);
    ibv_sge sge{reinterpret_cast<uintptr_t>(&buf[i]), kMsgBytes, mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (int e = ibv_post_recv(qps[i], &wr, &bad)) Fail("ibv_post_recv", e);
  }
  auto t1 = Clock::now();
  f.create_ms = Ms(t0, t1);

  uint16_t peer_lid = 0;
  std::vector<uint32_t> peer(n);
  WriteAll(fd, &dev.lid, sizeof dev.lid);
  WriteAll(fd, qpns.data(), n * sizeof(uint32_t));
  ReadAll(fd, &peer_lid, sizeof peer_lid);
  ReadAll(fd, peer.data(), n * sizeof(uint32_t));
  for (uint32_t i = 0; i < n; ++i) ToRts(qps[i], peer_lid, peer[i]);
  f.connect_ms = Ms(t1, Clock::now());
  Barrier(fd);  // both sides: all QPs in RTS, receives posted
  auto t2 = Clock::now();
  *setup_ms = Ms(t0, t2);

  for (uint32_t i = 0; i < n; ++i) {
    buf[n + i] = (parent ? 1ull << 32 : 2ull << 32) | i;
    ibv_sge sge{reinterpret_cast<uintptr_t>(&buf[n + i]), kMsgBytes, mr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = n + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (int e = ibv_post_send(qps[i], &wr, &bad)) Fail("ibv_post_send", e);
  }
  std::vector<ibv_wc> wcs;
  PollAll(cq, 2 * size_t{n}, &wcs);
  f.traffic_ms = Ms(t2, Clock::now());
  uint64_t from = parent ? 2ull << 32 : 1ull << 32;
  for (const ibv_wc& wc : wcs) {
    if (wc.opcode != IBV_WC_RECV) continue;
    uint32_t i = static_cast<uint32_t>(wc.wr_id);
    if (i >= n || wc.byte_len != kMsgBytes || wc.qp_num != qpns[i] || buf[i] != (from | i))
      Fail("a message arrived on the wrong QP or with the wrong content");
  }
  f.rss_delta = RssBytes() - rss0;
  Barrier(fd);  // the peer has all its completions too: safe to tear down

  auto t3 = Clock::now();
  for (ibv_qp* qp : qps)
    if (int e = ibv_destroy_qp(qp)) Fail("ibv_destroy_qp", e);
  f.destroy_ms = Ms(t3, Clock::now());
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  return f;
}

int RunQps(uint32_t n) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) Fail("socketpair", errno);
  pid_t parent_pid = getpid();
  pid_t child = fork();  // before any verbs call: each process gets its own device state
  if (child < 0) Fail("fork", errno);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent_pid) std::_Exit(1);
    close(sv[0]);
    double setup = 0;
    QpFigures f = QpSide(sv[1], n, false, &setup);
    WriteAll(sv[1], &f, sizeof f);
    std::exit(0);
  }
  close(sv[1]);
  double setup = 0;
  QpFigures f = QpSide(sv[0], n, true, &setup);
  QpFigures peer;
  ReadAll(sv[0], &peer, sizeof peer);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    Fail("the child process failed");
  std::printf(
      "scale-qps qps=%u ok=1 setup_ms=%.1f create_ms=%.1f connect_ms=%.1f traffic_ms=%.1f "
      "destroy_ms=%.1f bytes_per_qp=%ld peer_bytes_per_qp=%ld\n",
      n, setup, f.create_ms, f.connect_ms, f.traffic_ms, f.destroy_ms, f.rss_delta / long{n},
      peer.rss_delta / long{n});
  return 0;
}

int RunMrs(uint32_t n, size_t size) {
  Device dev;
  size_t len = size * n;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) Fail("mmap", errno);
  auto* base = static_cast<char*>(mem);
  std::memset(base, 0, len);

  std::vector<ibv_mr*> mrs(n);
  long rss0 = RssBytes();
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < n; ++i) {
    mrs[i] = ibv_reg_mr(dev.pd, base + size_t{i} * size, size,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!mrs[i]) Fail("ibv_reg_mr", errno);
  }
  auto t1 = Clock::now();
  long rss_delta = RssBytes() - rss0;

  // Prove the MRs work: QP a writes value i into MR i through its rkey, over QP b.
  ibv_cq* cq = ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0);
  if (!cq) Fail("ibv_create_cq", errno);
  constexpr uint32_t kWindow = 64;
  ibv_qp* a = CreateRcQp(dev.pd, cq, kWindow);
  ibv_qp* b = CreateRcQp(dev.pd, cq, kWindow);
  ToInit(a);
  ToInit(b);
  ToRts(a, dev.lid, b->qp_num);
  ToRts(b, dev.lid, a->qp_num);
  std::vector<uint64_t> src(n);
  ibv_mr* src_mr = ibv_reg_mr(dev.pd, src.data(), n * sizeof(uint64_t), kLocalWrite);
  if (!src_mr) Fail("ibv_reg_mr", errno);
  auto t2 = Clock::now();
  auto deadline = t2 + std::chrono::seconds(kPollSeconds);
  uint32_t posted = 0;
  uint32_t done = 0;
  while (done < n) {
    while (posted < n && posted - done < kWindow) {
      src[posted] = 0x5ca1e00000000000ull | posted;
      ibv_sge sge{reinterpret_cast<uintptr_t>(&src[posted]), sizeof(uint64_t), src_mr->lkey};
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = posted;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(mrs[posted]->addr);
      wr.wr.rdma.rkey = mrs[posted]->rkey;
      if (int e = ibv_post_send(a, &wr, &bad)) Fail("ibv_post_send", e);
      ++posted;
    }
    ibv_wc wc[kWindow];
    int got = ibv_poll_cq(cq, static_cast<int>(kWindow), wc);
    if (got < 0) Fail("ibv_poll_cq");
    for (int i = 0; i < got; ++i)
      if (wc[i].status != IBV_WC_SUCCESS) Fail(ibv_wc_status_str(wc[i].status));
    done += static_cast<uint32_t>(got);
    if (got == 0 && Clock::now() > deadline) Fail("timed out waiting for RDMA write completions");
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, base + size_t{i} * size, sizeof v);
    if (v != (0x5ca1e00000000000ull | i)) Fail("an RDMA write did not reach its MR");
  }
  auto t3 = Clock::now();

  for (ibv_mr* mr : mrs)
    if (int e = ibv_dereg_mr(mr)) Fail("ibv_dereg_mr", e);
  auto t4 = Clock::now();
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_dereg_mr(src_mr);
  ibv_destroy_cq(cq);
  munmap(mem, len);
  std::printf(
      "scale-mrs mrs=%u size=%zu ok=1 reg_ms=%.1f bytes_per_mr=%ld verify_ms=%.1f dereg_ms=%.1f\n",
      n, size, Ms(t0, t1), rss_delta / long{n}, Ms(t2, t3), Ms(t3, t4));
  return 0;
}

bool ParseCount(const char* s, unsigned long* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(s, &end, 10);
  if (!*s || *end || errno || v == 0 || v > (1ul << 24)) return false;
  *out = v;
  return true;
}

int Usage() {
  std::fprintf(stderr, "usage: softrdma-bench-scale qps [N] | mrs [N] [SIZE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  std::string mode = argv[1];
  unsigned long n = 0;
  unsigned long size = 4096;
  if (mode == "qps" && argc <= 3) {
    n = 1000;
    if (argc == 3 && !ParseCount(argv[2], &n)) return Usage();
    return RunQps(static_cast<uint32_t>(n));
  }
  if (mode == "mrs" && argc <= 4) {
    n = 10000;
    if (argc >= 3 && !ParseCount(argv[2], &n)) return Usage();
    if (argc == 4 && (!ParseCount(argv[3], &size) || size < sizeof(uint64_t))) return Usage();
    return RunMrs(static_cast<uint32_t>(n), size);
  }
  return Usage();
}
