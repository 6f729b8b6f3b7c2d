// Links move frames between softrdma nodes. A frame is an opaque header (the IB transport headers,
// which the link never interprets) plus a payload. Links know nothing about verbs: the core hands
// them OutFrames and receives frames through a FrameSink, deciding per frame where the payload
// goes so that large payloads land directly in registered memory.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace softrdma::link {

class PeerWindows;

constexpr int kMaxSegs = 32;             // payload pieces of one frame (one per SGE)
constexpr size_t kMaxHeaderBytes = 128;  // LRH+GRH+BTH+largest extension set is < 100
constexpr size_t kNodeIdBytes = 16;
// OutFrame::rider_ack and FrameSink::OnFrameHeader's `rider_ack` when no acknowledgement rides.
constexpr uint32_t kNoRiderAck = UINT32_MAX;

// The identity a node announces when a connection opens (the core puts its GID there).
struct NodeId {
  uint8_t bytes[kNodeIdBytes] = {};
};

// IPv4 address and port of a node's endpoint, host byte order.
struct PeerAddr {
  uint32_t ip = 0;
  uint16_t port = 0;
  bool operator==(const PeerAddr&) const = default;
};

// The endpoint a node id names. A node id is the node's GID 0 (fe80::/64, IPv4, port, slot; see
// core/addressing.h, whose ParseGid reads it through this too).
inline PeerAddr NodeAddress(const NodeId& id) {
  const uint8_t* b = id.bytes;
  return PeerAddr{uint32_t{b[8]} << 24 | uint32_t{b[9]} << 16 | uint32_t{b[10]} << 8 | b[11],
                  static_cast<uint16_t>(b[12] << 8 | b[13])};
}

struct OutFrame {
  uint8_t hdr[kMaxHeaderBytes];
  uint8_t hdr_len = 0;
  iovec seg[kMaxSegs];
  int nseg = 0;
  uint32_t payload_len = 0;
  // True when the payload memory stays valid until the core retires the frame (an RC request
  // waits for its ACK). Otherwise a link that cannot write at once copies the payload.
  bool payload_outlives_send = false;
  // A UD datagram: counts against the channel's datagram backlog (Channel::AwaitRoom).
  bool datagram = false;
  // An RC request carrying the ACK its QP owes the peer (Channel::carries_acks): the PSN
  // acknowledged, or kNoRiderAck.
  uint32_t rider_ack = kNoRiderAck;
  // An RDMA WRITE: the peer's application learns of it from its memory, not from a CQ (it may be
  // spinning on that memory), so a link must not leave it for that application's next poll.
  bool awaited_in_memory = false;
  // Part of a stream (a request while others of its QP are in flight, the answer to a request
  // read together with more): nobody waits for it alone, so a link may hold it a moment and write
  // it together with the frames that follow it.
  bool deferrable = false;
  std::vector<uint8_t> owned;  // a private copy of the payload, when one was made

  void AddPayload(const void* p, size_t n) {
    seg[nseg++] = iovec{const_cast<void*>(p), n};
    payload_len += static_cast<uint32_t>(n);
  }
  // Replaces borrowed payload memory with a private copy.
  void OwnPayload();
};

// Where the payload of an inbound frame goes. Bytes beyond the segments are discarded.
struct RxTarget {
  iovec seg[kMaxSegs + 1];
  int nseg = 0;
  std::shared_ptr<void> hold;  // keeps the sink's receiving object alive until the frame ends
  // Set by the sink in OnFrameHeader after Channel::Hold: the channel keeps the frame (nothing of
  // it is delivered, no OnFrameEnd) and hands it over again once resumed.
  bool wait = false;
  // A placement could not be written (link/placement_guard.h): the sink fails the access.
  bool refused = false;
  // Later frames are already read on the same connection: an answer this frame causes may wait to
  // leave with theirs (OutFrame::deferrable).
  bool inbound_follows = false;
  // Sink-private per-frame state (the core keeps the receive WQE a message took here).
  alignas(8) unsigned char scratch[704] = {};
  void Add(void* p, size_t n) { seg[nseg++] = iovec{p, n}; }
  // Ready for the next frame. The scratch area is left as it is: the sink sets it up with the
  // header (assigning a whole RxTarget wrote 2.6 KB per frame, twice).
  void Reset() {
    nseg = 0;
    hold.reset();
    wait = false;
    refused = false;
    inbound_follows = false;
  }
};

