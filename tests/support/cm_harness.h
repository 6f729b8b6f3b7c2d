// Shared harness of the librdmacm suites (tests/semantics/cm_*_test.cpp): bounded waits on event
// channels, free ports, a fixture that builds listeners and connected pairs through the public
// rdma_* API and destroys whatever a test left behind, and child processes for tests that need a
// peer in another process.
//
// Every wait is bounded: an event channel's fd is poll()ed with a timeout before
// rdma_get_cm_event is called, so a missing event fails the test instead of hanging it.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/host_identity.h"

namespace cmtest {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Upper bound for anything that must happen (generous: sanitizer builds on 2 cores).
inline constexpr milliseconds kWait{5000};
// How long we watch for an event that must NOT come.
inline constexpr milliseconds kQuiet{150};

inline int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

// ---- Addresses and ports ----------------------------------------------------------------------

// Ports unlikely to collide with other test processes sharing the run directory: a window of 37
// ports per pid. Callers that listen retry on EADDRINUSE anyway.
inline uint16_t NextPort() {
  static std::atomic<uint32_t> n{0};
  uint32_t base = (static_cast<uint32_t>(getpid()) * 37u + n++) % 30000u;
  return static_cast<uint16_t>(20000 + base);
}

inline sockaddr_storage Ip(const char* text, uint16_t port) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, text, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
  } else if (inet_pton(AF_INET6, text, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
  }
  return ss;
}

inline sockaddr* Sa(sockaddr_storage* ss) {
  return reinterpret_cast<sockaddr*>(ss);
}

// Whether something on this network answers a TCP connect to `dst` (accepts or refuses it) within
// `ms`: some sandboxes' gateways refuse every connect to any address, TEST-NET ones included. The
// CM then takes the address for a host's (a refusing host is there), so tests of an address that
// nobody answers for cannot run on such a network.
inline bool NetworkAnswersFor(const sockaddr_storage& dst, int ms) {
  const int fd = socket(dst.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t len =
      dst.ss_family == AF_INET ? sizeof(sockaddr_in) : static_cast<socklen_t>(sizeof(sockaddr_in6));
  bool answered = connect(fd, reinterpret_cast<const sockaddr*>(&dst), len) == 0;
  if (!answered && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, ms) == 1) {
      int err = 0;
      socklen_t el = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
      answered = err == 0 || err == ECONNREFUSED;
    }
  } else if (!answered) {
    answered = errno == ECONNREFUSED;
  }
  close(fd);
  return answered;
}

// Binds `id` to `ip`:<a free port> (ports are shared with every test process running at the same
// time: EADDRINUSE means try another). The port goes to *port; false with errno otherwise.
inline bool BindFreePort(rdma_cm_id* id, const char* ip, uint16_t* port) {
  for (int tries = 0; tries < 50; ++tries) {
    uint16_t p = NextPort();
    sockaddr_storage a = Ip(ip, p);
    if (rdma_bind_addr(id, Sa(&a)) == 0) {
      *port = p;
      return true;
    }
    if (errno != EADDRINUSE) return false;
  }
  return false;
}

inline uint16_t PortOf(const sockaddr* a) {
  if (a->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(a)->sin_port);
  if (a->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(a)->sin6_port);
  return 0;
}

inline std::string IpOf(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, buf, sizeof buf);
  } else if (a->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

// ---- Events -----------------------------------------------------------------------------------

inline bool Readable(int fd, milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    int r = ::poll(&p, 1, static_cast<int>(left > 0 ? left : 0));
    if (r < 0 && errno == EINTR) continue;
    return r == 1 && (p.revents & POLLIN);
  }
}

// A copy of an event, taken and acked (so tests never leak an unacked event).
struct Event {
  bool ok = false;  // false: nothing arrived in time
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
  rdma_cm_id* listen_id = nullptr;
  std::vector<uint8_t> data;  // private data as reported
  rdma_conn_param conn{};     // private_data pointers cleared
  rdma_ud_param ud{};
};

inline std::string Describe(const Event& e) {
  if (!e.ok) return "no event";
  return std::string(rdma_event_str(e.type)) + " status=" + std::to_string(e.status);
}

