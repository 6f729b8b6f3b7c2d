// The connection manager of one process: communication ids, event channels, and the CM service
// that exchanges connection messages with other processes' CM services.
//
// One lock (Cm::mu) guards every id, channel and channel-to-peer; calls from the application
// and the service thread both take it. Blocking (synchronous ids, rdma_get_cm_event) waits on an
// event channel's queue, never under the lock. The state machine is in connection.cpp, the
// transport (sockets, service thread, timers) in service.cpp, QP setup in qp_setup.cpp.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cm/cm_wire.h"
#include "cm/registry.h"
#include "core/event_queue.h"

namespace softrdma::cm {

struct CmId;

struct CmEvent {
  rdma_cm_event pub;  // first: the application holds &pub
  uint8_t private_data[kMaxPrivateData];
  // The id whose destruction waits for this event's rdma_ack_cm_event: set when
  // rdma_get_cm_event hands the event out (its listener's, for a connection request).
  CmId* counted_on = nullptr;
};

struct EventChannel {
  rdma_event_channel pub;  // first
  core::EventQueue<CmEvent*> queue;
};

inline EventChannel* ToChannel(rdma_event_channel* c) {
  return reinterpret_cast<EventChannel*>(c);
}

enum class IdState {
  kIdle,
  kBound,
  kAddrResolved,
  kRouteResolved,
  kListening,
  kConnecting,       // REQ sent
  kConnectResponse,  // REP received by an id without a QP: rdma_establish sends the RTU
  kRequestReceived,  // passive: CONNECT_REQUEST reported
  kAcceptSent,       // passive: REP sent, RTU awaited
  kConnected,
  kDisconnectSent,  // DREQ sent, DREP awaited
  kDisconnected,
  kFailed,  // rejected, unreachable, or its channel was lost before connecting
};

// A TCP channel to another process's CM service.
// epoll tags of the CM service's fds other than peers' channels (tagged with their Peer's address,
// which user space keeps below 2^47).
constexpr uint64_t kListenTag = 1;
constexpr uint64_t kWakeTag = 2;
constexpr uint64_t kRendezvousTag = uint64_t{1} << 62;  // | the fd
constexpr uint64_t kProbeTag = uint64_t{1} << 61;       // | the fd
constexpr uint64_t kFdMask = 0xffffffffu;

struct Peer {
  int fd = -1;
  std::string key;  // "ip:port" of its service, or "" for accepted channels
  bool hello_seen = false;
  uint64_t hello_deadline_ns = 0;  // a channel that says nothing by then is closed
  std::vector<uint8_t> rx;
  std::vector<uint8_t> tx;  // what the socket did not take yet
  std::set<CmId*> ids;
  std::set<CmId*> probing;  // resolving: resolved by this peer's Hello (host_reach.cpp)
};

enum class TimerKind { kNone, kAddrError, kListenerWait, kConnect, kDisconnect, kTimewait };

struct McastMembership {
  Addr addr;
  ibv_gid mgid{};
  uint16_t mlid = 0;
  void* context = nullptr;
  bool attached = false;  // the id's QP receives the group's traffic
};

struct CmId {
  rdma_cm_id pub;  // first
  bool sync = false;
  IdState state = IdState::kIdle;
  Addr src, dst;  // ports included
  bool has_src = false, has_dst = false;
  PortClaim claim;
  int rendezvous_fd = -1;      // listener: its TCP port, for other hosts (host_reach.cpp)
  int probe_fd = -1;           // resolving an address of another host: the connect standing for ARP
  Peer* probe_peer = nullptr;  // ... once connected: the channel whose Hello resolves it
  uint32_t comm_id = 0, remote_comm_id = 0;
  Peer* peer = nullptr;

  // Listener.
  int backlog = 0;
  int pending = 0;  // connection requests not yet accepted or rejected
  CmId* listener = nullptr;
  std::set<CmId*> children;
  std::unique_ptr<ibv_qp_init_attr> ep_qp_init_attr;  // rdma_create_ep, passive side

  // This side's connection parameters.
  uint32_t psn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t retry_count = 7, rnr_retry_count = 7;  // applied to the QP
  uint32_t qkey = 0;
  // The peer's, from its REQ or REP.
  bool remote_known = false;
  uint32_t remote_qpn = 0, remote_psn = 0;
  uint8_t remote_gid[16] = {};
  uint16_t remote_lid = 0;
  uint8_t remote_responder_resources = 0, remote_initiator_depth = 0;

