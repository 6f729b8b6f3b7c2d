// SOCK_STREAM rsockets: a byte stream over one RC QP set up by the rdma_cm (RDMA_PS_TCP).
//
// Data path (both directions alike): each side owns a receive ring (rbuf) that the peer writes
// into with RDMA WRITE WITH IMMEDIATE; the immediate says what arrived (data length, a control
// message slot, end of stream). Receive WRs carry no buffer; each inbound immediate consumes one.
// The sender stages data in its send ring (sbuf) or sends it inline, and respects two credits
// the receiver hands back in control messages: ring bytes the application consumed and receive
// WRs reposted (both cumulative). Control messages (credits, iomap announcements) are 32-byte
// inline writes into a slot array next to the peer's rbuf. See docs/rsocket.md.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "rsocket/armed_cq.h"
#include "rsocket/socket.h"

namespace softrdma::rsocket {

// What each side tells the other in the connect / accept private data.
struct ConnInfo {
  uint32_t magic;
  uint32_t version;
  uint64_t rbuf_addr;
  uint64_t slots_addr;
  uint32_t rkey;
  uint32_t rbuf_size;
  uint32_t nslots;
  uint32_t rq_depth;
};

// One control message as it lands in the peer's slot array.
struct CtrlMsg {
  uint32_t op;
  uint32_t rkey;
  uint64_t a;
  uint64_t b;
  uint64_t c;
};

class StreamSocket : public Socket, public std::enable_shared_from_this<StreamSocket> {
 public:
  explicit StreamSocket(int family);
  ~StreamSocket() override;

  // Creates the event channel and CM id; -errno on failure.
  int Init();

  int Bind(const sockaddr* addr, socklen_t len) override;
  int Listen(int backlog) override;
  int Accept(sockaddr* addr, socklen_t* len) override;
  int Connect(const sockaddr* addr, socklen_t len) override;
  ssize_t Recv(const iovec* iov, int iovcnt, int flags, sockaddr* from,
               socklen_t* fromlen) override;
  ssize_t Send(const iovec* iov, int iovcnt, int flags, const sockaddr* to,
               socklen_t tolen) override;
  int Shutdown(int how) override;
  void Close() override;
  int GetSockName(sockaddr* addr, socklen_t* len) override;
  int GetPeerName(sockaddr* addr, socklen_t* len) override;
  off_t IoMap(void* buf, size_t len, int prot, int flags, off_t offset) override;
  int IoUnmap(void* buf, size_t len) override;
  ssize_t IoWrite(const void* buf, size_t count, off_t offset, int flags) override;
  short Readiness(short events) override;
  bool Arm(std::vector<pollfd>* fds) override;

 protected:
  bool AddressFixedLocked() const override { return state_ != State::kIdle; }
  bool ConnectedLocked() const override { return state_ == State::kConnected; }

 private:
  enum class State {
    kIdle,
    kBound,
    kListening,
    kResolvingAddr,
    kResolvingRoute,
    kConnecting,
    kConnected,
    kFailed,
    kClosed,
  };
  struct Request {
    rdma_cm_id* id;
    ConnInfo peer;
    bool valid;
  };
  struct IoMapping {
    off_t offset;
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
    ibv_mr* mr;  // local mappings only
  };

  // Takes over a connection request (a CM id on the listener's channel) and accepts it.
  int AdoptRequest(const Request& req);
  int SetupVerbs();
  void TeardownVerbs();
  int StartConnect(const sockaddr* addr, socklen_t len);

  // Non-blocking progress: CM events, completion events, completions, credits, control queue.
  void Progress();
  void DrainCm();
  void HandleCmEvent(rdma_cm_event* e);
  void DrainCq();
  void HandleCompletion(const ibv_wc& wc);
  void FlushCtrl();
  void MaybeSendCredit();
  // Sleeps until the CQ or the CM channel has news or the deadline passes; lk is released.
  void Wait(std::unique_lock<std::mutex>& lk, int timeout_ms);
  bool ArmLocked(std::vector<pollfd>* fds);
  void Fail(int err);
  short ReadinessLocked(short events);

  int64_t WrCredit() const;
  uint64_t PeerRingFree() const;
  bool CanSendCtrl() const;
  int PostWrite(ibv_wr_opcode op, uint64_t wr_id, const void* local, uint32_t len, uint32_t lkey,
                bool inl, uint64_t raddr, uint32_t rkey, uint32_t imm);
  int SendCtrlNow(const CtrlMsg& m);
  // Posts up to len bytes (one chunk) gathered from the iovecs after skip bytes: into the peer's
  // ring (to_ring) or to raddr/rkey (an iomap write). Returns bytes sent,
  // 0 if nothing can be sent now, -errno on a post failure.
  ssize_t SendChunk(const iovec* iov, int iovcnt, size_t skip, size_t len, bool to_ring,
                    uint64_t raddr, uint32_t rkey);
  bool CanSendData() const;
  int ConnError() const;
  ConnInfo MyConnInfo() const;
  static rdma_conn_param ConnParam(const ConnInfo* mine);
  void WaitSendsDone(std::unique_lock<std::mutex>& lk, int timeout_ms);

  State state_ = State::kIdle;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ArmedCq cq_;
  ibv_qp* qp_ = nullptr;
  std::chrono::steady_clock::time_point last_cm_check_{};
  uint64_t events_seen_ = 0;  // completions and CM events handled; a change means progress

  // Receive side.
  uint8_t* rbuf_ = nullptr;  // rbuf_size_ bytes then nslots_ control slots, one MR
  ibv_mr* rmr_ = nullptr;
  uint32_t rbuf_size_ = 0;
  uint32_t nslots_ = 0;
  uint32_t rq_depth_ = 0;
  uint64_t rx_total_ = 0;  // bytes the peer wrote into rbuf
  uint64_t consumed_ = 0;  // bytes the application took
  uint64_t reposted_ = 0;  // receive WRs reposted
  uint64_t credited_bytes_ = 0;
  uint64_t credited_wrs_ = 0;
  bool fin_rx_ = false;     // the peer will send no more
  bool peer_gone_ = false;  // DISCONNECTED seen
  bool shut_rd_ = false;

  // Send side.
  uint8_t* sbuf_ = nullptr;
  ibv_mr* smr_ = nullptr;
  uint32_t sbuf_size_ = 0;
  uint64_t sbuf_head_ = 0;  // bytes staged
  uint64_t sbuf_tail_ = 0;  // bytes whose write completed
  uint64_t tx_bytes_ = 0;   // bytes written into the peer's rbuf
  uint64_t peer_consumed_ = 0;
  uint64_t peer_reposted_ = 0;
  uint64_t imm_sent_ = 0;  // messages that consumed a peer receive WR
  uint32_t sq_depth_ = 0;
  uint32_t sq_out_ = 0;
  uint32_t ctrl_seq_ = 0;
  uint32_t max_inline_ = 0;
  std::deque<CtrlMsg> ctrl_queue_;
  bool shut_wr_ = false;
  bool fin_sent_ = false;
  int err_ = 0;  // the connection failed (ECONNRESET, ECONNREFUSED, ...)
  ConnInfo peer_{};

  std::deque<Request> requests_;  // listener: requests not yet accepted
  std::vector<IoMapping> local_maps_;
  std::vector<IoMapping> remote_maps_;
  off_t next_iomap_offset_ = 0;
};

}  // namespace softrdma::rsocket
