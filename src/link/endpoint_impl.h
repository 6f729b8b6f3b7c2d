// The endpoint's insides, shared by the channel kinds it serves (TCP in endpoint.cpp, shared memory
// in shm_channel.cpp). Not part of the link interface: nothing outside src/link includes it.
#pragma once

#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "link/endpoint.h"
#include "link/fast_mutex.h"
#include "link/lease_pause.h"
#include "link/plain_syscall.h"
#include "link/shm_ring.h"
#include "link/udp_link.h"

namespace softrdma::link {

class Pollable {
 public:
  virtual ~Pollable() = default;
  virtual void OnEvents(uint32_t events) = 0;
  // The TCP connection behind this, if it is one.
  virtual class ServedChannel* socket_channel() { return nullptr; }
};

// A connection the endpoint serves: TCP or shared memory.
class ServedChannel : public Channel, public Pollable {
 public:
  // Frames queued and not yet handed to the socket or ring.
  virtual bool TxPending() = 0;
  // Copies what queued frames borrow from application memory.
  virtual void OwnQueuedPayloads() = 0;
  // Handles inbound frames already at hand (progress mutex held).
  virtual void ServeBuffered() = 0;
  // Tears the channel down (progress mutex held).
  virtual void Close() = 0;
  // Reads and handles what arrived, without epoll (progress mutex held); the frames handled.
  virtual int ReadNow() { return 0; }
  // Leaves the sockets' epoll set while a leased poller reads it as the hot socket, or comes back
  // (progress mutex held). Leaving may be refused; coming back fails only when epoll does.
  virtual bool LeaveSet() { return false; }
  virtual bool ReturnToSet() { return true; }
};

class ShmChannel;

struct Endpoint::Impl {
  Impl(FrameSink& s, const NodeId& id) : sink(s), self(id) {}
  FrameSink& sink;
  NodeId self;
  uint16_t port = 0;
  // Every socket lives in `epfd` (but the hot socket while a lease lasts). The progress thread
  // sleeps on `outer_fd`, which holds `epfd` itself and the wake eventfd: an application thread
  // polling an empty CQ disarms `epfd` there for the length of its poll (takes it out, for the
  // socket lease), so frames it is about to handle do not also wake (and preempt) the progress
  // thread. Re-arming is level-triggered: whatever it left behind wakes the thread.
  int epfd = -1, outer_fd = -1, listen_fd = -1, wake_fd = -1, timer_fd = -1;
  Pollable* timer_pollable = nullptr;
  int64_t armed_deadline = INT64_MAX;  // what timer_fd is set to (progress_mu)
  void RunTimers(int64_t now_ns);
  std::mutex claim_mu;  // guards claims and the arming of epfd in outer_fd
  int claims = 0;
  void Claim();
  void Release();
  // Arms or disarms `epfd` in `outer_fd` (claim_mu held): whether socket events wake the thread.
  // `detach` (the socket lease) takes it out of `outer_fd` instead of disarming it there.
  void ArmSocketsLocked(bool armed, bool detach = false);
  bool sockets_detached = false;  // claim_mu
  // Set when `epfd` could not go back into `outer_fd`: the progress thread then looks at the
  // sockets every kUnwatchedSocketsNs and tries again (written under claim_mu).
  std::atomic<bool> sockets_unwatched{false};
  static constexpr int64_t kUnwatchedSocketsNs = 1'000'000;
  std::thread thread;
  std::atomic<bool> stop{false};

  std::mutex mu;  // guards outbound, shm_outbound, channels
  std::map<uint64_t, std::shared_ptr<ServedChannel>> outbound;  // TCP, by peer IP:port
  // Connections peers opened to us, by the IP:port their hello names (checked against the
  // socket's address): a path to that peer settles on one of them rather than opening its own.
  std::map<uint64_t, std::weak_ptr<ServedChannel>> accepted;
  std::shared_ptr<ServedChannel> AcceptedFromLocked(uint64_t key);  // open, or nullptr
  std::map<uint16_t, std::shared_ptr<ServedChannel>> shm_outbound;  // by the peer's port
  std::set<std::shared_ptr<ServedChannel>> channels;
  std::vector<std::shared_ptr<ServedChannel>> graveyard;  // progress thread only
  // Channels with frames still in their buffer (they stopped on their frame budget, or a held
  // frame was resumed); served by the next Dispatch (under progress_mu, like every reader).
  // Any thread may add one.
  std::mutex rx_pending_mu;
  std::vector<std::shared_ptr<ServedChannel>> rx_pending;
  std::atomic<bool> rx_pending_any{false};  // set with rx_pending filled: Dispatch locks only then
  void RxPending(std::shared_ptr<ServedChannel> ch) {
    {
      std::lock_guard<std::mutex> g(rx_pending_mu);
      rx_pending.push_back(std::move(ch));
      rx_pending_any.store(true, std::memory_order_release);
    }
    Wake();
  }

