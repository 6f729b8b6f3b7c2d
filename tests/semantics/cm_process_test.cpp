// librdmacm across processes: a peer in another process (this binary re-executed, see
// ChildProcess in cm_harness.h) is killed with SIGKILL, and its connections must learn it at once:
// DISCONNECTED on established connections, UNREACHABLE on a pending connect, and the dead
// listener's port no longer answers. Bound: kDeathBound (the CM channel's TCP close is immediate
// on one host; the bound leaves room for loaded CI machines).
#include <sys/stat.h>

#include <filesystem>

#include "support/cm_harness.h"
#include "support/scratch_directory.h"

namespace cmtest {
namespace {

constexpr milliseconds kDeathBound{2000};

// ---- the child side (no gtest in here: it reports through its pipe and exit code) ----

bool ChildWrite(const void* p, size_t n) {
  return ::write(kChildUp, p, n) == static_cast<ssize_t>(n);
}

// Blocks until the parent kills us (or closes its end / dies).
[[noreturn]] void ChildHold() {
  uint8_t b;
  while (::read(kChildDown, &b, 1) > 0) {
  }
  _exit(0);
}

ibv_qp_init_attr ChildQpAttr() {
  return RcAttr();
}

// "listen" / "listen-hold": listens on a free port, reports 'L' and the port (2 bytes, host
// order); "listen" accepts the first request and reports 'C' once established, "listen-hold"
// reports 'R' when the request arrived and never answers it.
int ChildListen(bool accept) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* listen = nullptr;
  if (!ch || rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP)) return 2;
  uint16_t port = 0;
  for (int tries = 0; tries < 50 && !port; ++tries) {
    uint16_t p = NextPort();
    sockaddr_storage a = Ip("127.0.0.1", p);
    if (rdma_bind_addr(listen, Sa(&a)) == 0) port = p;
  }
  if (!port || rdma_listen(listen, 4)) return 3;
  if (!ChildWrite("L", 1) || !ChildWrite(&port, 2)) return 4;
  Event req = Take(ch, milliseconds(10000));
  if (!req.ok || req.type != RDMA_CM_EVENT_CONNECT_REQUEST) return 5;
  if (!accept) {
    ChildWrite("R", 1);
    ChildHold();
  }
  ibv_qp_init_attr qa = ChildQpAttr();
  if (rdma_create_qp(req.id, nullptr, &qa)) return 6;
  if (rdma_accept(req.id, nullptr)) return 7;
  Event est = Take(ch, milliseconds(10000));
  if (!est.ok || est.type != RDMA_CM_EVENT_ESTABLISHED) return 8;
  ChildWrite("C", 1);
  ChildHold();
}

// Listens on 127.0.0.1:`port` (a free one when 0, reported in *port); nullptr on failure.
rdma_cm_id* ChildListenerOn(rdma_event_channel* ch, uint16_t* port) {
  rdma_cm_id* listen = nullptr;
  if (rdma_create_id(ch, &listen, nullptr, RDMA_PS_TCP)) return nullptr;
  for (int tries = 0; tries < 50; ++tries) {
    const uint16_t p = *port ? *port : NextPort();
    sockaddr_storage a = Ip("127.0.0.1", p);
    if (rdma_bind_addr(listen, Sa(&a)) == 0 && rdma_listen(listen, 4) == 0) {
      *port = p;
      return listen;
    }
    if (*port) break;
  }
  rdma_destroy_id(listen);
  return nullptr;
}

// Accepts the next request on `ch`; true once established.
bool ChildAcceptNext(rdma_event_channel* ch) {
  Event req = Take(ch, milliseconds(10000));
  if (!req.ok || req.type != RDMA_CM_EVENT_CONNECT_REQUEST) return false;
  ibv_qp_init_attr qa = ChildQpAttr();
  if (rdma_create_qp(req.id, nullptr, &qa) || rdma_accept(req.id, nullptr)) return false;
  Event est = Take(ch, milliseconds(10000));
  return est.ok && est.type == RDMA_CM_EVENT_ESTABLISHED;
}

