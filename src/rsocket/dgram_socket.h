// SOCK_DGRAM rsockets: datagrams over one UD QP.
//
// Each datagram carries a small header naming the sender's address, so rrecvfrom can report it.
// A destination address becomes (address handle, QPN, Q_Key) once: either by asking the peer's
// CM (RDMA_PS_UDP: resolve address and route, then a SIDR request that the bound peer socket
// answers with its QPN), or by learning it from a datagram that came from there (the reply path
// needs no CM exchange). Every bound socket listens on its address; a process-wide thread answers
// the SIDR requests that arrive there.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "rsocket/armed_cq.h"
#include "rsocket/socket.h"

namespace softrdma::rsocket {

class DgramSocket : public Socket {
 public:
  explicit DgramSocket(int family);
  ~DgramSocket() override;

  int Bind(const sockaddr* addr, socklen_t len) override;
  int Connect(const sockaddr* addr, socklen_t len) override;
  ssize_t Recv(const iovec* iov, int iovcnt, int flags, sockaddr* from,
               socklen_t* fromlen) override;
  ssize_t Send(const iovec* iov, int iovcnt, int flags, const sockaddr* to,
               socklen_t tolen) override;
  int Shutdown(int how) override;
  void Close() override;
  int GetSockName(sockaddr* addr, socklen_t* len) override;
  int GetPeerName(sockaddr* addr, socklen_t* len) override;
  short Readiness(short events) override;
  bool Arm(std::vector<pollfd>* fds) override;

 protected:
  bool AddressFixedLocked() const override { return bound_; }

 private:
  struct Dest {
    ibv_ah* ah = nullptr;
    uint32_t qpn = 0;
    uint32_t qkey = 0;
    sockaddr_storage local{};  // our address as this destination sees it
  };
  struct Arrival {
    uint32_t slot;
    uint32_t len;  // payload bytes after our header
    sockaddr_storage from;
  };

  int BindLocked(const sockaddr* addr);
  int SetupVerbs();
  int PostRecv(uint32_t slot);
  int Resolve(const sockaddr* dst, Dest* out);
  Dest* FindDest(const sockaddr* dst, int* err);
  void Progress();
  void DrainCq();
  void OnCompletion(const ibv_wc& w);
  bool ArmLocked(std::vector<pollfd>* fds);
  void Wait(std::unique_lock<std::mutex>& lk, int timeout_ms);

  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;  // bound and listening: answers SIDR requests
  bool bound_ = false;
  ibv_context** devices_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ArmedCq cq_;
  ibv_qp* qp_ = nullptr;
  uint64_t events_seen_ = 0;

  uint8_t* rbuf_ = nullptr;  // rq_depth_ slots of slot_size_
  ibv_mr* rmr_ = nullptr;
  uint8_t* sbuf_ = nullptr;  // sq_depth_ slots of slot_size_
  ibv_mr* smr_ = nullptr;
  uint32_t slot_size_ = 0;
  uint32_t rq_depth_ = 0;
  uint32_t sq_depth_ = 0;
  uint64_t sq_head_ = 0;  // sends posted
  uint64_t sq_tail_ = 0;  // sends completed
  std::deque<Arrival> arrivals_;

  std::map<std::string, Dest> dests_;
  bool connected_ = false;
  sockaddr_storage peer_{};
  bool shut_rd_ = false;
  bool shut_wr_ = false;
};

}  // namespace softrdma::rsocket