  // Shared-memory channels, whose inbound rings are checked without a system call: by a busy
  // poller before it asks epoll, and by the progress thread before it sleeps.
  FastMutex shm_mu;  // polls copy `shm` under it when it changed (ShmRxReady)
  std::vector<std::shared_ptr<ShmChannel>> shm;
  std::atomic<int> shm_count{0};
  std::atomic<uint64_t> shm_generation{0};  // moves with every change of `shm`
  void DropShmSnapshot();                   // this thread's copy of `shm`, if of this endpoint
  int shm_listen_fd = -1;
  Pollable* shm_listen_pollable = nullptr;
  bool shm_enabled = false;
  void AcceptShm();
  void AddShm(const std::shared_ptr<ShmChannel>& ch);
  void RemoveShm(const ShmChannel* ch);
  bool ShmRxReady();
  // Asks every shm producer for a doorbell; false when one has data already (do not sleep).
  bool ShmPrepareSleep();
  void ShmAwake();
  int ServeShm();
  // Whether the calling thread is this endpoint's progress thread (Loop).
  bool OnProgressThread() const;
  // An application thread polled: the progress thread leaves the rings to pollers for
  // kShmPollLeaseNs after the last poll, and is parked (sleeping without a deadline) otherwise.
  static constexpr int64_t kShmPollLeaseNs = 200'000;
  // While the application keeps polling, each lease the progress thread finds renewed doubles the
  // next, up to this: it wakes (and preempts the poller) rarely. Producers ring a consumer that
  // stopped polling (kShmConsumerIdleNs), so only a record published just before the last poll
  // waits for the lease's end.
  static constexpr int64_t kShmPollLeaseMaxNs = 1'000'000;
  const int64_t shm_lease_min_ns = ShmTrustedPollNs(kShmPollLeaseNs);
  const int64_t shm_lease_max_ns = ShmTrustedPollNs(kShmPollLeaseMaxNs);
  int64_t shm_lease_ns = shm_lease_min_ns;  // progress thread only
  std::atomic<int64_t> shm_polled_ns{0};
  // When the peers were last told that we poll (see kShmConsumerIdleNs), at most once a step.
  static constexpr int64_t kShmSeenStepNs = 4'000;
  std::atomic<int64_t> shm_seen_told_ns{0};
  std::atomic<bool> parked{false};
  // Records that arrive while an application polls ring no doorbell: the progress thread looks at
  // the rings when the poller's lease runs out, and is asked now if it is parked already.
  void NoteShmPoll(int64_t now_ns);
  // The clock as an empty poll of a CQ reads it: once every kEmptyPollsPerClockRead polls (a read
  // cost as much as the rest of the poll, ~70 of ~200 cycles, and a message arriving during a poll
  // waits for the next); in between, the last reading. It only ever runs late, so a poll looks
  // older than it is: the progress thread may serve a ring sooner, a producer ring a doorbell.
  static constexpr uint32_t kEmptyPollsPerClockRead = 8;
  std::atomic<uint32_t> empty_polls{0};
  std::atomic<int64_t> poll_clock_ns{0};
  int64_t EmptyPollNowNs() {
    const uint32_t n = empty_polls.load(std::memory_order_relaxed);
    empty_polls.store(n + 1, std::memory_order_relaxed);  // racy between pollers: a count only
    if (n % kEmptyPollsPerClockRead != 0) return poll_clock_ns.load(std::memory_order_relaxed);
    const int64_t now = NowNs();
    poll_clock_ns.store(now, std::memory_order_relaxed);
    return now;
  }
  void PollerMaySleep();
  // Set by PollerMaySleep (an arm), cleared by a poll that finds work: meanwhile, polls renew no
  // lease and leave the producers ringing.
  std::atomic<bool> poller_may_sleep{false};
  void PollerActive() {
    if (poller_may_sleep.load(std::memory_order_relaxed))
      poller_may_sleep.store(false, std::memory_order_relaxed);
  }
  void CompletionsTaken();
  // Serves the rings on the calling thread (an application's, holding no lock of ours) when no
  // other thread does, else wakes the progress thread.
  void ServeHereOrWake();
  int WaitAlongside(int fd);
  // Under progress_mu: one round of inbound work as a blocked thread runs it (the hot socket, what
  // epoll reports, the timers); the events handled.
  int ServeRoundLocked();
  // One thread at a time waits so (the others read): every wake-up of `epfd` wakes it too.
  std::atomic<bool> alongside_taken{false};
  // A waiter that found the progress thread serving looks for its event this long before it
  // sleeps again (the serving takes microseconds; sleeping costs a wake-up).
  static constexpr int64_t kAlongsideSpinNs = 20'000;
  // Rounds of a wait after which it leaves `epfd` to the progress thread: a waiter whose event
  // does not come costs the busy endpoint's other work no more than these wake-ups (and spins).
  static constexpr int kAlongsideRoundsMax = 16;
  // Some peer publishes records awaited in memory (ShmRingConsumer::ProducerPrompts): polls keep
  // the rings' consumer_polling from then on.
  std::atomic<bool> shm_prompted{false};
  std::vector<std::shared_ptr<ShmChannel>> shm_ready;  // ServeShm's scratch (progress_mu)
  // A poller with shared-memory channels asks epoll about sockets at most this often.
  static constexpr int64_t kSocketPollIntervalNs = 20'000;
  std::atomic<int64_t> sockets_polled_ns{0};
  // The connection a leased poller reads without asking epoll (PollOnceLeased; progress_mu).
  static constexpr int kHotSocketPollsPerEpoll = 64;
  std::shared_ptr<ServedChannel> hot_socket;
  int hot_socket_polls = 0;
  // The hot socket is out of `epfd` (ServedChannel::LeaveSet): no epoll entry waits on it, so a
  // peer's delivery wakes nobody. The progress thread puts it back once the lease has ended.
  std::atomic<bool> hot_socket_out{false};
  // Under progress_mu: makes `next` the hot socket, or none; false when the old one could not
  // return to `epfd` (it stays the hot socket).
  bool ChangeHotSocket(ServedChannel* next);
  // Under progress_mu: reads the hot socket if it is out of `epfd`, where no epoll_wait finds it
  // (a blocking poll, a claimed one, the progress thread's fallback); the frames handled.
  int ReadHotSocketOut();
  // A leased poll that handled frames leaves the timers to the next empty poll (at most
  // kLeasedRoundsPerTimerPass rounds in a row): the application waits for what the frames
  // completed, and an empty poll has nothing better to do (progress_mu).
  static constexpr int kLeasedRoundsPerTimerPass = 8;
  int leased_rounds_without_timers = 0;