inline Event CopyEvent(const rdma_cm_event* ev) {
  Event e;
  e.ok = true;
  e.type = ev->event;
  e.status = ev->status;
  e.id = ev->id;
  e.listen_id = ev->listen_id;
  bool ud = ev->id && ev->id->qp_type == IBV_QPT_UD;
  const void* p = ud ? ev->param.ud.private_data : ev->param.conn.private_data;
  uint8_t len = ud ? ev->param.ud.private_data_len : ev->param.conn.private_data_len;
  if (p && len) {
    e.data.assign(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + len);
  }
  e.conn = ev->param.conn;
  e.conn.private_data = nullptr;
  e.ud = ev->param.ud;
  e.ud.private_data = nullptr;
  return e;
}

// The next event on `ch` within `timeout` (Event::ok false if none).
inline Event Take(rdma_event_channel* ch, milliseconds timeout = kWait) {
  if (!Readable(ch->fd, timeout)) return {};
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return {};
  Event e = CopyEvent(ev);
  rdma_ack_cm_event(ev);
  return e;
}

// The next event on `ch` is `type` (and arrives within `timeout`).
inline ::testing::AssertionResult Next(rdma_event_channel* ch, rdma_cm_event_type type,
                                       Event* out = nullptr, milliseconds timeout = kWait) {
  Event e = Take(ch, timeout);
  if (out) *out = e;
  if (!e.ok) {
    return ::testing::AssertionFailure()
           << "no event within " << timeout.count() << " ms; wanted " << rdma_event_str(type);
  }
  if (e.type != type) {
    return ::testing::AssertionFailure()
           << "got " << Describe(e) << "; wanted " << rdma_event_str(type);
  }
  return ::testing::AssertionSuccess();
}