// "relisten": as perftest -R's server, a listener for a first connection (reports 'L', the port,
// then 'C' once established) that is closed when it is made; on the parent's byte, a second
// listener on the same port 200 ms later (reports 'L'), whose connection it reports with 'D'.
int ChildRelisten() {
  rdma_event_channel* ch = rdma_create_event_channel();
  uint16_t port = 0;
  rdma_cm_id* first = ch ? ChildListenerOn(ch, &port) : nullptr;
  if (!first) return 2;
  if (!ChildWrite("L", 1) || !ChildWrite(&port, 2)) return 3;
  if (!ChildAcceptNext(ch)) return 4;
  if (rdma_destroy_id(first) || !ChildWrite("C", 1)) return 5;
  uint8_t b;
  if (::read(kChildDown, &b, 1) != 1) return 6;
  usleep(200 * 1000);
  if (!ChildListenerOn(ch, &port) || !ChildWrite("L", 1)) return 7;
  if (!ChildAcceptNext(ch)) return 8;
  ChildWrite("D", 1);
  ChildHold();
}

// "connect": connects to 127.0.0.1:<arg> and reports 'C' once established.
int ChildConnect(uint16_t port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 2;
  sockaddr_storage dst = Ip("127.0.0.1", port);
  if (rdma_resolve_addr(id, nullptr, Sa(&dst), 2000)) return 3;
  Event e = Take(ch);
  if (!e.ok || e.type != RDMA_CM_EVENT_ADDR_RESOLVED) return 4;
  if (rdma_resolve_route(id, 2000)) return 5;
  e = Take(ch);
  if (!e.ok || e.type != RDMA_CM_EVENT_ROUTE_RESOLVED) return 6;
  ibv_qp_init_attr qa = ChildQpAttr();
  if (rdma_create_qp(id, nullptr, &qa)) return 7;
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  cp.rnr_retry_count = 7;
  if (rdma_connect(id, &cp)) return 8;
  e = Take(ch, milliseconds(10000));
  if (!e.ok || e.type != RDMA_CM_EVENT_ESTABLISHED) return 9;
  ChildWrite("C", 1);
  ChildHold();
}

// An id bound to 127.0.0.1 on a free port: a port claim in the run directory, next to the CM's
// presence file and the process's slot. nullptr if none.
rdma_cm_id* BoundId() {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return nullptr;
  for (int tries = 0; tries < 50; ++tries) {
    sockaddr_storage a = Ip("127.0.0.1", NextPort());
    if (rdma_bind_addr(id, Sa(&a)) == 0) return id;
  }
  return nullptr;
}

// A UD QP of `ctx` in multicast group ff0e::<last> (a member file in <run dir>/mcast); nullptr if
// it could not join.
ibv_qp* MulticastMember(ibv_context* ctx, uint8_t last) {
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 4, nullptr, nullptr, 0) : nullptr;
  if (!cq) return nullptr;
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_UD;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ibv_gid mgid{};
  mgid.raw[0] = 0xff;
  mgid.raw[1] = 0x0e;
  mgid.raw[15] = last;
  return qp && ibv_attach_mcast(qp, &mgid, 0) == 0 ? qp : nullptr;
}

// On the parent's byte, leaves by exit() with everything still in place, as many programs do;
// `code` if the byte never comes.
int ExitOnParentsByte(int code) {
  uint8_t b;
  if (::read(kChildDown, &b, 1) != 1) return code;
  exit(0);
}

// "exit-holding": binds an id, reports 'B', exits on the parent's byte.
int ChildExitHolding() {
  if (!BoundId()) return 3;
  if (!ChildWrite("B", 1)) return 4;
  return ExitOnParentsByte(5);
}

// "mcast-exit": a UD QP joins a multicast group, reports 'M' and its QPN (4 bytes), exits on the
// parent's byte without detaching or destroying anything.
int ChildMcastExit() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = list && n > 0 ? ibv_open_device(list[0]) : nullptr;
  if (!ctx) return 2;
  ibv_qp* qp = MulticastMember(ctx, 0x42);
  if (!qp) return 5;
  const uint32_t qpn = qp->qp_num;
  if (!ChildWrite("M", 1) || !ChildWrite(&qpn, 4)) return 6;
  return ExitOnParentsByte(7);
}

