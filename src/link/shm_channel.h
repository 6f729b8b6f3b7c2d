// The same-host link: a channel between two processes of one user in one network namespace,
// carried by two shared-memory rings (one per direction) instead of a socket. A Unix socket in the
// abstract namespace, named after the endpoint's TCP port, opens it: the connecting side creates
// the rings in a sealed memfd and passes it with two eventfds (each side's doorbell); the socket
// then stays open to carry more file descriptors and to tell each side when the other is gone.
// See docs/architecture.md, "Same-host link".
#pragma once

#include <memory>
#include <mutex>
#include <deque>

#include "link/endpoint_impl.h"
#include "link/rx_cursor.h"
#include "link/shared_windows.h"
#include "link/shm_ring.h"

namespace softrdma::link {

class ShmChannel final : public ServedChannel {
 public:
  // The abstract Unix listener of the endpoint on `port`; -1 when it cannot be made.
  static int Listen(uint16_t port);
  // Opens a channel to the endpoint on `port` of this network namespace, or nullptr when there is
  // none or it belongs to another user (the caller then uses TCP).
  static std::shared_ptr<ShmChannel> Connect(Endpoint::Impl& ep, uint16_t port);
  // Takes a connection accepted on the listener; the rings arrive on it.
  static std::shared_ptr<ShmChannel> Accept(Endpoint::Impl& ep, int fd);

  ShmChannel(Endpoint::Impl& ep, int sock);
  ~ShmChannel() override;

  void Send(OutFrame&& f) override;
  void SendPair(OutFrame&& first, OutFrame&& second) override;
  bool closed() const override { return closed_.load(std::memory_order_acquire); }
  bool is_loopback() const override { return false; }
  void Abort() override { dead_ = true; }
  PeerWindows* direct() override { return peer_windows_.load(std::memory_order_acquire); }
  void NudgeIfAsleep() override;
  bool PeerPolls() const override {
    return ready_.load(std::memory_order_acquire) && !closed() && tx_.ConsumerAwake() &&
           NowNs() - rang_ns_.load(std::memory_order_relaxed) > kShmConsumerIdleNs;
  }

  int fd() const { return sock_; }
  void OnEvents(uint32_t events) override;  // the Unix socket
  bool TxPending() override;
  bool AwaitRoom() override;
  void OwnQueuedPayloads() override;
  void ServeBuffered() override;
  void Close() override;

  // Lock-free: whether the inbound ring has records.
  bool RxReady() const {
    return ready_.load(std::memory_order_acquire) && !rx_.Empty() &&
           !head_held_.load(std::memory_order_acquire);
  }
  // A held head is no work: the consumer may sleep until Resume wakes it.
  bool PrepareSleep() {
    if (!ready_.load(std::memory_order_acquire)) return true;
    bool idle = rx_.PrepareSleep();
    return idle || head_held_.load(std::memory_order_acquire);
  }
  bool Hold() override;
  void Resume() override;
  void ResumeHere() override;
  void Awake() {
    if (ready_.load(std::memory_order_acquire)) rx_.Awake();
  }
  // An application thread of ours polled at `now_ns`: the peer need not ring for a while.
  void Seen(int64_t now_ns) {
    if (ready_.load(std::memory_order_acquire)) rx_.Seen(now_ns);
  }
  // An application thread of ours polls / took completions and may look elsewhere
  // (ShmRingConsumer::Polling, Leaving: true when records came meanwhile).
  void Polling() {
    if (ready_.load(std::memory_order_acquire) && rx_.ProducerPrompts()) rx_.Polling();
  }
  bool Leaving() {
    return ready_.load(std::memory_order_acquire) && rx_.ProducerPrompts() && rx_.Leaving();
  }
  // Rings for records the peer has left untaken since it was last seen polling
  // (ShmRingProducer::UnrungStalled). From our application's polls; skipped while a sender holds
  // the ring (the next poll asks again).
  void RingIfUnrungStalled(int64_t now_ns);

 private:
  struct TxItem {
    OutFrame frame;
    uint32_t done = 0;  // payload bytes already in the ring
    bool started = false;
  };
  class Doorbell final : public Pollable {
   public:
    explicit Doorbell(ShmChannel& ch) : ch_(ch) {}
    void OnEvents(uint32_t) override { ch_.OnDoorbell(); }

   private:
    ShmChannel& ch_;
  };

  enum class RefWrite { kWritten, kNoRoom, kInline };
  RefWrite WriteByReferenceLocked(TxItem& t);
  bool SendArenaLocked();
  bool ReadControl();
  void BrokeProtocol(const char* what);
  bool MapPeerArena(uint64_t need);
  bool DeliverRefs(const uint8_t* p, const ShmRecordHeader& h, uint32_t fixed, uint32_t* consumed);
  bool KeepFrame(uint32_t* consumed);
  bool MapRings(int memfd, bool connector);
  bool ReadSetup();
  void Started();
  void OnDoorbell();
  void Ring(int fd);
  void QueueLocked(OutFrame&& f);
  void FlushLocked();
  bool WriteLocked(TxItem& t);
  void PublishLocked();
  bool prompt_ = false;  // a record written since the last publish is awaited in memory (tx_mu_)
  bool prompts_noted_ = false;  // Endpoint::Impl::shm_prompted is set for ours (progress_mu)
  // An application thread took records from the ring since the last doorbell (progress_mu): a
  // doorbell then found empty came for records it took (kShmQuietNs).
  bool app_took_ = false;
  bool WriteHelloLocked();
  bool HandleRecord(const uint8_t* p, uint64_t avail, uint32_t* consumed);
  void EndFrame();

  Endpoint::Impl& ep_;
  int sock_;
  int doorbell_in_ = -1;   // ours: rung when our inbound ring has data or our outbound has room
  int doorbell_out_ = -1;  // the peer's
  std::atomic<int64_t> rang_ns_{0};  // when we last rang doorbell_out_ (PeerPolls)
  void* map_ = nullptr;
  size_t map_len_ = 0;
  Doorbell doorbell_{*this};
  std::atomic<bool> ready_{false};  // rings mapped
  std::atomic<bool> closed_{false};

  std::mutex tx_mu_;  // guards tx_ and txq_
  ShmRingProducer tx_;
  std::deque<TxItem> txq_;
  bool room_wanted_ = false;  // AwaitRoom said no room: tell the sink when there is
  // Under tx_mu_: more than kDatagramBacklogBytes wait for the peer (asks for the doorbell then).
  bool BackloggedLocked();
  // Under tx_mu_: true when a room waiter is to be told now (the caller tells, unlocked).
  bool RoomFreedLocked();
  bool hello_sent_ = false;
  bool arena_sent_ = false;  // our arena's descriptor went to the peer

  // Receive state: progress mutex.
  ShmRingConsumer rx_;
  bool hello_done_ = false;
  bool dead_ = false;
  bool peer_gone_ = false;
  bool in_frame_ = false;
  // The frame at the ring's head waits (Hold) and has not been resumed.
  std::atomic<bool> head_held_{false};
  RxTarget target_;
  RxCursor cursor_;
  uint64_t remaining_ = 0;
  std::atomic<PeerWindows*> peer_windows_{nullptr};  // set once, freed with the channel
  int peer_arena_fd_ = -1;                           // the peer's registered memory, read-only
  const uint8_t* peer_arena_ = nullptr;
  size_t peer_arena_len_ = 0;
};

}  // namespace softrdma::link