// Nothing arrives on `ch` for `quiet`.
inline ::testing::AssertionResult Quiet(rdma_event_channel* ch, milliseconds quiet = kQuiet) {
  if (!Readable(ch->fd, quiet)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "unexpected " << Describe(Take(ch, milliseconds(0)));
}

// ---- QPs ----------------------------------------------------------------------------------------

inline ibv_qp_init_attr RcAttr() {
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 16;
  a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  return a;
}

inline ibv_qp_attr QueryQp(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  int mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
             IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER |
             IBV_QP_DEST_QPN | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN;
  if (ibv_query_qp(qp, &a, mask, &init) != 0) a.qp_state = IBV_QPS_UNKNOWN;
  return a;
}

// ---- Fixture ----------------------------------------------------------------------------------

// Owns every channel and id a test makes (ids adopted from CONNECT_REQUEST events too) and
// destroys them, QPs first, at the end of the test whatever path it took.
class CmTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (auto it = ids_.rbegin(); it != ids_.rend(); ++it) {
      if ((*it)->qp) rdma_destroy_qp(*it);
      rdma_destroy_id(*it);
    }
    ids_.clear();
    for (rdma_event_channel* c : channels_) rdma_destroy_event_channel(c);
    channels_.clear();
  }

  rdma_event_channel* Channel() {
    rdma_event_channel* c = rdma_create_event_channel();
    EXPECT_NE(c, nullptr) << strerror(errno);
    if (c) channels_.push_back(c);
    return c;
  }

  rdma_cm_id* NewId(rdma_event_channel* ch, rdma_port_space ps = RDMA_PS_TCP) {
    rdma_cm_id* id = nullptr;
    EXPECT_EQ(rdma_create_id(ch, &id, nullptr, ps), 0) << strerror(errno);
    if (id) ids_.push_back(id);
    return id;
  }

  // Takes ownership of an id the library made (a connection request's).
  rdma_cm_id* Adopt(rdma_cm_id* id) {
    if (id) ids_.push_back(id);
    return id;
  }

  // Destroys an id now (and forgets it).
  void Destroy(rdma_cm_id* id) {
    for (auto it = ids_.begin(); it != ids_.end(); ++it) {
      if (*it == id) {
        ids_.erase(it);
        break;
      }
    }
    if (id->qp) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }

  // A listener on `ip`:<a free port> in `ps`; the port goes to *port.
  rdma_cm_id* Listen(rdma_event_channel* ch, uint16_t* port, rdma_port_space ps = RDMA_PS_TCP,
                     const char* ip = "127.0.0.1", int backlog = 16) {
    rdma_cm_id* id = NewId(ch, ps);
    if (!id) return nullptr;
    if (!BindFreePort(id, ip, port)) {
      ADD_FAILURE() << "rdma_bind_addr: " << strerror(errno);
      return nullptr;
    }
    if (rdma_listen(id, backlog) != 0) {
      ADD_FAILURE() << "rdma_listen: " << strerror(errno);
      return nullptr;
    }
    return id;
  }

  // An id on `ch` with its address and route resolved towards `ip`:`port`.
  rdma_cm_id* Resolved(rdma_event_channel* ch, uint16_t port, rdma_port_space ps = RDMA_PS_TCP,
                       const char* ip = "127.0.0.1") {
    rdma_cm_id* id = NewId(ch, ps);
    if (!id) return nullptr;
    sockaddr_storage dst = Ip(ip, port);
    if (rdma_resolve_addr(id, nullptr, Sa(&dst), 2000) != 0) {
      ADD_FAILURE() << "rdma_resolve_addr: " << strerror(errno);
      return nullptr;
    }
    auto r = Next(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    if (!r) {
      ADD_FAILURE() << r.message();
      return nullptr;
    }
    if (rdma_resolve_route(id, 2000) != 0) {
      ADD_FAILURE() << "rdma_resolve_route: " << strerror(errno);
      return nullptr;
    }
    r = Next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    if (!r) {
      ADD_FAILURE() << r.message();
      return nullptr;
    }
    return id;
  }

  // A QP on `id` with the library's defaults (NULL pd, no CQs: it makes them).
  bool MakeQp(rdma_cm_id* id, ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr a = RcAttr();
    a.qp_type = type;
    if (rdma_create_qp(id, nullptr, &a) != 0) {
      ADD_FAILURE() << "rdma_create_qp: " << strerror(errno);
      return false;
    }
    return true;
  }

  // Connects `client` (resolved, with its QP) to the listener whose events come on `server_ch`;
  // waits for the request, makes the server's QP, accepts, and waits for both ESTABLISHED.
  // Returns the server-side id (nullptr on failure, the test failed).
  rdma_cm_id* Establish(rdma_cm_id* client, rdma_event_channel* server_ch,
                        const rdma_conn_param* cparam = nullptr,
                        const rdma_conn_param* aparam = nullptr) {
    rdma_conn_param def{};
    def.responder_resources = 1;
    def.initiator_depth = 1;
    def.retry_count = 7;
    def.rnr_retry_count = 7;
    rdma_conn_param cp = cparam ? *cparam : def;
    if (rdma_connect(client, &cp) != 0) {
      ADD_FAILURE() << "rdma_connect: " << strerror(errno);
      return nullptr;
    }
    Event req;
    auto r = Next(server_ch, RDMA_CM_EVENT_CONNECT_REQUEST, &req);
    if (!r) {
      ADD_FAILURE() << r.message();
      return nullptr;
    }
    rdma_cm_id* server = Adopt(req.id);
    if (!MakeQp(server)) return nullptr;
    rdma_conn_param ap = aparam ? *aparam : def;
    if (rdma_accept(server, &ap) != 0) {
      ADD_FAILURE() << "rdma_accept: " << strerror(errno);
      return nullptr;
    }
    r = Next(client->channel, RDMA_CM_EVENT_ESTABLISHED);
    if (!r) {
      ADD_FAILURE() << "client: " << r.message();
      return nullptr;
    }
    r = Next(server_ch, RDMA_CM_EVENT_ESTABLISHED);
    if (!r) {
      ADD_FAILURE() << "server: " << r.message();
      return nullptr;
    }
    return server;
  }

  // A connected RC pair on fresh channels, with the library's default QPs: the listener's events
  // come on `sch`, the client's on `cch`.
  struct Connection {
    rdma_event_channel* sch = nullptr;
    rdma_event_channel* cch = nullptr;
    rdma_cm_id* client = nullptr;
    rdma_cm_id* server = nullptr;
  };
  bool Connect(Connection* c) {
    c->sch = Channel();
    c->cch = Channel();
    uint16_t port = 0;
    if (!c->sch || !c->cch || !Listen(c->sch, &port)) return false;
    c->client = Resolved(c->cch, port);
    if (!c->client || !MakeQp(c->client)) return false;
    c->server = Establish(c->client, c->sch);
    return c->server != nullptr;
  }

  std::vector<rdma_event_channel*> channels_;
  std::vector<rdma_cm_id*> ids_;
};