  // rdma_set_option.
  bool ack_timeout_set = false, reuse_addr = false;
  uint8_t tos = 0, ack_timeout = 0;
  int afonly = 0;
  ibv_ece local_ece{}, remote_ece{};

  std::unique_ptr<Req> pending_req;  // connecting: the REQ until its listener is found
  std::unique_ptr<Req> sent_req;     // connecting: the REQ sent, again if no listener had it yet
  uint64_t listener_deadline_ns = 0;

  TimerKind timer = TimerKind::kNone;
  uint64_t deadline_ns = 0;
  int timer_status = 0;

  std::vector<McastMembership> mcast;

  // Events rdma_get_cm_event handed out for this id, and how many of them were acked:
  // rdma_destroy_id waits until they are equal (rdma_destroy_id(3)), so an event the application
  // still reads never names a freed id. Reported is counted under the channel queue's lock.
  std::atomic<uint64_t> events_reported{0};
  uint64_t events_acked = 0;  // under Cm::mu

  // What this id owns besides itself.
  bool owns_channel = false;
  ibv_sa_path_rec path{};
};

inline CmId* ToId(rdma_cm_id* id) {
  return reinterpret_cast<CmId*>(id);
}

// Protocol timing. The REQ timeout bounds how long a connect waits for a peer that does not
// answer before RDMA_CM_EVENT_UNREACHABLE; DREQ's bounds DISCONNECTED without a DREP.
constexpr uint64_t kReqTimeoutMs = 4000;
constexpr uint64_t kDreqTimeoutMs = 1000;
// How long a new channel may stay silent before its Hello.
constexpr uint64_t kHelloTimeoutMs = 5000;
// How long a connect looks for a listener that is not there (yet) before UNREACHABLE.
constexpr uint64_t kListenerGraceMs = 1000;
constexpr uint64_t kListenerPollMs = 5;
// From DISCONNECTED to TIMEWAIT_EXIT (IB's time-wait is a few packet lifetimes: seconds).
constexpr uint64_t kTimewaitMs = 1000;

class Cm {
 public:
  static Cm& Get();
  static void AfterForkInChild();

  // --- ids and channels (connection.cpp) ---
  EventChannel* CreateChannel();
  int DestroyChannel(EventChannel* c);
  int CreateId(EventChannel* c, CmId** out, void* context, rdma_port_space ps, ibv_qp_type t);
  int DestroyId(CmId* id);
  int BindAddr(CmId* id, const sockaddr* addr);
  int ResolveAddr(CmId* id, const sockaddr* src, const sockaddr* dst, int timeout_ms);
  int ResolveRoute(CmId* id, int timeout_ms);
  int Listen(CmId* id, int backlog);
  int GetRequest(CmId* listen, CmId** out);
  int Connect(CmId* id, const rdma_conn_param* param);
  int Accept(CmId* id, const rdma_conn_param* param);
  int Reject(CmId* id, const void* data, uint8_t len, uint32_t reason);
  int Disconnect(CmId* id);
  int Establish(CmId* id);
  int Notify(CmId* id, ibv_event_type ev);
  int MigrateId(CmId* id, EventChannel* c);
  int SetOption(CmId* id, int level, int name, const void* val, size_t len);
  int GetEvent(EventChannel* c, rdma_cm_event** out);
  int AckEvent(rdma_cm_event* e);
  int SetLocalEce(CmId* id, const ibv_ece* ece);
  int JoinMulticast(CmId* id, const sockaddr* addr, uint16_t join_flags, void* context);
  int LeaveMulticast(CmId* id, const sockaddr* addr);
  int GetRemoteEce(CmId* id, ibv_ece* ece);

  // --- QPs (qp_setup.cpp) ---
  int CreateQp(CmId* id, ibv_qp_init_attr_ex* attr);
  void DestroyQp(CmId* id);
  int CreateSrq(CmId* id, ibv_srq_init_attr_ex* attr);
  void DestroySrq(CmId* id);
  int InitQpAttr(CmId* id, ibv_qp_attr* attr, int* mask);

  // The one device: its context, default PD and limits.
  ibv_context* Context();
  const ibv_device_attr& DeviceAttr() { return device_attr_; }

  std::mutex mu;

 private:
  std::condition_variable acked_;  // with mu: an id's events_acked grew
  friend class Service;
  Cm() = default;