  // The socket lease: a poller (of a process without shared-memory channels) keeps `epfd` disarmed
  // beyond its poll, as a claim that the progress thread ends when no poll came for
  // socket_lease_ns (200 us, doubling up to 1 ms while renewed) or that the poller ends when it
  // arms a CQ. Meanwhile a poll is one epoll_wait, and frames wake no thread: claiming and
  // releasing around each poll cost two more system calls, and a frame arriving between them woke
  // the real-time progress thread, which preempted one of the busy processes (TCP ib_write_lat:
  // a context switch per round trip).
  static constexpr int64_t kSocketLeaseNs = 200'000;
  static constexpr int64_t kSocketLeaseMaxNs = 1'000'000;
  // A lease that ran out with frames waiting means the application waits for them elsewhere
  // (spinning on memory for an RDMA WRITE, as riostream does): leases are then not taken for a
  // while (LeasePause), and the progress thread serves sockets at once as before.
  LeasePause socket_lease_pause;                  // progress thread only
  std::atomic<int64_t> socket_lease_taken_ns{0};  // written under claim_mu
  const int64_t socket_lease_min_ns = ShmTrustedPollNs(kSocketLeaseNs);
  const int64_t socket_lease_max_ns = ShmTrustedPollNs(kSocketLeaseMaxNs);
  std::atomic<bool> socket_lease{false};          // written under claim_mu
  int64_t socket_lease_ns = socket_lease_min_ns;  // progress thread only
  std::atomic<int64_t> socket_lease_off_until_ns{0};
  // Takes the lease when it may; false when the poll must claim and release by itself.
  bool HoldSocketLease(int64_t now_ns);
  // Ends the lease; true if there was one.
  bool EndSocketLease();

  std::unique_ptr<UdpLink> udp;

  std::mutex loop_mu;  // guards loop_frames
  std::deque<OutFrame> loop_frames;
  std::atomic<size_t> loop_frames_pending{0};  // a lock-free hint of loop_frames.size()
  std::shared_ptr<Channel> loopback;

  // Whoever holds progress_mu handles inbound work: the progress thread after epoll wakes it, or
  // an application thread that polls an empty CQ (so busy-polling never waits for a wake-up).
  FastMutex progress_mu;
  Pollable* wake_pollable = nullptr;
  // Never freed (the loop may race exit), but held here so that LeakSanitizer sees them reachable:
  // referenced only from epoll, they were reported as leaks (frame_decoder_fuzz, ASan test runs).
  Pollable* listen_pollable = nullptr;
  Pollable* udp_pollable = nullptr;
  void Loop();
  int Dispatch(epoll_event* events, int n);
  bool PollOnce(bool wait);
  bool PollOnceClaimed();
  bool PollOnceLeased();
  void AcceptAll();
  int DrainLoopback();
  void Retire(const std::shared_ptr<ServedChannel>& ch);
  void Wake() {
    uint64_t one = 1;
    ssize_t r = sys::Write(wake_fd, &one, sizeof one);
    (void)r;
  }
};

bool RegisterPollable(int epfd, int fd, Pollable* p, uint32_t events);

}  // namespace softrdma::link