// "hold-all": holds one of each file a process keeps in the run directory (its slot, the CM's
// presence, a port claim, a multicast membership), reports 'B', exits on the parent's byte.
int ChildHoldAll() {
  rdma_cm_id* id = BoundId();
  if (!id || !id->verbs) return 3;
  if (!MulticastMember(id->verbs, 0x43)) return 5;
  if (!ChildWrite("B", 1)) return 6;
  return ExitOnParentsByte(7);
}

int RunChildIfAsked() {
  const char* role = getenv("SOFTRDMA_CM_CHILD");
  if (!role) return 0;
  alarm(60);  // watchdog
  const char* arg = getenv("SOFTRDMA_CM_CHILD_ARG");
  int code = 1;
  std::string r = role;
  if (r == "listen") {
    code = ChildListen(true);
  } else if (r == "listen-hold") {
    code = ChildListen(false);
  } else if (r == "mcast-exit") {
    code = ChildMcastExit();
  } else if (r == "hold-all") {
    code = ChildHoldAll();
  } else if (r == "exit-holding") {
    code = ChildExitHolding();
  } else if (r == "relisten") {
    code = ChildRelisten();
  } else if (r == "connect") {
    code = ChildConnect(static_cast<uint16_t>(atoi(arg ? arg : "0")));
  }
  ChildWrite("X", 1);  // failed before its next report
  _exit(code);
}

// Runs before main() in every process of this binary; only a child has the role set.
[[maybe_unused]] const int kChildDispatch = RunChildIfAsked();

// ---- the tests ----

class CmProcess : public CmTest {
 protected:
  // Starts a listening child and returns its port (0 on failure).
  uint16_t StartListeningChild(const char* role) {
    if (!child_.Start(role, "")) return 0;
    uint8_t tag = 0;
    uint16_t port = 0;
    if (!child_.Read(&tag, 1) || tag != 'L' || !child_.Read(&port, 2)) return 0;
    return port;
  }

  ChildProcess child_;
};

TEST_F(CmProcess, KilledPassivePeerDisconnectsTheActiveSide) {
  uint16_t port = StartListeningChild("listen");
  ASSERT_NE(port, 0) << "child did not start listening";
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_EQ(child_.Recv(), 'C');
  EXPECT_EQ(QueryQp(client->qp).qp_state, IBV_QPS_RTS);

  child_.Kill();
  auto t0 = Clock::now();
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_DISCONNECTED, &e, kDeathBound));
  EXPECT_EQ(e.id, client);
  RecordProperty("disconnected_after_ms", std::to_string(MsSince(t0)));
  // The application's usual answer works and leaves the QP in error.
  EXPECT_EQ(rdma_disconnect(client), 0);
  EXPECT_EQ(QueryQp(client->qp).qp_state, IBV_QPS_ERR);
  EXPECT_TRUE(Quiet(cch));
}

TEST_F(CmProcess, KilledActivePeerDisconnectsThePassiveSide) {
  rdma_event_channel* sch = Channel();
  uint16_t port = 0;
  ASSERT_NE(Listen(sch, &port), nullptr);
  ASSERT_TRUE(child_.Start("connect", std::to_string(port)));
  Event req;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &req));
  rdma_cm_id* server = Adopt(req.id);
  ASSERT_TRUE(MakeQp(server));
  ASSERT_EQ(rdma_accept(server, nullptr), 0) << strerror(errno);
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_EQ(child_.Recv(), 'C');

  child_.Kill();
  auto t0 = Clock::now();
  Event e;
  ASSERT_TRUE(Next(sch, RDMA_CM_EVENT_DISCONNECTED, &e, kDeathBound));
  EXPECT_EQ(e.id, server);
  RecordProperty("disconnected_after_ms", std::to_string(MsSince(t0)));
  EXPECT_EQ(rdma_disconnect(server), 0);
  EXPECT_TRUE(Quiet(sch));
}