  // connection.cpp
  void Report(CmId* id, rdma_cm_event_type type, int status, const std::vector<uint8_t>* data,
              CmId* listen = nullptr, CmEvent** made = nullptr);
  int CompleteSync(CmId* id, std::unique_lock<std::mutex>* lk);
  void AttachDevice(CmId* id);
  ibv_xrcd* XrcdLocked();
  int CreateXrcRecvQpLocked(CmId* id, ibv_qp_init_attr_ex* attr);
  void FillRoute(CmId* id);
  // The GID that names `local`, the address the peer reaches this side at, and its index: the GID
  // the peer sends to. GID 0 when the table has none for it (loopback, IPv6): GID 0's address may
  // be one the peer cannot reach (an interface listed first, SOFTRDMA_IP).
  const ibv_gid& GidFor(const Addr& local, uint8_t* index = nullptr) const;
  ConnEnd LocalEnd(CmId* id, const rdma_conn_param* param, uint32_t ece_vendor_id);
  void LearnPeer(CmId* id, uint32_t peer_comm_id, const ConnEnd& e);
  void OnMessage(Peer* p, const Message& m);
  void OnReq(Peer* p, const Message& m);
  void OnRep(CmId* id, const Message& m);
  void OnRtu(CmId* id);
  void OnRej(CmId* id, const Message& m);
  void OnDreq(CmId* id);
  void OnDrep(CmId* id);
  void OnPeerLost(Peer* p);
  void OnTimer(CmId* id);
  void ReportDisconnected(CmId* id);
  void DetachPeer(CmId* id);
  int FillQpAttr(CmId* id, ibv_qp_attr* attr, int* mask);
  int ModifyToRtrRts(CmId* id);
  void ModifyToError(CmId* id);
  CmId* FindListenerFor(const Req& r);
  void SendRequest(CmId* id, std::unique_lock<std::mutex>* lk);

  // service.cpp
  bool StartService();
  // `lk` (may be null: the service thread) is released while a new channel connects.
  Peer* PeerFor(const ServiceAddr& s, std::unique_lock<std::mutex>* lk);
  Peer* AddPeer(int fd, std::string key);
  // A connected channel to the service at `key` ("ip:port"): the one already known (`fd` is then
  // closed), or a new one on `fd`.
  Peer* AdoptChannel(int fd, const std::string& key);
  void WatchOutput(Peer* p, bool want);
  void Send(Peer* p, const std::vector<uint8_t>& msg);
  void ClosePeer(Peer* p);
  void Arm(CmId* id, TimerKind kind, uint64_t ms, int status);
  void Disarm(CmId* id);
  void Wake();
  void Run();
  void OnReadable(Peer* p);
  void OnWritable(Peer* p);
  void AcceptChannels();

  // host_reach.cpp
  void OpenRendezvous(CmId* id);
  void CloseRendezvous(CmId* id);
  void AcceptRendezvous(int fd);
  // Where a listener the run directory does not show is reached: its address and port.
  std::optional<ServiceAddr> RendezvousOf(const Addr& dst);
  void StartProbe(CmId* id);
  void CancelProbe(CmId* id);
  void OnProbeDone(int fd);
  void SettleProbes(Peer* p);
  void ProbeAnswered(CmId* id);

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_xrcd* xrcd_ = nullptr;  // made on first use: the domain of XRC ids given none (as rdma-core)
  ibv_device_attr device_attr_{};
  PortClaim presence_;  // makes this namespace's addresses known to connecting processes
  // The device's GID table, one per address here (GID 0 first); all zero before the device opens.
  std::vector<ibv_gid> gids_ = std::vector<ibv_gid>(1);
  uint16_t lid_ = 0;

  std::map<uint32_t, CmId*> ids_;  // by comm id
  uint32_t next_comm_id_ = 0;
  std::map<std::pair<uint16_t, uint16_t>, std::set<CmId*>> listeners_;  // (ps, port)
  std::map<std::string, Peer*> peers_by_key_;
  // Closed peers, freed by the service thread between batches. A member, not a global: the Cm is
  // never destroyed, while a global's destructor ran at exit under the running service thread
  // (ThreadSanitizer: heap-use-after-free in Run).
  std::vector<Peer*> graveyard_;
  std::set<Peer*> peers_;
  std::set<CmId*> timed_;

  std::map<int, CmId*> rendezvous_;  // by fd
  std::map<int, CmId*> probes_;      // by fd

  int listen_fd_ = -1;
  uint16_t service_port_ = 0;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  bool started_ = false;
  std::thread thread_;
};

uint64_t NowNs();

// Makes an event visible on its channel (its listener's for a connection request). Cm::Report
// does it at once, except for an event it hands back through `made`: the caller fills in the rest
// and then queues it, so the application never reads an event still being written.
void QueueEvent(CmEvent* e);

}  // namespace softrdma::cm
