// ibv_get_cq_event's wait: the thread blocked in it serves the inbound work that wakes it (link::
// Endpoint::WaitAlongside), so that a peer's message and the event it raises cost one wake-up, not
// the progress thread's and then this thread's. The wait still ends for a signal only as the
// read() it replaces would, and uses no CPU while nothing comes.
#include <infiniband/verbs.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "link/endpoint.h"
#include "support/fresh_process.h"
#include "support/semantics_harness.h"
#include "support/thread_stopper.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

namespace {

using namespace semantics;
using std::chrono::milliseconds;

// ibv_get_cq_event on another thread; the test looks whether and how it returned. A call that
// never returns is left behind (detached) rather than hang the suite.
class EventWaiter {
 public:
  explicit EventWaiter(ibv_comp_channel* ch) : s_(std::make_shared<State>()) {
    thread_ = std::thread([s = s_, ch] {
      s->tid.store(pthread_self());
      s->started.store(true);
      void* ctx = nullptr;
      s->result = ibv_get_cq_event(ch, &s->cq, &ctx);
      s->error = errno;
      s->done.store(true);
    });
    while (!s_->started.load()) std::this_thread::sleep_for(milliseconds(1));
  }
  ~EventWaiter() {
    if (Returned(milliseconds(5000)))
      thread_.join();
    else
      thread_.detach();
  }
  // Whether the call returned within `timeout`.
  bool Returned(milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!s_->done.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(2));
    return s_->done.load();
  }
  pthread_t tid() const { return s_->tid.load(); }
  int result() const { return s_->result; }
  int error() const { return s_->error; }
  ibv_cq* cq() const { return s_->cq; }

 private:
  struct State {
    std::atomic<pthread_t> tid{};
    std::atomic<bool> started{false}, done{false};
    int result = 0, error = 0;
    ibv_cq* cq = nullptr;
  };
  std::shared_ptr<State> s_;
  std::thread thread_;
};

// The peer: sends a message when told ('g'), another when told again ('h'), and exits on 'x'.
int TwoMessages(ChildPipe p) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, 64)) return e;
  for (uint64_t id = 1; id <= 2; ++id) {
    char go;
    if (!p.Recv(&go)) return 14;
    if (PostSendMsg(c.q->qp, *c.b, 0, 8, id)) return 15;
    ibv_wc wc;
    if (!PollOne(c.q->scq, &wc) || wc.status != IBV_WC_SUCCESS) return 16;
  }
  char done;
  p.Recv(&done);
  return 0;
}