// The peer dies with our request unanswered: UNREACHABLE at once, not after the REQ timeout; and
// its port, no longer claimed by anyone, refuses the next connect.
TEST_F(CmProcess, KilledListenerFailsAPendingConnectAndFreesItsPort) {
  uint16_t port = StartListeningChild("listen-hold");
  ASSERT_NE(port, 0) << "child did not start listening";
  rdma_event_channel* cch = Channel();
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  ASSERT_EQ(child_.Recv(), 'R');

  child_.Kill();
  auto t0 = Clock::now();
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_UNREACHABLE, &e, kDeathBound));
  EXPECT_LT(MsSince(t0), kDeathBound.count());
  EXPECT_NE(e.status, 0);

  rdma_cm_id* again = Resolved(cch, port);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(MakeQp(again));
  ASSERT_EQ(rdma_connect(again, &cp), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_UNREACHABLE, &e, kDeathBound));
  EXPECT_EQ(e.status, -ECONNREFUSED);
}

// A connect that reaches the listener's process (here with a run directory of its own, as
// another host's) between two of its listeners waits for the second, as a connect that finds no
// listener at all: perftest -R's client connects for its data while the server moves from its
// handshake listener to the next (rdmacm_tools_hosts: UNREACHABLE, -ECONNREFUSED, in about 1 run
// of 3).
TEST_F(CmProcess, AConnectBetweenTwoListenersOfAnotherProcessWaitsForTheSecond) {
  support::ScratchDirectory scratch("relisten");
  ASSERT_FALSE(scratch.path().empty()) << strerror(errno);
  ASSERT_TRUE(child_.Start("relisten", "", scratch.path()));
  uint8_t tag = 0;
  uint16_t port = 0;
  ASSERT_TRUE(child_.Read(&tag, 1) && tag == 'L' && child_.Read(&port, 2));
  rdma_event_channel* cch = Channel();
  rdma_conn_param cp{};
  cp.responder_resources = cp.initiator_depth = 1;
  rdma_cm_id* first = Resolved(cch, port);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(MakeQp(first));
  ASSERT_EQ(rdma_connect(first, &cp), 0) << strerror(errno);
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_ESTABLISHED));
  ASSERT_EQ(child_.Recv(), 'C');

  ASSERT_TRUE(child_.Send('g'));
  rdma_cm_id* second = Resolved(cch, port);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(MakeQp(second));
  ASSERT_EQ(rdma_connect(second, &cp), 0) << strerror(errno);
  Event e;
  ASSERT_TRUE(Next(cch, RDMA_CM_EVENT_ESTABLISHED, &e, milliseconds(3000)));
  EXPECT_EQ(e.id, second);
  EXPECT_EQ(child_.Recv(), 'L');
  EXPECT_EQ(child_.Recv(), 'D');
}

// The files a process publishes in <run dir>/cm (its presence, its port claims).
std::vector<std::string> CmFilesOf(pid_t pid) {
  std::vector<std::string> out;
  for (const CmClaim& c : CmClaims())
    if (c.pid == pid) out.push_back(c.name);
  return out;
}

// A program that exits without destroying its ids (or, ever, the CM itself) leaves no file in
// the run directory: every rping run left its presence file in /dev/shm/softrdma/cm.
TEST_F(CmProcess, AProcessThatExitsLeavesNoFileInTheRunDirectory) {
  ASSERT_TRUE(child_.Start("exit-holding", ""));
  ASSERT_EQ(child_.Recv(), 'B') << "the child did not bind";
  const pid_t pid = child_.pid();
  EXPECT_FALSE(CmFilesOf(pid).empty()) << "no claim of the child's to watch";
  ASSERT_TRUE(child_.Send('x'));
  ASSERT_EQ(child_.Wait(kDeathBound), 0) << "the child did not exit by itself";
  std::string left;
  for (const std::string& f : CmFilesOf(pid)) left += " " + f;
  EXPECT_TRUE(left.empty()) << "left in the run directory:" << left;
}