// How many bytes of frames may wait between a datagram sender and its receiver: a switch port's
// buffer. A receiver works through it in well under a millisecond (udpong, whose control messages
// must be answered within 1 ms, took seconds behind a flood queued without bound).
constexpr uint32_t kDatagramBacklogBytes = 16 * 1024;

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  virtual ~Channel() = default;
  // Queues a frame for the peer. Never blocks. A frame on a closed channel is dropped.
  virtual void Send(OutFrame&& f) = 0;
  // Two frames that should leave together (one write, one segment where the link allows).
  virtual void SendPair(OutFrame&& first, OutFrame&& second) {
    Send(std::move(first));
    Send(std::move(second));
  }
  virtual bool closed() const = 0;
  virtual bool is_loopback() const = 0;
  // Connectionless (UDP): no hello, no replies.
  virtual bool is_datagram() const { return false; }
  // The peer reads an ACK riding on a request (OutFrame::rider_ack) instead of an ACK frame of its
  // own: one frame less to build and to handle per answered message (TCP ib_write_lat).
  virtual bool carries_acks() const { return false; }
  // The peer broke the protocol: drop the connection (progress thread only).
  virtual void Abort() = 0;
  // Frame flow control, for channels that can leave a frame where it is (a shared-memory ring).
  // Hold: true when the channel can keep the frame now being offered, and will until Resume (the
  // sink then sets RxTarget::wait); the frames behind it wait too and the sender meets a full
  // ring. A datagram whose QP has no receive WQE waits so, for a bounded time.
  virtual bool Hold() { return false; }
  virtual void Resume() {}
  // Resume, from an application thread that holds no lock of ours (ibv_post_recv, once the QP's
  // lock is released): the channel may deliver what it held on this thread right away.
  virtual void ResumeHere() { Resume(); }
  // The peer's published windows, when it can be accessed directly (same host); else nullptr.
  virtual PeerWindows* direct() { return nullptr; }
  // After placing a SEND in the peer's receive queue directly: wakes the peer if it sleeps, so
  // that it collects the completion (a consumer that declared itself asleep sees the placement
  // first, or is woken).
  virtual void NudgeIfAsleep() {}
  // Whether the peer's applications poll: it has not declared itself asleep, and we have not
  // rung it lately (a ring clears that declaration while the peer is still waking).
  virtual bool PeerPolls() const { return false; }
  // Datagram flow control. True when frames towards the peer are backlogged beyond
  // kDatagramBacklogBytes; the sink then hears OnChannelRoom once the backlog has fallen below it
  // (or the channel closed). An unreliable sender waits meanwhile, as a NIC's send queue waits for
  // the wire, instead of queueing datagrams without bound behind a slow receiver.
  virtual bool AwaitRoom() { return false; }
  // A TCP path opens its connection at the first frame rather than when it is resolved: by then the
  // peer may have connected to us, and that one connection then carries both directions (one
  // connection per direction made the kernel send a bare ACK for every message: TCP ib_write_lat
  // on one host paid ~3 us per message for it). settled(): frames may go on this channel as it is;
  // otherwise Settle() says which channel they go on from now on (this one, opened, or the peer's).
  virtual bool settled() const { return true; }
  virtual std::shared_ptr<Channel> Settle() { return shared_from_this(); }
  // Identity the peer announced; valid once frames arrive from it.
  const NodeId& peer_id() const { return peer_id_; }

  // The sink's note of where this channel's last frame went, so that the next one to the same place
  // is found without a table lookup. Only whoever delivers the channel's frames (under the
  // endpoint's progress mutex) touches it; the link never reads it.
  struct SinkMemo {
    std::weak_ptr<void> target;
    uint32_t key = 0;
    uint64_t generation = 0;  // the sink's; 0 never matches
  };
  SinkMemo& sink_memo() { return sink_memo_; }

 protected:
  NodeId peer_id_;

 private:
  SinkMemo sink_memo_;
};

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // A frame's header arrived; `payload_len` bytes follow. Fill `t` with their destination.
  // `rider_ack`: the PSN an acknowledgement riding on the frame acknowledges, or kNoRiderAck.
  virtual void OnFrameHeader(Channel& ch, const uint8_t* hdr, size_t hdr_len, uint32_t payload_len,
                             RxTarget& t, uint32_t rider_ack) = 0;
  virtual void OnFrameEnd(Channel& ch, RxTarget& t) = 0;
  // The channel died between OnFrameHeader and OnFrameEnd.
  virtual void OnFrameAbort(Channel& ch, RxTarget& t) = 0;
  virtual void OnChannelClosed(Channel& ch) = 0;
  // A channel that answered AwaitRoom() true has room again (progress thread or a claimed poller).
  virtual void OnChannelRoom(Channel& ch) = 0;
  // Called after each batch of inbound work: the place to flush coalesced acknowledgements.
  virtual void OnBatchEnd() = 0;
  // Work that came without a frame (SENDs a same-host peer placed directly), which OnBatchEnd
  // collects: a consumer about to sleep asks, after declaring itself asleep.
  virtual bool DirectWorkPending() { return false; }
  // Runs due timers; returns the next deadline in CLOCK_MONOTONIC ns, or INT64_MAX.
  virtual int64_t OnTimers(int64_t now_ns) = 0;
};

int64_t NowNs();
// The same clock read at the scheduler tick's resolution (kCoarseClockStepNs at most), for a
// fifth of the cost: for marks taken per frame and compared against milliseconds.
int64_t CoarseNowNs();
constexpr int64_t kCoarseClockStepNs = 10'000'000;  // HZ=100, the coarsest kernel tick

}  // namespace softrdma::link