class EventWait : public VerbsTest {
 protected:
  // A QP on a CQ of `ch_`, connected to a forked TwoMessages peer, two receives posted, the first
  // message received (the shared-memory link is open and in use).
  void ConnectAndTakeTheFirstMessage() {
    ch_ = v.NewChannel();
    ASSERT_NE(ch_, nullptr);
    cq_ = v.NewCq(16, ch_);
    ASSERT_NE(cq_, nullptr);
    QpOpts o;
    o.send_cq = cq_;
    o.recv_cq = cq_;
    Qp* a = v.NewQp(o);
    Buffer* b = Buf(64);
    ASSERT_TRUE(a && b);
    ASSERT_NO_FATAL_FAILURE(StartAndConnect(
        v, peer_,
        [](int up, int down) {
          return TwoMessages(ChildPipe{up, down});
        },
        a, o));
    ASSERT_EQ(PostRecv(a->qp, *b, 0, 64, 1), 0);
    ASSERT_EQ(PostRecv(a->qp, *b, 0, 64, 2), 0);
    ASSERT_TRUE(peer_.Send('g'));
    ibv_wc wc;
    ASSERT_TRUE(PollOne(cq_, &wc));
    ASSERT_EQ(wc.wr_id, 1u);
  }
  // The second message's receive completion, and the peer's clean end.
  void ExpectTheSecondMessage() {
    ibv_wc wc;
    ASSERT_TRUE(PollOne(cq_, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 2u);
    EXPECT_TRUE(peer_.Send('x'));
    EXPECT_EQ(peer_.Wait(), 0);
  }

  ibv_comp_channel* ch_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ForkedPeer peer_;
};

// With the progress thread stopped, only the waiting thread can take the peer's message: it did
// not (it slept in read() until the progress thread raised the event), and this waited for good.
TEST_F(EventWait, TheWaitingThreadServesTheMessageThatEndsItsWait) {
  ASSERT_NO_FATAL_FAILURE(ConnectAndTakeTheFirstMessage());
  const pid_t progress = ProgressThread();
  ASSERT_NE(progress, 0) << "no thread named " << softrdma::link::kProgressThreadName;
  ThreadStopper stopper;
  if (std::string why = stopper.Stop(progress); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  EventWaiter waiter(ch_);
  std::this_thread::sleep_for(milliseconds(50));  // blocked by now
  ASSERT_TRUE(peer_.Send('h'));
  const bool returned = waiter.Returned(milliseconds(5000));
  stopper.Release();  // the progress thread ends a wait that did not end so
  EXPECT_TRUE(returned) << "the message waited for the progress thread";
  ASSERT_TRUE(waiter.Returned(milliseconds(5000)));
  ASSERT_EQ(waiter.result(), 0) << strerror(waiter.error());
  EXPECT_EQ(waiter.cq(), cq_);
  ibv_ack_cq_events(cq_, 1);
  ExpectTheSecondMessage();
}

// The peer of two QPs: a message on each when told ('w'), then one on the first when told ('a'),
// one on the second when told again ('b'); exits on 'x'.
int TwoQps(ChildPipe p) {
  Verbs v;
  if (!v.Open()) return 10;
  Qp* q1 = v.NewQp(QpOpts{});
  Qp* q2 = v.NewQp(QpOpts{});
  Buffer* b = v.NewBuffer(64);
  if (!q1 || !q2 || !b) return 11;
  Remote r1, r2;
  if (!p.Send(v.RemoteOf(q1)) || !p.Send(v.RemoteOf(q2)) || !p.Recv(&r1) || !p.Recv(&r2)) return 12;
  if (BringUp(q1->qp, QpOpts{}, r1) || BringUp(q2->qp, QpOpts{}, r2)) return 13;
  char go;
  if (!p.Recv(&go) || PostSendMsg(q1->qp, *b, 0, 8, 1) || PostSendMsg(q2->qp, *b, 0, 8, 2))
    return 14;
  if (!p.Recv(&go) || PostSendMsg(q1->qp, *b, 0, 8, 3)) return 15;
  if (!p.Recv(&go) || PostSendMsg(q2->qp, *b, 0, 8, 4)) return 16;
  p.Recv(&go);
  return 0;
}

// While the waiting thread serves alone (the progress thread stopped), a message completing on a
// CQ nobody waits for comes first, then one for the awaited CQ. A producer rings once per sleep its
// consumer declares: the thread that took the first doorbell declared no new sleep, so the second
// message rang nobody and waited for good (rping hung so within seconds; unless the progress
// thread, woken by that doorbell too, happened to run and declare it).
TEST_F(EventWait, AServedRoundLeavesTheProducersRinging) {
  ibv_comp_channel* ch = v.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* awaited = v.NewCq(16, ch);
  ibv_cq* other = v.NewCq(16);
  ASSERT_TRUE(awaited && other);
  QpOpts o1, o2;
  o1.recv_cq = other;
  o2.recv_cq = awaited;
  Qp* a1 = v.NewQp(o1);
  Qp* a2 = v.NewQp(o2);
  Buffer* b = Buf(64);
  ASSERT_TRUE(a1 && a2 && b);
  ForkedPeer peer;
  ASSERT_TRUE(peer.Start([](int up, int down) { return TwoQps(ChildPipe{up, down}); }));
  Remote r1, r2;
  ASSERT_TRUE(peer.Recv(&r1));
  ASSERT_TRUE(peer.Recv(&r2));
  ASSERT_TRUE(peer.Send(v.RemoteOf(a1)));
  ASSERT_TRUE(peer.Send(v.RemoteOf(a2)));
  ASSERT_EQ(BringUp(a1->qp, o1, r1), 0);
  ASSERT_EQ(BringUp(a2->qp, o2, r2), 0);
  // Receive buffers of 64 bytes are not published to the peer: its SENDs go as frames, records
  // in the ring that the consumer must be rung for.
  for (uint64_t id : {1, 2}) {
    ASSERT_EQ(PostRecv(a1->qp, *b, 0, 64, id), 0);
    ASSERT_EQ(PostRecv(a2->qp, *b, 0, 64, id), 0);
  }
  ASSERT_TRUE(peer.Send('w'));  // the shared-memory channel opens, before the thread stops
  ibv_wc wc;
  ASSERT_TRUE(PollOne(other, &wc));
  ASSERT_TRUE(PollOne(awaited, &wc));
  const pid_t progress = ProgressThread();
  ASSERT_NE(progress, 0) << "no thread named " << softrdma::link::kProgressThreadName;
  ASSERT_EQ(ibv_req_notify_cq(awaited, 0), 0);
  ThreadStopper stopper;
  if (std::string why = stopper.Stop(progress); !why.empty()) GTEST_SKIP() << why;
  EventWaiter waiter(ch);
  std::this_thread::sleep_for(milliseconds(50));  // blocked by now
  ASSERT_TRUE(peer.Send('a'));
  // Not polled for here: a poll would take the message itself.
  EXPECT_FALSE(waiter.Returned(milliseconds(50))) << "no completion of the awaited CQ was due";
  ASSERT_TRUE(peer.Send('b'));
  const bool returned = waiter.Returned(milliseconds(5000));
  stopper.Release();
  EXPECT_TRUE(returned) << "the second message rang nobody";
  ASSERT_TRUE(waiter.Returned(milliseconds(5000)));
  ASSERT_EQ(waiter.result(), 0) << strerror(waiter.error());
  ibv_ack_cq_events(awaited, 1);
  ASSERT_TRUE(PollOne(awaited, &wc));
  EXPECT_EQ(wc.wr_id, 2u);
  ASSERT_TRUE(PollOne(other, &wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_TRUE(peer.Send('x'));
  EXPECT_EQ(peer.Wait(), 0);
}

// The same, in a fresh process whose peer trusts the consumer's last look for 10 s instead of
// 20 us (and checks no record left untaken): a sleep the consumer declares is then the only
// doorbell, and the race with the message certain.
TEST(EventWaitFresh, AServedRoundLeavesTheProducersRinging) {
  if (kFreshRunsSkipped) GTEST_SKIP() << "see kFreshRunsSkipped";
  EXPECT_EQ(
      FailedFreshRuns(
          "EventWait.AServedRoundLeavesTheProducersRinging", 2, std::chrono::seconds(30),
          {"SOFTRDMA_SHM_TRUST_POLL_NS=10000000000", "SOFTRDMA_SHM_UNRUNG_CHECK_NS=10000000000"}),
      0);
}

// The peer of a ping-pong: sends message i, waits (busy) for the answer, n times.
int PingPong(ChildPipe p, int n) {
  ChildQp c;
  if (int e = c.Connect(p, QpOpts{}, 64)) return e;
  char go;
  if (!p.Recv(&go)) return 14;
  for (int i = 0; i < n; ++i) {
    if (PostRecv(c.q->qp, *c.b, 32, 8, 1000 + i)) return 15;
    if (PostSendMsg(c.q->qp, *c.b, 0, 8, i)) return 16;
    ibv_wc wc;
    if (!PollOne(c.q->scq, &wc) || wc.status != IBV_WC_SUCCESS) return 17;
    if (!PollOne(c.q->rcq, &wc) || wc.status != IBV_WC_SUCCESS) return 18;
  }
  p.Recv(&go);
  return 0;
}

// Waits, as an event-driven program does, for every message of a ping-pong: the plain case, end to
// end. The arm before each wait declares the consumer asleep, so this does not catch a served round
// that declares no sleep (AServedRoundLeavesTheProducersRinging's fresh run does).
TEST_F(EventWait, EveryMessageOfAPingPongEndsAWait) {
  constexpr int kMessages = 3000;
  ibv_comp_channel* ch = v.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* rcq = v.NewCq(16, ch);
  ibv_cq* scq = v.NewCq(16);
  ASSERT_TRUE(rcq && scq);
  QpOpts o;
  o.send_cq = scq;
  o.recv_cq = rcq;
  Qp* a = v.NewQp(o);
  Buffer* b = Buf(64);
  ASSERT_TRUE(a && b);
  ForkedPeer peer;
  ASSERT_NO_FATAL_FAILURE(StartAndConnect(
      v, peer,
      [](int up, int down) {
        return PingPong(ChildPipe{up, down}, kMessages);
      },
      a, o));
  ASSERT_EQ(PostRecv(a->qp, *b, 0, 8, 0), 0);
  ASSERT_TRUE(peer.Send('g'));
  auto state = std::make_shared<std::atomic<int>>(0);  // messages answered; -1: a verb failed
  std::thread loop([state, a, b, ch, rcq, scq] {
    for (int i = 0; i < kMessages; ++i) {
      ibv_wc wc;
      int got = ibv_poll_cq(rcq, 1, &wc);
      while (got == 0) {
        void* ctx;
        ibv_cq* cq;
        if (ibv_req_notify_cq(rcq, 0) != 0) return state->store(-1);
        if ((got = ibv_poll_cq(rcq, 1, &wc)) != 0) break;
        if (ibv_get_cq_event(ch, &cq, &ctx) != 0) return state->store(-1);
        ibv_ack_cq_events(cq, 1);
        got = ibv_poll_cq(rcq, 1, &wc);
      }
      if (got < 0 || wc.status != IBV_WC_SUCCESS) return state->store(-1);
      if (PostRecv(a->qp, *b, 0, 8, i + 1) || PostSendMsg(a->qp, *b, 8, 8, i))
        return state->store(-1);
      if (!PollOne(scq, &wc) || wc.status != IBV_WC_SUCCESS) return state->store(-1);
      state->store(i + 1);
    }
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (state->load() >= 0 && state->load() < kMessages &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  const int answered = state->load();
  if (answered == kMessages || answered < 0) {
    loop.join();
  } else {
    peer.Kill();
    loop.detach();  // stuck in ibv_get_cq_event for good
  }
  ASSERT_EQ(answered, kMessages) << "the ping-pong stopped after " << answered << " messages";
  EXPECT_TRUE(peer.Send('x'));
  EXPECT_EQ(peer.Wait(), 0);
}

std::atomic<int> g_signals{0};
void CountSignal(int) {
  g_signals.fetch_add(1);
}

// SIGUSR2 sent to the waiting thread once it is blocked, its handler installed with SA_RESTART
// or without (`restart`); the test looks at what the wait did then.
class EventWaitSignals : public EventWait {
 protected:
  void SignalTheWaiter(bool restart, EventWaiter& waiter) {
    struct sigaction sa {};
    sa.sa_handler = CountSignal;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR2, &sa, &old_), 0);
    restore_ = true;
    g_signals.store(0);
    std::this_thread::sleep_for(milliseconds(50));  // blocked by now
    ASSERT_EQ(pthread_kill(waiter.tid(), SIGUSR2), 0);
    for (int i = 0; i < 2500 && g_signals.load() == 0; ++i)
      std::this_thread::sleep_for(milliseconds(2));
    ASSERT_EQ(g_signals.load(), 1);
  }
  void TearDown() override {
    if (restore_) sigaction(SIGUSR2, &old_, nullptr);
    EventWait::TearDown();
  }
  struct sigaction old_ {};
  bool restore_ = false;
};

// read() goes on waiting after a handler installed with SA_RESTART; poll(), which the wait is
// made of, returns EINTR after any: passed on, rping's CQ thread took it for a failure and ended.
TEST_F(EventWaitSignals, AHandlerThatRestartsCallsLeavesTheWaitWaiting) {
  ASSERT_NO_FATAL_FAILURE(ConnectAndTakeTheFirstMessage());
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  EventWaiter waiter(ch_);
  SignalTheWaiter(true, waiter);
  EXPECT_FALSE(waiter.Returned(milliseconds(100))) << "ended by the signal";
  ASSERT_TRUE(peer_.Send('h'));
  ASSERT_TRUE(waiter.Returned(milliseconds(5000)));
  EXPECT_EQ(waiter.result(), 0) << strerror(waiter.error());
  if (waiter.result() == 0) ibv_ack_cq_events(cq_, 1);
  ExpectTheSecondMessage();
}

// Without SA_RESTART the wait ends with EINTR, as rdma-core's read() does: qperf ends its timed
// tests with SIGALRM so.
TEST_F(EventWaitSignals, AHandlerThatDoesNotRestartCallsEndsTheWaitWithEintr) {
  ASSERT_NO_FATAL_FAILURE(ConnectAndTakeTheFirstMessage());
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  EventWaiter waiter(ch_);
  SignalTheWaiter(false, waiter);
  ASSERT_TRUE(waiter.Returned(milliseconds(5000)));
  EXPECT_EQ(waiter.result(), -1);
  EXPECT_EQ(waiter.error(), EINTR);
  ASSERT_TRUE(peer_.Send('h'));
  ibv_wc wc;
  ASSERT_TRUE(PollOne(cq_, &wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_TRUE(peer_.Send('x'));
  EXPECT_EQ(peer_.Wait(), 0);
}

// Waiting alongside the progress thread must not spin: a second of waiting costs almost no CPU.
TEST_F(EventWait, AThreadBlockedInGetCqEventUsesNoCpu) {
  ASSERT_NO_FATAL_FAILURE(ConnectAndTakeTheFirstMessage());
  ASSERT_EQ(ibv_req_notify_cq(cq_, 0), 0);
  const long before = ProcessCpuUs();
  EventWaiter waiter(ch_);
  EXPECT_FALSE(waiter.Returned(milliseconds(1000))) << "no completion was due";
  const long cpu_us = ProcessCpuUs() - before;
  EXPECT_LT(cpu_us, 50000) << "the process used " << cpu_us << " us of CPU in 1 s of waiting";
  ASSERT_TRUE(peer_.Send('h'));
  ASSERT_TRUE(waiter.Returned(milliseconds(5000)));
  EXPECT_EQ(waiter.result(), 0) << strerror(waiter.error());
  if (waiter.result() == 0) ibv_ack_cq_events(cq_, 1);
  ExpectTheSecondMessage();
}

}  // namespace