// Nor does one whose QP is still in a multicast group at exit (the HCA is never destructed).
TEST_F(CmProcess, AProcessThatExitsInAMulticastGroupLeavesNoMemberFile) {
  ASSERT_TRUE(child_.Start("mcast-exit", ""));
  ASSERT_EQ(child_.Recv(), 'M') << "the child did not join";
  uint32_t qpn = 0;
  ASSERT_TRUE(child_.Read(&qpn, 4));
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "-%06x", qpn);
  const std::string dir = RunDir() + "/mcast";
  auto members = [&] {
    std::vector<std::string> out;
    for (const std::string& name : FilesIn(dir))
      if (name.size() > 7 && name.compare(name.size() - 7, 7, suffix) == 0) out.push_back(name);
    return out;
  };
  EXPECT_EQ(members().size(), 1u) << "no member file of the child's to watch";
  ASSERT_TRUE(child_.Send('x'));
  ASSERT_EQ(child_.Wait(kDeathBound), 0) << "the child did not exit by itself";
  EXPECT_TRUE(members().empty()) << "left in " << dir << ": " << members().front();
}

// Every entry under `dir` (recursively), directories and hidden files too.
std::vector<std::string> EverythingUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    out.push_back(it->path().string());
  return out;
}

// The files under `dir` (recursively), without the directories and hidden files.
std::vector<std::string> RunFilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : FilesIn(dir)) {
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) continue;
    if (!S_ISDIR(st.st_mode)) {
      out.push_back(path);
      continue;
    }
    for (const std::string& f : RunFilesUnder(path)) out.push_back(f);
  }
  return out;
}

// A process killed with SIGKILL runs no exit handler: its files stay until another process
// removes them. Once its surviving peer has exited too, none may be left (issue 4: "after both
// processes exit no shared-memory object is left"); the survivor used to leave the killed one's
// slot, CM presence and claim, and multicast membership until some later program started.
TEST_F(CmProcess, ProcessesLeaveNoFileOfAKilledPeerOnceTheyExit) {
  support::ScratchDirectory scratch("killed-peer");
  ASSERT_FALSE(scratch.path().empty()) << strerror(errno);
  const std::string& run_dir = scratch.path();
  ChildProcess survivor;
  ASSERT_TRUE(child_.Start("hold-all", "", run_dir));
  ASSERT_EQ(child_.Recv(), 'B') << "the child to kill did not set up";
  ASSERT_TRUE(survivor.Start("hold-all", "", run_dir));
  ASSERT_EQ(survivor.Recv(), 'B') << "the surviving child did not set up";
  const size_t held = RunFilesUnder(run_dir).size();
  EXPECT_GE(held, 8u) << "each child holds a slot, a presence, a claim and a membership";

  child_.Kill();
  ASSERT_TRUE(survivor.Send('x'));
  ASSERT_EQ(survivor.Wait(kDeathBound), 0) << "the survivor did not exit by itself";
  std::string left;
  for (const std::string& f : EverythingUnder(run_dir)) left += " " + f;
  EXPECT_TRUE(left.empty()) << "left:" << left;
}

// Nor the directories the run directory's files live in (cm/, mcast/) or the CM's lock: the last
// process to exit removes them (core/run_directory.h). They stayed in /dev/shm for good.
TEST_F(CmProcess, AProcessThatExitsLeavesNothingInTheRunDirectory) {
  support::ScratchDirectory scratch("exit-tidy");
  ASSERT_FALSE(scratch.path().empty()) << strerror(errno);
  const std::string& run_dir = scratch.path();
  ASSERT_TRUE(child_.Start("hold-all", "", run_dir));
  ASSERT_EQ(child_.Recv(), 'B') << "the child did not set up";
  EXPECT_GE(EverythingUnder(run_dir).size(), 6u) << "its slot, presence, claim and membership";
  ASSERT_TRUE(child_.Send('x'));
  ASSERT_EQ(child_.Wait(kDeathBound), 0) << "the child did not exit by itself";
  std::string left;
  for (const std::string& f : EverythingUnder(run_dir)) left += " " + f;
  EXPECT_TRUE(left.empty()) << "left:" << left;
}

}  // namespace
}  // namespace cmtest