inline std::string RunDir() {
  return softrdma::core::RunDirectory();
}

// The names of the files in `dir`, without the dot files.
inline std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* de = readdir(d))
    if (de->d_name[0] != '.') out.push_back(de->d_name);
  closedir(d);
  return out;
}

// A file a CM process publishes under <run dir>/cm: a port claim or its presence.
struct CmClaim {
  std::string name;
  long pid = -1, port = -1, listen = 0;
};
inline std::vector<CmClaim> CmClaims() {
  const std::string dir = RunDir() + "/cm";
  std::vector<CmClaim> out;
  for (const std::string& name : FilesIn(dir)) {
    std::ifstream in(dir + "/" + name);
    CmClaim c{name};
    std::string word;
    while (in >> word) {
      if (word == "pid") in >> c.pid;
      if (word == "port") in >> c.port;
      if (word == "listen") in >> c.listen;
    }
    out.push_back(c);
  }
  return out;
}

// The CM service port published for this process's listener on `port` (0 if none).
inline uint16_t ServicePortOf(uint16_t port) {
  for (const CmClaim& c : CmClaims())
    if (c.pid == getpid() && c.port == port && c.listen > 0) return static_cast<uint16_t>(c.listen);
  return 0;
}

// ---- Child processes ----------------------------------------------------------------------------

// A copy of this test binary run as a CM peer (fork + exec of /proc/self/exe), so the child starts
// with a fresh librdmacm and CM service whatever the parent did before. The child runs the role
// named in SOFTRDMA_CM_CHILD (see RunCmChildRole in cm_process_test.cpp) with its argument in
// SOFTRDMA_CM_CHILD_ARG, and talks to the parent through two pipes on fds kChildUp/kChildDown.
// It dies with the parent (PDEATHSIG) and after a watchdog period.
inline constexpr int kChildUp = 100;    // child writes
inline constexpr int kChildDown = 101;  // child reads

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(); }

  // `run_dir`, when given, is the child's SOFTRDMA_RUNDIR.
  bool Start(const std::string& role, const std::string& arg, const std::string& run_dir = "") {
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC) != 0) return false;
    if (pipe2(down, O_CLOEXEC) != 0) {
      close(up[0]);
      close(up[1]);
      return false;
    }
    fflush(nullptr);
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(up[1], kChildUp);  // dup2 clears CLOEXEC on the copy
      dup2(down[0], kChildDown);
      setenv("SOFTRDMA_CM_CHILD", role.c_str(), 1);
      setenv("SOFTRDMA_CM_CHILD_ARG", arg.c_str(), 1);
      if (!run_dir.empty()) setenv("SOFTRDMA_RUNDIR", run_dir.c_str(), 1);
      char self[] = "/proc/self/exe";
      char* argv[] = {self, nullptr};
      execv(self, argv);
      _exit(127);
    }
    close(up[1]);
    close(down[0]);
    from_ = up[0];
    to_ = down[1];
    return true;
  }

  // One byte from the child within `timeout` (-1 if none, or the child closed its end).
  int Recv(milliseconds timeout = kWait) {
    if (!Readable(from_, timeout)) return -1;
    uint8_t b;
    return ::read(from_, &b, 1) == 1 ? b : -1;
  }
  bool Send(uint8_t b) { return ::write(to_, &b, 1) == 1; }
  // Exactly `n` bytes within `timeout`.
  bool Read(void* p, size_t n, milliseconds timeout = kWait) {
    auto* c = static_cast<uint8_t*>(p);
    auto deadline = Clock::now() + timeout;
    while (n > 0) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || !Readable(from_, left)) return false;
      ssize_t r = ::read(from_, c, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    if (from_ >= 0) close(from_);
    if (to_ >= 0) close(to_);
    from_ = to_ = -1;
  }

  // The exit code of a child that exits by itself within `timeout`; -1 (and killed) otherwise.
  int Wait(milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    while (pid_ > 0) {
      int st;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      if ((r < 0 && errno != EINTR) || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
    Kill();
    return -1;
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int from_ = -1, to_ = -1;
};

}  // namespace cmtest
