#include "link/endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "link/endpoint_impl.h"
#include "link/frame_codec.h"
#include "link/own_socket.h"
#include "link/plain_syscall.h"
#include "link/running_thread.h"
#include "link/sanitizers.h"
#include "link/rx_cursor.h"
#include "link/shm_channel.h"
#include "link/socket_tuning.h"
#include "link/spin_pause.h"
#include "link/udp_link.h"

namespace softrdma::link {
namespace {

constexpr size_t kRxBufferBytes = 256 * 1024;
// Payload remainders at least this large are read straight into their destination.
constexpr size_t kDirectReadBytes = 16 * 1024;
constexpr int kFramesPerWakeup = 256;
// Frames up to this size in all are copied into one piece and written by send (WriteNowLocked).
constexpr size_t kGatherBytes = 512;
constexpr int kIovBatch = 512;
// A stream's requests wait for the next EPOLLOUT (TcpChannel::DeferLocked) up to this many in the
// queue, each with at most this much payload (larger ones gain little from sharing a send).
constexpr size_t kDeferFrames = 64;
constexpr uint32_t kDeferPayloadBytes = 16 * 1024;
// A datagram that follows the channel's last one this closely is part of a stream (a sender posting
// back to back: 0.5-0.7 us apart here, now and then 15-19), and may wait as a stream's requests
// do; request-response traffic sends one per round trip, over 10 us even on loopback (ib_send_lat
// -c UD), and is never held.
constexpr int64_t kDatagramStreamGapNs = 4'000;
// Only datagrams this small are held, sixteen or more to the datagram backlog (link.h): held ones
// count against it as sent, and the peer credits only what it has read, so larger ones held waited
// for credits that their holding delayed (2 KiB across two namespaces: 0.07-0.12 -> 0.06-0.08 M
// msgs/s; 1 KiB 0.09-0.15 -> 0.28-0.34).
constexpr uint32_t kHeldDatagramBytes = kDatagramBacklogBytes / 16;

uint64_t Key(const PeerAddr& a);

// A polling thread's copy of an endpoint's shared-memory channels (Endpoint::Impl::ShmRxReady).
// The copies keep the channels, and so their rings, mapped until the thread copies again, arms a
// CQ or ends. Generations are numbered across endpoints: an endpoint made where another was
// cannot match an old copy.
std::atomic<uint64_t> g_shm_generations{0};
struct ShmSnapshot {
  const Endpoint::Impl* owner = nullptr;
  uint64_t generation = 0;
  std::vector<std::shared_ptr<ShmChannel>> channels;
};
thread_local ShmSnapshot t_shm_snapshot;  // general TLS model: see t_poll_target in core/cq.cpp
thread_local const Endpoint::Impl* t_progress_loop = nullptr;  // the Loop this thread runs

// epoll_pwait2 (Linux 5.11) waits with a timeout in nanoseconds. Older kernels answer ENOSYS, and
// container seccomp profiles older than the call EPERM (it has no EPERM of its own): then the
// epoll descriptor is waited on with ppoll, which takes nanoseconds too, and read without
// waiting. Taking the failure for "no events" made the progress thread spin and leave records
// unserved (ib_write_lat: t_avg 1 ms, t_max 0.5 s; test OldKernel.*).
int WaitForEvents(int epfd, epoll_event* events, int max, const timespec* timeout) {
  static std::atomic<bool> without_pwait2{false};
  if (!without_pwait2.load(std::memory_order_relaxed)) {
    int n = epoll_pwait2(epfd, events, max, timeout, nullptr);
    if (n >= 0 || (errno != ENOSYS && errno != EPERM)) return n;
    without_pwait2.store(true, std::memory_order_relaxed);
  }
  pollfd p{epfd, POLLIN, 0};
  int ready = ppoll(&p, 1, timeout, nullptr);
  return ready > 0 ? epoll_wait(epfd, events, max, 0) : ready;
}

// The owner of the other end of a TCP connection within this network namespace (/proc/net/tcp
// lists both ends), or -1 when that end is elsewhere.
int64_t PeerUid(int fd) {
  sockaddr_in me{}, them{};
  socklen_t l1 = sizeof me, l2 = sizeof them;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &l1) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&them), &l2) != 0)
    return -1;
  // The table prints addresses as the bytes in memory read as one hex word, ports in host order.
  char want_local[32], want_remote[32];
  snprintf(want_local, sizeof want_local, "%08X:%04X", them.sin_addr.s_addr, ntohs(them.sin_port));
  snprintf(want_remote, sizeof want_remote, "%08X:%04X", me.sin_addr.s_addr, ntohs(me.sin_port));
  FILE* f = fopen("/proc/net/tcp", "rce");  // c: not a cancellation point (plain_syscall.h)
  if (!f) return -1;
  char line[512];
  int64_t uid = -1;
  while (fgets(line, sizeof line, f)) {
    char local[64], remote[64];
    unsigned owner;
    if (sscanf(line, "%*d: %63s %63s %*x %*s %*s %*s %u", local, remote, &owner) == 3 &&
        std::strcmp(local, want_local) == 0 && std::strcmp(remote, want_remote) == 0) {
      uid = owner;
      break;
    }
  }
  fclose(f);
  return uid;
}

}  // namespace

class TcpChannel final : public ServedChannel {
 public:
  // A connection a peer opened to us.
  TcpChannel(Endpoint::Impl& ep, int fd)
      : ep_(ep), fd_(fd), connecting_(false), accepted_(true), rx_(new uint8_t[kRxBufferBytes]) {}
  // A path to `peer` whose connection opens at its first frame (Settle).
  TcpChannel(Endpoint::Impl& ep, const PeerAddr& peer)
      : ep_(ep), fd_(-1), connecting_(true), accepted_(false), peer_(peer), lazy_(true) {}
  ~TcpChannel() override {
    if (fd_ >= 0) sys::Close(fd_);
  }

  void Start() {
    TxItem hello;
    hello.head_len = sizeof(Hello);
    EncodeHello(hello.head, ep_.self);
    std::lock_guard g(tx_mu_);
    txq_.push_back(std::move(hello));
    if (!connecting_) FlushLocked();
    UpdateInterestLocked();
  }

  void Send(OutFrame&& f) override {
    if (!settled()) return Route()->Send(std::move(f));  // a sender that did not settle first
    std::lock_guard g(tx_mu_);
    OutFrame* frames[1] = {&f};
    SendLocked(frames, 1);
  }

  void SendPair(OutFrame&& first, OutFrame&& second) override {
    if (!settled()) return Route()->SendPair(std::move(first), std::move(second));
    std::lock_guard g(tx_mu_);
    OutFrame* frames[2] = {&first, &second};
    SendLocked(frames, 2);
  }

  // Writes the frames at once when nothing waits before them (one system call, nothing copied: a
  // frame queued and then flushed cost two copies of its 700-byte descriptor and a deque node,
  // about a microsecond per message); queues what the socket did not take.
  void SendLocked(OutFrame* const* frames, int n) {
    const bool datagram = frames[n - 1]->datagram;
    const bool stream = datagram && NowNs() - last_datagram_ns_ < kDatagramStreamGapNs;
    if (DeferLocked(frames, n, stream)) {
      // After the deferral, whose first asks epoll for EPOLLOUT (~9 us here, with the progress
      // thread woken): the gap to the next datagram counts from here.
      if (datagram) last_datagram_ns_ = NowNs();
      return;
    }
    size_t written = 0;
    if (txq_.empty() && !connecting_ && !broken_ && !closed_.load(std::memory_order_relaxed))
      written = WriteNowLocked(frames, n);
    for (int i = 0; i < n; ++i) {
      OutFrame& f = *frames[i];
      const size_t total = FrameHeadBytes(f) + f.hdr_len + f.payload_len;
      if (written >= total) {
        if (f.datagram) dgram_sent_ += total;  // QueueLocked counts those it queues
        written -= total;
        continue;
      }
      QueueLocked(std::move(f));
      if (written > 0 && !txq_.empty()) txq_.back().done = written;
      written = 0;
    }
    KickLocked();
    if (datagram) last_datagram_ns_ = NowNs();
  }

  // Bytes of `frames` the socket took at once (0 when none, or it failed).
  size_t WriteNowLocked(OutFrame* const* frames, int n) {
    uint8_t links[2][kMaxFrameHeadBytes];
    iovec iov[2 * (kMaxSegs + 2)];
    int k = 0;
    for (int i = 0; i < n && i < 2; ++i) {
      const OutFrame& f = *frames[i];
      iov[k++] = iovec{links[i], EncodeFrameHead(links[i], f)};
      iov[k++] = iovec{const_cast<uint8_t*>(f.hdr), f.hdr_len};
      for (int s = 0; s < f.nseg; ++s) iov[k++] = f.seg[s];
    }
    // Small frames leave gathered into one piece, by send(): the kernel's TCP path pays per
    // piece, and sendmsg more than send for its header and vector (a WRITE with the ACK riding
    // along, five pieces and 78 bytes: sendmsg ~0.5 us, and send ~0.25 us more than one piece by
    // sendmsg, on loopback).
    size_t total = 0;
    for (int i = 0; i < k; ++i) total += iov[i].iov_len;
    if (total <= kGatherBytes) {
      alignas(64) uint8_t gathered[kGatherBytes];
      size_t at = 0;
      for (int i = 0; i < k; ++i) {
        std::memcpy(gathered + at, iov[i].iov_base, iov[i].iov_len);
        at += iov[i].iov_len;
      }
      for (;;) {
        ssize_t w = sys::Send(fd_, gathered, total, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0) return static_cast<size_t>(w);
        if (errno == EINTR) continue;
        return 0;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(k);
    for (;;) {
      ssize_t w = sys::SendMsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w >= 0) return static_cast<size_t>(w);
      if (errno == EINTR) continue;
      return 0;  // a broken socket is found by the flush that follows, as ever
    }
  }

  // A stream's requests (OutFrame::deferrable), and its small datagrams (`datagram_stream`: see
  // last_datagram_ns_), wait in the queue for the next EPOLLOUT, which the progress thread or a
  // polling thread serves: what is posted meanwhile leaves with them in one sendmsg. On loopback a
  // send costs its sender the receiver's TCP work as well (~7 us a segment on this VM):
  // ib_write_bw 64 B paid it for every WRITE. Anything else, or a queue of kDeferFrames, writes
  // the whole queue at once (KickLocked).
  bool DeferLocked(OutFrame* const* frames, int n, bool datagram_stream) {
    if (connecting_ || broken_ || closed_.load(std::memory_order_relaxed) ||
        (!txq_.empty() && !deferred_) || txq_.size() + static_cast<size_t>(n) > kDeferFrames)
      return false;
    for (int i = 0; i < n; ++i) {
      const OutFrame& f = *frames[i];
      const bool held_datagram =
          f.datagram && datagram_stream && f.payload_len <= kHeldDatagramBytes;
      if (!(f.deferrable || held_datagram) || f.payload_len > kDeferPayloadBytes) return false;
    }
    for (int i = 0; i < n; ++i) {
      QueueLocked(std::move(*frames[i]));
      if (!txq_.back().frame.payload_outlives_send) txq_.back().frame.OwnPayload();
    }
    deferred_ = true;
    UpdateInterestLocked();
    if (out_of_set_) {  // out of the epoll set (adds refused): no EPOLLOUT comes
      FlushLocked();
      UpdateInterestLocked();  // EPOLLOUT no longer wanted if the socket took it all
    }
    return true;
  }

  void QueueLocked(OutFrame&& f) {
    if (closed_.load(std::memory_order_relaxed) || broken_) return;
    TxItem item;
    const size_t head = EncodeFrameHead(item.head, f);
    std::memcpy(item.head + head, f.hdr, f.hdr_len);
    item.head_len = static_cast<uint32_t>(head + f.hdr_len);
    item.frame = std::move(f);
    if (item.frame.datagram) dgram_sent_ += item.total();
    txq_.push_back(std::move(item));
  }

  void KickLocked() {
    if (txq_.empty()) return;
    if (!connecting_ && (!want_out_ || deferred_)) FlushLocked();
    if (!txq_.empty()) {
      // What stays queued may outlive the caller's buffers.
      for (TxItem& t : txq_)
        if (!t.frame.payload_outlives_send) t.frame.OwnPayload();
    }
    UpdateInterestLocked();
  }

  bool closed() const override {
    if (lazy_.load(std::memory_order_acquire)) return false;
    if (twin_) return twin_->closed();
    return closed_.load(std::memory_order_acquire);
  }
  bool is_loopback() const override { return false; }

  bool settled() const override { return !lazy_.load(std::memory_order_acquire) && !twin_; }

  // A path not settled sends ACK frames: the connection its frames take is decided only then.
  bool carries_acks() const override {
    return settled() && peer_reads_riders_.load(std::memory_order_acquire);
  }

  // Where this path's frames go: the peer's connection once settled on it (no lock then), else
  // this one, opened first if it is not yet.
  Channel* Route() {
    if (!lazy_.load(std::memory_order_acquire)) return twin_ ? twin_.get() : this;
    return Settle().get();  // twin_ or this: owned beyond the call
  }

  // Decided once, under the endpoint's lock: a connection the peer opened to us (its hello came)
  // carries our frames too; else ours opens now.
  std::shared_ptr<Channel> Settle() override {
    std::lock_guard<std::mutex> g(ep_.mu);
    return SettleLocked();
  }
  std::shared_ptr<Channel> SettleLocked() {
    if (!lazy_.load(std::memory_order_relaxed)) return twin_ ? twin_ : shared_from_this();
    if (std::shared_ptr<ServedChannel> twin = ep_.AcceptedFromLocked(Key(peer_))) {
      twin_ = twin;
      lazy_.store(false, std::memory_order_release);
      ep_.outbound[Key(peer_)] = twin;
      return twin;
    }
    OpenLocked();
    lazy_.store(false, std::memory_order_release);
    return shared_from_this();
  }
  void Abort() override { dead_ = true; }

  void OnEvents(uint32_t events) override {
    if (closed()) return;
    bool room = false;
    if (events & EPOLLOUT) {
      std::lock_guard g(tx_mu_);
      if (connecting_) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) broken_ = true;
        connecting_ = false;
      }
      if (!broken_) FlushLocked();
      room = room_wanted_ && (broken_ || !BackloggedLocked());
      if (room) room_wanted_ = false;
      UpdateInterestLocked();
    }
    if (room) ep_.sink.OnChannelRoom(*this);
    if (broken_) return Close();
    if ((events & (EPOLLHUP | EPOLLERR)) && held_.load(std::memory_order_acquire)) {
      // The peer is gone: what it left is delivered (or dropped) at once, not held.
      peer_gone_ = true;
      StopHolding();
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) OnReadable();
  }

  // The held frame stays in the staging buffer and the socket is left unread, so the peer's
  // stream backs up (TCP flow control) until Resume.
  bool Hold() override {
    if (peer_gone_ || dead_) return false;
    held_.store(true, std::memory_order_release);
    std::lock_guard g(tx_mu_);
    UpdateInterestLocked(true);
    return true;
  }

  // Any thread (a QP posting a receive, its timer).
  void Resume() override {
    // The held frame may be all in the staging buffer, with nothing left for epoll to report.
    if (StopHolding()) ep_.RxPending(std::static_pointer_cast<ServedChannel>(shared_from_this()));
  }

  // Progress thread only.
  void Close() override {
    {
      std::lock_guard g(tx_mu_);
      if (closed_.load()) return;
      closed_.store(true, std::memory_order_release);
      epoll_ctl(ep_.epfd, EPOLL_CTL_DEL, fd_, nullptr);
      shutdown(fd_, SHUT_RDWR);
      txq_.clear();
    }
    if (in_frame_) {
      in_frame_ = false;
      ep_.sink.OnFrameAbort(*this, target_);
      target_.Reset();
    }
    ep_.sink.OnChannelClosed(*this);
    ep_.Retire(std::static_pointer_cast<ServedChannel>(shared_from_this()));
  }

  int fd() const { return fd_; }

  // Datagrams the peer has not consumed are bounded as in a shared-memory ring: the sockets'
  // buffers (megabytes) would otherwise queue a flood ahead of the next datagram (udpong's
  // end-of-test message waited 130-310 ms behind one across namespaces, and it resends after 1 ms).
  bool AwaitRoom() override {
    if (!settled()) return Route()->AwaitRoom();
    std::lock_guard g(tx_mu_);
    if (closed() || broken_ || !BackloggedLocked()) return false;
    room_wanted_ = true;
    UpdateInterestLocked();
    return true;
  }

  // Frames still waiting for the socket (connecting, or the socket was full).
  bool TxPending() override {
    std::lock_guard g(tx_mu_);
    return !txq_.empty() && !closed() && !broken_;
  }

  // Progress thread (or a claimed poller): handles frames already read into the buffer.
  void ServeBuffered() override { OnReadable(); }

  void OwnQueuedPayloads() override {
    std::lock_guard g(tx_mu_);
    for (TxItem& t : txq_) t.frame.OwnPayload();
  }

 private:
  // Opens the connection of a lazy path (the endpoint's lock held). A socket that cannot even
  // start connecting leaves the channel closed: its frames are lost and its QPs time out.
  void OpenLocked() {
    int fd = sys::OwnSocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(peer_.ip);
      a.sin_port = htons(peer_.port);
      if (sys::Connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 &&
          errno != EINPROGRESS) {
        sys::Close(fd);
        fd = -1;
      }
    }
    if (fd < 0) {
      closed_.store(true, std::memory_order_release);
      return;
    }
    TuneSocket(fd, peer_.ip);  // after connect: its own address is bound now
    fd_ = fd;
    rx_.reset(new uint8_t[kRxBufferBytes]);  // only now: a path may settle on the peer's instead
    auto self = std::static_pointer_cast<ServedChannel>(shared_from_this());
    ep_.channels.insert(self);
    RegisterPollable(ep_.epfd, fd, this, EPOLLIN | EPOLLOUT);
    Start();
  }

  // A peer's hello on a connection it opened: paths to the endpoint it names (the port of its
  // node id, at the address the connection comes from) may settle on this connection. A hello is
  // only a claim: a process of this host must run as our user (it could read our memory anyway),
  // one elsewhere must come from the address its node id names.
  void NoteAcceptedHello() {
    const PeerAddr named = NodeAddress(peer_id_);
    sockaddr_in from{};
    socklen_t len = sizeof from;
    if (named.port == 0 || getpeername(fd_, reinterpret_cast<sockaddr*>(&from), &len) != 0 ||
        from.sin_family != AF_INET)
      return;
    uint32_t from_ip = ntohl(from.sin_addr.s_addr);
    int64_t owner = PeerUid(fd_);
    if (owner >= 0 ? owner != int64_t{geteuid()} : from_ip != named.ip) return;
    std::lock_guard<std::mutex> g(ep_.mu);
    ep_.accepted[Key(PeerAddr{from_ip, named.port})] =
        std::static_pointer_cast<ServedChannel>(shared_from_this());
  }

  struct TxItem {
    uint8_t head[sizeof(Hello) + kMaxFrameHeadBytes + kMaxHeaderBytes];
    uint32_t head_len = 0;
    OutFrame frame;
    size_t done = 0;  // bytes of head+payload already written
    size_t total() const { return head_len + frame.payload_len; }
  };

  // Ends a hold, reading the socket again. False when nothing was held.
  bool StopHolding() {
    if (!held_.exchange(false, std::memory_order_acq_rel)) return false;
    std::lock_guard g(tx_mu_);
    UpdateInterestLocked(true);
    return true;
  }

  // A stream held on purpose (DeferLocked) is no backlog: its datagrams' bytes count as sent.
  bool BackloggedLocked() const {
    return (!txq_.empty() && !deferred_) || dgram_sent_ - dgram_credited_ > kDatagramBacklogBytes;
  }

  // `reading_changed`: a hold began or ended.
  void UpdateInterestLocked(bool reading_changed = false) {
    // A room waiter hears of a queue that a sender's own write emptied at the next EPOLLOUT (of
    // credits, when the peer's credit frame comes).
    bool want = connecting_ || !txq_.empty() ||
                (room_wanted_ && dgram_sent_ - dgram_credited_ <= kDatagramBacklogBytes);
    if ((want == want_out_ && !reading_changed) || closed()) return;
    want_out_ = want;
    epoll_event ev = InterestLocked();
    // Out of the set, only reading is the poller's: anything else needs epoll again.
    if (out_of_set_) {
      if (ev.events != EPOLLIN && epoll_ctl(ep_.epfd, EPOLL_CTL_ADD, fd_, &ev) == 0)
        out_of_set_ = false;
      stranded_.store(out_of_set_ && want_out_, std::memory_order_relaxed);
      return;
    }
    epoll_ctl(ep_.epfd, EPOLL_CTL_MOD, fd_, &ev);
  }

  epoll_event InterestLocked() {
    epoll_event ev{};
    bool reading = !held_.load(std::memory_order_acquire);
    ev.events = (reading ? uint32_t{EPOLLIN} : 0u) | (want_out_ ? uint32_t{EPOLLOUT} : 0u);
    ev.data.ptr = static_cast<Pollable*>(this);
    return ev;
  }

  // Only a socket the poller alone needs to hear from: reading, nothing queued to write.
  bool LeaveSet() override {
    std::lock_guard g(tx_mu_);
    if (out_of_set_ || want_out_ || held_.load(std::memory_order_acquire) || closed()) return false;
    if (epoll_ctl(ep_.epfd, EPOLL_CTL_DEL, fd_, nullptr) != 0) return false;
    out_of_set_ = true;
    return true;
  }

  bool ReturnToSet() override {
    std::lock_guard g(tx_mu_);
    if (!out_of_set_ || closed()) return true;
    epoll_event ev = InterestLocked();
    if (epoll_ctl(ep_.epfd, EPOLL_CTL_ADD, fd_, &ev) != 0) return false;  // ENOMEM, ENOSPC
    out_of_set_ = false;
    stranded_.store(false, std::memory_order_relaxed);
    return true;
  }

  // Writes as much of the queue as the socket takes now.
  void FlushLocked() {
    deferred_ = false;  // what the socket does not take now waits for room
    while (!txq_.empty()) {
      iovec iov[kIovBatch];
      int n = 0;
      for (const TxItem& t : txq_) {
        if (n + kMaxSegs + 1 > kIovBatch) break;
        size_t skip = t.done;
        if (skip < t.head_len) {
          iov[n++] = iovec{const_cast<uint8_t*>(t.head) + skip, t.head_len - skip};
          skip = 0;
        } else {
          skip -= t.head_len;
        }
        for (int i = 0; i < t.frame.nseg; ++i) {
          const iovec& s = t.frame.seg[i];
          if (skip >= s.iov_len) {
            skip -= s.iov_len;
            continue;
          }
          iov[n++] = iovec{static_cast<uint8_t*>(s.iov_base) + skip, s.iov_len - skip};
          skip = 0;
        }
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t w = sys::SendMsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          broken_ = true;
          txq_.clear();
          ep_.Wake();
        }
        return;
      }
      size_t left = static_cast<size_t>(w);
      while (left > 0 && !txq_.empty()) {
        TxItem& t = txq_.front();
        size_t need = t.total() - t.done;
        if (left >= need) {
          left -= need;
          txq_.pop_front();
        } else {
          t.done += left;
          left = 0;
        }
      }
    }
  }

  // Reads more bytes into the staging buffer. False when the socket has nothing now or died.
  bool Fill() {
    if (rx_begin_ > 0 && (rx_end_ == kRxBufferBytes || rx_begin_ == rx_end_)) {
      std::memmove(rx_.get(), rx_.get() + rx_begin_, rx_end_ - rx_begin_);
      rx_end_ -= rx_begin_;
      rx_begin_ = 0;
    }
    size_t room = kRxBufferBytes - rx_end_;
    ssize_t r = sys::Recv(fd_, rx_.get() + rx_end_, room, MSG_DONTWAIT);
    if (r > 0) {
      rx_end_ += static_cast<size_t>(r);
      drained_ = static_cast<size_t>(r) < room;
      return true;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    dead_ = true;
    return false;
  }

  size_t Buffered() const { return rx_end_ - rx_begin_; }

  // Moves `n` payload bytes from `src` into the current target (or drops what has no home).
  void Deliver(const uint8_t* src, size_t n) {
    cursor_.Deliver(target_, src, n);
    remaining_ -= n;
  }

  // Reads the rest of a large payload straight into its destination segments.
  bool ReadDirect() {
    iovec iov[kMaxSegs + 1];
    int n = 0;
    size_t want = remaining_;
    for (int i = cursor_.seg; i < target_.nseg && want > 0; ++i) {
      size_t off = i == cursor_.seg ? cursor_.off : 0;
      size_t len = std::min(target_.seg[i].iov_len - off, want);
      iov[n++] = iovec{static_cast<uint8_t*>(target_.seg[i].iov_base) + off, len};
      want -= len;
    }
    ssize_t r = sys::Readv(fd_, iov, n);
    if (r < 0 && errno == EFAULT) {
      // The kernel met a page it may not write: one the application made read-only (or one being
      // moved onto the arena). The frame's payload goes through the staging buffer, whose copy
      // gets past that (link/placement_guard.h); nothing was consumed.
      buffered_frame_ = true;
      return true;
    }
    if (r <= 0) {
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
      dead_ = true;
      return false;
    }
    remaining_ -= static_cast<size_t>(r);
    cursor_.Advance(target_, static_cast<size_t>(r));
    return true;
  }

  // Advances the current frame's payload. True when the frame completed.
  bool PumpPayload() {
    while (remaining_ > 0) {
      if (Buffered() > 0) {
        size_t c = std::min<size_t>(Buffered(), remaining_);
        Deliver(rx_.get() + rx_begin_, c);
        rx_begin_ += c;
        continue;
      }
      bool ok = (remaining_ >= kDirectReadBytes && cursor_.seg < target_.nseg && !buffered_frame_)
                    ? ReadDirect()
                    : Fill();
      if (!ok) return false;
    }
    in_frame_ = false;
    ep_.sink.OnFrameEnd(*this, target_);
    target_.Reset();
    if (frame_dgram_bytes_ > 0) ConsumedDatagram(frame_dgram_bytes_);
    return true;
  }

  // Tells the peer, every kCreditStepBytes, how many datagram bytes we have consumed. A sender is
  // backlogged only while more than kDatagramBacklogBytes - kCreditStepBytes are unconsumed here,
  // so it always hears of the room their consumption makes. A quarter of the backlog cost
  // ib_send_bw -c UD 2 KiB a third of its bandwidth (a credit's write per two datagrams).
  static constexpr uint64_t kCreditStepBytes = kDatagramBacklogBytes / 2;
  void ConsumedDatagram(uint64_t bytes) {
    dgram_consumed_ += bytes;
    if (dgram_consumed_ - dgram_reported_ < kCreditStepBytes) return;
    dgram_reported_ = dgram_consumed_;
    TxItem credit;
    EncodeCredit(credit.head, dgram_consumed_);
    credit.head_len = kCreditFrameBytes;
    std::lock_guard g(tx_mu_);
    if (closed() || broken_) return;
    txq_.push_back(std::move(credit));
    KickLocked();
  }

  // A credit from the peer. False when it is one no well-behaved peer sends.
  bool OnCredit(uint64_t consumed) {
    bool room = false;
    {
      std::lock_guard g(tx_mu_);
      if (consumed < dgram_credited_ || consumed > dgram_sent_) return false;
      dgram_credited_ = consumed;
      room = room_wanted_ && !BackloggedLocked();
      if (room) {
        room_wanted_ = false;
        UpdateInterestLocked();
      }
    }
    if (room) ep_.sink.OnChannelRoom(*this);
    return true;
  }

  // Reads and handles what the socket has, without asking epoll first. Returns the frames handled.
  // An empty socket is found by poll(), not by recv(): recv holds the socket's lock, and a
  // segment the peer delivers meanwhile goes to the socket's backlog, for this thread to process
  // (docs/architecture.md §4, the hot socket).
  int ReadNow() override {
    if (closed()) return 0;
    if (stranded_.load(std::memory_order_relaxed)) {
      OnEvents(EPOLLOUT);  // which epoll does not report for this socket (stranded_)
      if (closed()) return 0;
    }
    if (Buffered() == 0) {
      pollfd p{fd_, POLLIN, 0};
      if (sys::PollNow(&p, 1) <= 0) return 0;  // POLLHUP and POLLERR come unasked: recv sees them
    }
    return OnReadable();
  }

  ServedChannel* socket_channel() override { return this; }

  int OnReadable() {
    if (held_.load(std::memory_order_acquire)) return 0;
    drained_ = false;
    int frames = 0;
    for (; frames < kFramesPerWakeup && !dead_;) {
      if (in_frame_) {
        if (!PumpPayload()) break;
        ++frames;
        // The last read left the socket empty and every byte is consumed: asking again would only
        // return EAGAIN, one system call later on the way to sending the ACK. Level-triggered
        // epoll reports anything that arrives meanwhile.
        if (drained_ && Buffered() == 0) break;
        continue;
      }
      if (!hello_done_) {
        if (Buffered() < sizeof(Hello)) {
          if (!Fill()) break;
          continue;
        }
        uint8_t features = 0;
        if (!DecodeHello(rx_.get() + rx_begin_, &peer_id_, &features)) {
          dead_ = true;
          break;
        }
        peer_reads_riders_.store((features & kHelloReadsRiderAcks) != 0, std::memory_order_release);
        rx_begin_ += sizeof(Hello);
        hello_done_ = true;
        if (accepted_) NoteAcceptedHello();
        continue;
      }
      DecodedHeader h;
      if (Buffered() < sizeof(LinkHeader)) {
        if (!Fill()) break;
        continue;
      }
      if (!DecodeLinkHeader(rx_.get() + rx_begin_, &h)) {
        dead_ = true;  // a malformed stream cannot be resynchronised: drop the connection
        break;
      }
      const size_t head = sizeof(LinkHeader) + h.rider_bytes;
      if (Buffered() < head + h.hdr_len) {
        if (!Fill()) break;
        continue;
      }
      if (h.flags & kLinkFlagCredit) {
        uint64_t consumed = DecodeCredit(rx_.get() + rx_begin_ + sizeof(LinkHeader));
        rx_begin_ += kCreditFrameBytes;
        ++frames;
        if (!OnCredit(consumed)) dead_ = true;
        continue;
      }
      frame_dgram_bytes_ =
          (h.flags & kLinkFlagDatagram) ? sizeof(LinkHeader) + h.hdr_len + h.payload_len : 0;
      uint32_t rider_ack = kNoRiderAck;
      if (h.rider_bytes &&
          !DecodeRiderAck(rx_.get() + rx_begin_ + sizeof(LinkHeader), &rider_ack)) {
        dead_ = true;
        break;
      }
      const uint8_t* hdr = rx_.get() + rx_begin_ + head;
      const size_t frame_at = rx_begin_;
      rx_begin_ += head + h.hdr_len;
      target_.Reset();
      in_frame_ = true;
      buffered_frame_ = false;
      remaining_ = h.payload_len;
      cursor_ = RxCursor{};
      target_.inbound_follows = Buffered() > h.payload_len;
      ep_.sink.OnFrameHeader(*this, hdr, h.hdr_len, h.payload_len, target_, rider_ack);
      if (target_.wait) {
        // Held (Hold): the frame is offered again, from its link header, once resumed.
        rx_begin_ = frame_at;
        in_frame_ = false;
        target_.Reset();
        return frames;
      }
    }
    if (dead_) {
      Close();
      return frames;
    }
    // Out of budget with bytes already read: the socket may have nothing more to report, so
    // epoll would not bring us back to them. Ask for another turn.
    if (frames >= kFramesPerWakeup && Buffered() > 0)
      ep_.RxPending(std::static_pointer_cast<ServedChannel>(shared_from_this()));
    return frames;
  }

  Endpoint::Impl& ep_;
  int fd_;
  std::atomic<bool> closed_{false};

  FastMutex tx_mu_;          // guards everything tx below
  bool out_of_set_ = false;  // not in ep_.epfd (LeaveSet)
  // Out of the set, wanting EPOLLOUT, and epoll refused to take the socket back (ENOSPC: the
  // user's epoll watches ran out): no EPOLLOUT comes, so whoever reads the socket (ReadNow: the
  // leased poller, the progress thread every kUnwatchedSocketsNs) serves it. Without, the rest of
  // a write the socket did not take at once never left. Set under tx_mu_, read under progress_mu.
  std::atomic<bool> stranded_{false};
  std::deque<TxItem> txq_;
  bool connecting_;
  const bool accepted_;
  const PeerAddr peer_{};  // a lazy path's destination
  // A lazy path: no connection yet (Settle decides). Once settled on a peer's connection, twin_
  // is that connection (written once, before lazy_ turns false) and carries this path's frames.
  std::atomic<bool> lazy_{false};
  std::shared_ptr<ServedChannel> twin_;
  bool want_out_ = true;   // registered with EPOLLOUT at creation
  bool deferred_ = false;  // txq_ holds a stream's requests for the next EPOLLOUT (DeferLocked)
  // When the channel's last Send of a datagram ended: one that comes within kDatagramStreamGapNs
  // continues a stream, and DeferLocked may hold it. A datagram completes once the link has it, so
  // none is ever in flight, and the requests' test (OutFrame::deferrable) never held one:
  // ib_send_bw -c UD 64 B paid a send(2) per datagram, 0.13-0.25 M msgs/s against RC's 0.72.
  int64_t last_datagram_ns_ = INT64_MIN / 2;
  bool broken_ = false;
  bool room_wanted_ = false;  // AwaitRoom said no room: tell the sink when there is
  // Datagram bytes queued for the peer, and how many of them it said it consumed (credits).
  uint64_t dgram_sent_ = 0;
  uint64_t dgram_credited_ = 0;

  // Receive state, progress thread only.
  std::unique_ptr<uint8_t[]> rx_;
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool hello_done_ = false;
  std::atomic<bool> peer_reads_riders_{false};  // its hello has kHelloReadsRiderAcks
  bool dead_ = false;
  bool drained_ = false;  // the last recv() returned less than it could take
  bool in_frame_ = false;
  bool peer_gone_ = false;  // the socket hung up: nothing more is held
  // A frame waits (Hold): the staging buffer is not served and the socket not read until Resume.
  std::atomic<bool> held_{false};
  RxTarget target_;
  uint64_t remaining_ = 0;
  RxCursor cursor_;                 // where the next payload byte of the frame goes
  bool buffered_frame_ = false;     // the frame's payload is not read straight into its target
  uint64_t frame_dgram_bytes_ = 0;  // the current frame is a datagram of this many bytes
  uint64_t dgram_consumed_ = 0, dgram_reported_ = 0;  // datagram bytes consumed, and credited
};

namespace {

class LoopbackChannel final : public Channel {
 public:
  LoopbackChannel(Endpoint::Impl& ep, const NodeId& self) : ep_(ep) { peer_id_ = self; }
  void Send(OutFrame&& f) override {
    if (!f.payload_outlives_send) f.OwnPayload();
    bool was_empty;
    {
      std::lock_guard<std::mutex> g(ep_.loop_mu);
      was_empty = ep_.loop_frames.empty();
      ep_.loop_frames.push_back(std::move(f));
      ep_.loop_frames_pending.store(ep_.loop_frames.size(), std::memory_order_relaxed);
    }
    if (was_empty) ep_.Wake();
  }
  bool closed() const override { return false; }
  bool is_loopback() const override { return true; }
  void Abort() override {}

 private:
  Endpoint::Impl& ep_;
};

class WakePollable final : public Pollable {
 public:
  explicit WakePollable(int fd) : fd_(fd) {}
  void OnEvents(uint32_t) override {
    uint64_t v;
    ssize_t r = sys::Read(fd_, &v, sizeof v);
    (void)r;
  }

 private:
  int fd_;
};

class UdpPollable final : public Pollable {
 public:
  explicit UdpPollable(UdpLink& link) : link_(link) {}
  void OnEvents(uint32_t) override { link_.OnReadable(); }

 private:
  UdpLink& link_;
};

class ListenPollable final : public Pollable {
 public:
  explicit ListenPollable(Endpoint::Impl& ep) : ep_(ep) {}
  void OnEvents(uint32_t) override { ep_.AcceptAll(); }

 private:
  Endpoint::Impl& ep_;
};

uint64_t Key(const PeerAddr& a) {
  return uint64_t{a.ip} << 16 | a.port;
}

class ShmListenPollable final : public Pollable {
 public:
  explicit ShmListenPollable(Endpoint::Impl& ep) : ep_(ep) {}
  void OnEvents(uint32_t) override { ep_.AcceptShm(); }

 private:
  Endpoint::Impl& ep_;
};

}  // namespace

bool RegisterPollable(int epfd, int fd, Pollable* p, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = p;
  return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

std::shared_ptr<ServedChannel> Endpoint::Impl::AcceptedFromLocked(uint64_t key) {
  auto it = accepted.find(key);
  if (it == accepted.end()) return nullptr;
  std::shared_ptr<ServedChannel> ch = it->second.lock();
  return ch && !ch->closed() ? ch : nullptr;
}

void Endpoint::Impl::Retire(const std::shared_ptr<ServedChannel>& ch) {
  std::lock_guard<std::mutex> g(mu);
  std::erase_if(outbound, [&](const auto& kv) { return kv.second == ch; });
  std::erase_if(shm_outbound, [&](const auto& kv) { return kv.second == ch; });
  std::erase_if(accepted,
                [&](const auto& kv) { return kv.second.expired() || kv.second.lock() == ch; });
  if (channels.erase(ch)) graveyard.push_back(ch);
}

void Endpoint::Impl::AcceptAll() {
  for (int i = 0; i < 64; ++i) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    int fd = sys::Accept4(listen_fd, SOCK_NONBLOCK | SOCK_CLOEXEC,
                          reinterpret_cast<sockaddr*>(&peer), &len);
    if (fd < 0) return;
    TuneSocket(fd, ntohl(peer.sin_addr.s_addr));
    auto ch = std::make_shared<TcpChannel>(*this, fd);
    {
      std::lock_guard<std::mutex> g(mu);
      channels.insert(ch);
    }
    RegisterPollable(epfd, fd, ch.get(), EPOLLIN | EPOLLOUT);
    ch->Start();
  }
}

void Endpoint::Impl::AcceptShm() {
  for (int i = 0; i < 64; ++i) {
    int fd = sys::Accept4(shm_listen_fd, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    auto ch = ShmChannel::Accept(*this, fd);
    if (!ch) continue;
    {
      std::lock_guard<std::mutex> g(mu);
      channels.insert(ch);
    }
    AddShm(ch);
  }
}

void Endpoint::Impl::AddShm(const std::shared_ptr<ShmChannel>& ch) {
  std::lock_guard g(shm_mu);
  shm.push_back(ch);
  shm_count.store(static_cast<int>(shm.size()), std::memory_order_relaxed);
  shm_generation.store(g_shm_generations.fetch_add(1) + 1, std::memory_order_release);
}

void Endpoint::Impl::RemoveShm(const ShmChannel* ch) {
  std::lock_guard g(shm_mu);
  std::erase_if(shm, [&](const auto& c) { return c.get() == ch; });
  shm_count.store(static_cast<int>(shm.size()), std::memory_order_relaxed);
  shm_generation.store(g_shm_generations.fetch_add(1) + 1, std::memory_order_release);
}

// Every poll of an empty CQ looks here: from the thread's copy of the list, without the two
// atomic instructions of shm_mu (~12 ns a pair on this VM, 10 % of a busy poller's time in
// ib_send_lat, and a message arriving meanwhile waits for the next look).
bool Endpoint::Impl::ShmRxReady() {
  if (shm_count.load(std::memory_order_relaxed) == 0) return false;
  ShmSnapshot& copy = t_shm_snapshot;
  if (copy.owner != this || copy.generation != shm_generation.load(std::memory_order_acquire)) {
    std::lock_guard g(shm_mu);
    copy.channels = shm;
    copy.owner = this;
    copy.generation = shm_generation.load(std::memory_order_relaxed);
  }
  for (const auto& ch : copy.channels)
    if (ch->RxReady()) return true;
  return false;
}

void Endpoint::Impl::DropShmSnapshot() {
  ShmSnapshot& copy = t_shm_snapshot;
  if (copy.owner != this) return;
  copy.channels.clear();
  copy.owner = nullptr;
}

bool Endpoint::Impl::ShmPrepareSleep() {
  if (shm_count.load(std::memory_order_relaxed) == 0) return true;
  std::lock_guard g(shm_mu);
  bool idle = true;
  for (const auto& ch : shm) idle = ch->PrepareSleep() && idle;
  // SENDs peers placed directly are collected at the round's end (FrameSink::OnBatchEnd).
  return idle && !sink.DirectWorkPending();
}

bool Endpoint::Impl::OnProgressThread() const {
  return t_progress_loop == this;
}

void Endpoint::Impl::ShmAwake() {
  if (shm_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard g(shm_mu);
  for (const auto& ch : shm) ch->Awake();
}

// Serves every ring that has records (progress mutex held). The list is copied: serving calls into
// the core, which may open or close channels.
int Endpoint::Impl::ServeShm() {
  if (shm_count.load(std::memory_order_relaxed) == 0) return 0;
  std::vector<std::shared_ptr<ShmChannel>>& ready = shm_ready;  // kept: no allocation per poll
  {
    std::lock_guard g(shm_mu);
    for (const auto& ch : shm)
      if (ch->RxReady()) ready.push_back(ch);
  }
  for (auto& ch : ready) ch->ServeBuffered();
  int n = static_cast<int>(ready.size());
  ready.clear();
  return n;
}

int Endpoint::Impl::DrainLoopback() {
  // A std::deque allocates even when empty: a served poll paid a malloc and a free for nothing.
  if (loop_frames_pending.load(std::memory_order_relaxed) == 0) return 0;
  std::deque<OutFrame> batch;
  {
    std::lock_guard<std::mutex> g(loop_mu);
    batch.swap(loop_frames);
    loop_frames_pending.store(0, std::memory_order_relaxed);
  }
  for (OutFrame& f : batch) {
    RxTarget t;
    sink.OnFrameHeader(*loopback, f.hdr, f.hdr_len, f.payload_len, t, kNoRiderAck);
    RxCursor cursor;
    for (int i = 0; i < f.nseg; ++i)
      cursor.Deliver(t, static_cast<const uint8_t*>(f.seg[i].iov_base), f.seg[i].iov_len);
    sink.OnFrameEnd(*loopback, t);
  }
  return static_cast<int>(batch.size());
}

int Endpoint::Impl::Dispatch(epoll_event* events, int n) {
  int handled = 0;
  for (int i = 0; i < n; ++i) {
    auto* p = static_cast<Pollable*>(events[i].data.ptr);
    p->OnEvents(events[i].events);
    ++handled;
  }
  std::vector<std::shared_ptr<ServedChannel>> again;
  if (rx_pending_any.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> g(rx_pending_mu);
    again.swap(rx_pending);
    rx_pending_any.store(false, std::memory_order_relaxed);
  }
  if (!again.empty()) {
    for (auto& ch : again) {
      if (!ch->closed()) ch->ServeBuffered();
      ++handled;
    }
  }
  handled += ServeShm();
  handled += DrainLoopback();
  sink.OnBatchEnd();
  return handled;
}

void Endpoint::Impl::Loop() {
  t_progress_loop = this;
  pthread_setname_np(pthread_self(), kProgressThreadName);  // ps -L, top -H, gdb show it so
  // The thread sleeps in epoll and runs only to move frames. When the process may (root or
  // CAP_SYS_NICE) it runs at the lowest real-time priority: an application busy-polling memory
  // (ib_write_lat) would otherwise keep its core for a whole time slice while the frame it waits
  // for sits unread (measured: write latency average 108 us without, 22 us with).
  // SOFTRDMA_NO_RT=1 opts out.
  if (!getenv("SOFTRDMA_NO_RT")) {
    sched_param sp{};
    sp.sched_priority = 1;
    pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
  }
  epoll_event events[64];
  while (!stop.load(std::memory_order_acquire)) {
    epoll_event outer[3];
    // Shared-memory producers ring our doorbell only while we say we sleep. While an application
    // thread polls (it reads the rings itself), we do not say so: we only look again when its
    // lease runs out, so that records arriving after its last poll are not left waiting.
    int64_t wait_ns = -1;  // indefinitely
    auto wait_at_most = [&wait_ns](int64_t ns) {
      if (wait_ns < 0 || ns < wait_ns) wait_ns = ns;
    };
    const int64_t now = NowNs();
    if (shm_count.load(std::memory_order_relaxed) > 0) {
      int64_t since = now - shm_polled_ns.load(std::memory_order_relaxed);
      if (since < shm_lease_ns) {
        wait_at_most(shm_lease_ns - since);
        shm_lease_ns = std::min(shm_lease_ns * 2, shm_lease_max_ns);
      } else {
        shm_lease_ns = shm_lease_min_ns;
        parked.store(true);
        if (!ShmPrepareSleep()) wait_at_most(0);  // records waiting: do not sleep
      }
    }
    // A poller holding the socket lease reads the sockets itself; look again when it runs out.
    bool lease_ended = false;
    if (socket_lease.load(std::memory_order_acquire)) {
      int64_t since = now - sockets_polled_ns.load(std::memory_order_relaxed);
      if (since < socket_lease_ns) {
        wait_at_most(socket_lease_ns - since);
        socket_lease_ns = std::min(socket_lease_ns * 2, socket_lease_max_ns);
      } else {
        socket_lease_ns = socket_lease_min_ns;
        lease_ended = EndSocketLease();
        wait_at_most(0);  // serve what the lease left behind now
      }
    }
    if (sockets_unwatched.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> g(claim_mu);
      if (claims == 0) ArmSocketsLocked(true);
      if (sockets_unwatched.load(std::memory_order_relaxed)) wait_at_most(kUnwatchedSocketsNs);
    }
    if (hot_socket_out.load() && !socket_lease.load()) wait_at_most(kUnwatchedSocketsNs);
    timespec wait{wait_ns / 1'000'000'000, wait_ns % 1'000'000'000};
    int woke = WaitForEvents(outer_fd, outer, 3, wait_ns < 0 ? nullptr : &wait);
    if (parked.load(std::memory_order_relaxed)) {
      parked.store(false);
      ShmAwake();
    }
    // Woken only to see whether a poller still holds the sockets, and one does: they are its to
    // read (taking the mutex to look as well stole its frames and made it wake us on unlocking).
    if (woke == 0 && !lease_ended && socket_lease.load(std::memory_order_acquire) &&
        shm_count.load(std::memory_order_relaxed) == 0)
      continue;
    std::lock_guard g(progress_mu);
    for (int i = 0; i < woke; ++i)
      if (outer[i].data.ptr == wake_pollable || outer[i].data.ptr == timer_pollable)
        static_cast<Pollable*>(outer[i].data.ptr)->OnEvents(outer[i].events);
    // A hot socket that cannot go back is read here meanwhile, every kUnwatchedSocketsNs.
    if (hot_socket_out.load() && !socket_lease.load() && !ChangeHotSocket(nullptr))
      ReadHotSocketOut();
    int n = sys::EpollWait(epfd, events, 64, 0);
    if (lease_ended && n > 0) {
      const int64_t at = NowNs();
      const int64_t held = at - socket_lease_taken_ns.load(std::memory_order_relaxed);
      socket_lease_off_until_ns.store(at + socket_lease_pause.AfterStranding(held),
                                      std::memory_order_relaxed);
    }
    Dispatch(events, n < 0 ? 0 : n);
    RunTimers(NowNs());
    graveyard.clear();
  }
}

// Timers run under progress_mu; the timerfd (absolute CLOCK_MONOTONIC) gives them microsecond
// precision, which a deferred ACK needs (epoll timeouts count milliseconds).
void Endpoint::Impl::RunTimers(int64_t now) {
  int64_t next = sink.OnTimers(now);
  // A deadline that moved later needs no new setting while the one armed is still ahead: it fires
  // early once and is set then. Request/response traffic moves its QPs' deadlines with every
  // message, and a timerfd_settime per message cost ib_send_lat a system call each way.
  if (next == armed_deadline || (next > armed_deadline && armed_deadline > now)) return;
  armed_deadline = next;
  itimerspec its{};
  if (next != INT64_MAX) {
    int64_t at = next > 0 ? next : 1;
    its.it_value.tv_sec = at / 1000000000;
    its.it_value.tv_nsec = at % 1000000000;
  }
  timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &its, nullptr);
}

void Endpoint::Impl::Claim() {
  std::lock_guard<std::mutex> g(claim_mu);
  if (claims++ > 0) return;
  // The poller reads the rings itself: producers need not ring. Unless it is about to sleep: the
  // poll that follows an arm must leave the producers asked for the doorbell.
  if (!poller_may_sleep.load(std::memory_order_relaxed)) ShmAwake();
  ArmSocketsLocked(false);
}

// The socket lease takes `epfd` out of `outer_fd` rather than leaving it there disarmed: a nested
// set stays on the wait list of the set it is in, so every segment a peer delivered into one of our
// sockets ran the outer set's wake-up, on the peer's core inside its send (TCP ib_write_lat
// 0.975 of before with this, A/B). Claims around single polls only disarm: adding an epoll set to
// another takes the kernel's global nesting check, and a lease changes hands at most once a
// millisecond.
void Endpoint::Impl::ArmSocketsLocked(bool armed, bool detach) {
  epoll_event ev{};
  ev.events = armed ? uint32_t{EPOLLIN} : 0u;
  ev.data.ptr = nullptr;
  if (sockets_detached) {
    if (!armed) return;                                        // out already
    if (epoll_ctl(outer_fd, EPOLL_CTL_ADD, epfd, &ev) != 0) {  // ENOMEM, ENOSPC (watches)
      sockets_unwatched.store(true, std::memory_order_relaxed);
      return;
    }
    sockets_detached = false;
    sockets_unwatched.store(false, std::memory_order_relaxed);
    return;
  }
  if (!armed && detach && epoll_ctl(outer_fd, EPOLL_CTL_DEL, epfd, nullptr) == 0) {
    sockets_detached = true;
    return;
  }
  epoll_ctl(outer_fd, EPOLL_CTL_MOD, epfd, &ev);
}

void Endpoint::Impl::Release() {
  std::lock_guard<std::mutex> g(claim_mu);
  if (--claims > 0) return;
  ArmSocketsLocked(true);
  // Claim() told the producers not to ring; a parked progress thread must hear them again.
  NoteShmPoll(NowNs());
}

bool Endpoint::Impl::HoldSocketLease(int64_t now) {
  if (poller_may_sleep.load(std::memory_order_relaxed)) return false;  // about to block
  sockets_polled_ns.store(now, std::memory_order_relaxed);
  if (socket_lease.load(std::memory_order_relaxed)) return true;
  if (now < socket_lease_off_until_ns.load(std::memory_order_relaxed)) return false;
  {
    std::lock_guard<std::mutex> g(claim_mu);
    if (socket_lease.load(std::memory_order_relaxed)) return true;
    socket_lease.store(true, std::memory_order_release);
    socket_lease_taken_ns.store(now, std::memory_order_relaxed);
    if (claims++ == 0) ArmSocketsLocked(false, /*detach=*/true);
  }
  Wake();  // the progress thread may sleep without a deadline: it must learn when to end the lease
  return true;
}

bool Endpoint::Impl::EndSocketLease() {
  if (!socket_lease.load(std::memory_order_acquire)) return false;
  {
    std::lock_guard<std::mutex> g(claim_mu);
    if (!socket_lease.load(std::memory_order_relaxed)) return false;
    socket_lease.store(false);
    if (--claims == 0) ArmSocketsLocked(true);
  }
  // The hot socket, out of `epfd`, would wake nobody: the progress thread puts it back.
  if (hot_socket_out.load() && !OnProgressThread()) Wake();
  return true;
}

void Endpoint::Impl::NoteShmPoll(int64_t now) {
  if (shm_count.load(std::memory_order_relaxed) == 0) return;
  // After an arm, a poll that finds nothing is the last look before sleeping: it renews no lease
  // (udpong's replies waited for the lease's end, ~1 ms, in about 1 of 20,000 exchanges).
  if (poller_may_sleep.load(std::memory_order_relaxed)) return;
  shm_polled_ns.store(now, std::memory_order_relaxed);
  if (shm_prompted.load(std::memory_order_relaxed)) {
    if (const ShmSnapshot& copy = t_shm_snapshot; copy.owner == this)
      for (const auto& ch : copy.channels) ch->Polling();
  }
  if (now - shm_seen_told_ns.load(std::memory_order_relaxed) >= kShmSeenStepNs) {
    shm_seen_told_ns.store(now, std::memory_order_relaxed);
    std::lock_guard g(shm_mu);
    for (const auto& ch : shm) {
      ch->Seen(now);
      ch->RingIfUnrungStalled(now);
    }
  }
  if (parked.load() && !ShmPrepareSleep()) Wake();
}

void Endpoint::Impl::CompletionsTaken() {
  PollerActive();
  if (!shm_prompted.load(std::memory_order_relaxed)) return;
  const ShmSnapshot& copy = t_shm_snapshot;
  if (copy.owner != this) return;
  bool waiting = false;
  for (const auto& ch : copy.channels) waiting = ch->Leaving() || waiting;
  // Records that came while we were seen polling rang no doorbell: serve them now, as the poll
  // would have, or have the progress thread serve them (the holder may be past its look).
  if (waiting) ServeHereOrWake();
}

void Endpoint::Impl::ServeHereOrWake() {
  if (!progress_mu.try_lock()) return Wake();
  ServeShm();
  DrainLoopback();
  sink.OnBatchEnd();
  progress_mu.unlock();
}

// Without this, a record published within kShmConsumerIdleNs of the poller's last look rings no
// doorbell and waits up to kShmPollLeaseMaxNs for the progress thread (udpong, which resends what
// is not answered within 1 ms and then hangs on the duplicate answer, hit it within seconds).
void Endpoint::Impl::PollerMaySleep() {
  DropShmSnapshot();  // a thread about to block holds no channel alive
  poller_may_sleep.store(true, std::memory_order_relaxed);
  EndSocketLease();  // the progress thread serves the sockets while the poller blocks
  if (shm_count.load(std::memory_order_relaxed) == 0) return;
  shm_polled_ns.store(0, std::memory_order_relaxed);  // the lease ends with the polling
  if (!ShmPrepareSleep()) Wake();                     // records came meanwhile: serve them now
}

namespace {

// Whether a signal interrupts a blocking read() here: poll() returns EINTR after any handler ran,
// read() only after one installed without SA_RESTART (rping's CQ thread gives up on EINTR; qperf
// ends its timed tests by an alarm and counts on it). Which signal came is not known: EINTR is
// passed on when some handler of the process would interrupt a read.
bool HandlersInterruptReads() {
  for (int sig = 1; sig < NSIG; ++sig) {
    // A fault's handler (ours among them: page_move_guard.h) runs for the faulting thread's own
    // access, never inside a wait.
    if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP ||
        sig == SIGSYS)
      continue;
    struct sigaction sa;
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    // sa_handler and sa_sigaction share their storage: SIG_DFL and SIG_IGN read the same in both.
    const bool handled = sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
    if (handled && !(sa.sa_flags & SA_RESTART)) return true;
  }
  return false;
}

}  // namespace

// The application thread about to block for a completion event waits on the inbound work too. The
// progress thread alone would be woken first, make the completion, and wake this thread: two
// wake-ups in a row, ~15 us each on a VM (ib_send_lat -e, shared memory: 29-37 us one way).
// Woken together, whichever takes progress_mu serves; if that is the progress thread, this thread
// looks for the event it is about to raise rather than sleep into a second wake-up.
int Endpoint::Impl::WaitAlongside(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_NONBLOCK)) return 0;  // the read answers at once
  if (alongside_taken.exchange(true, std::memory_order_acquire)) return 0;
  struct Leave {
    std::atomic<bool>& taken;
    ~Leave() { taken.store(false, std::memory_order_release); }
  } leave{alongside_taken};
  bool again = false;  // serve once more before sleeping
  for (int rounds = 0;; ++rounds) {
    pollfd p[2] = {{fd, POLLIN, 0}, {epfd, POLLIN, 0}};
    const nfds_t n = rounds < kAlongsideRoundsMax ? 2 : 1;
    if ((again ? sys::PollNow(p, n) : poll(p, n, -1)) < 0) {
      const int e = errno;
      if (e == EINTR && !HandlersInterruptReads()) continue;
      return e;
    }
    if (p[0].revents) return 0;
    if (n == 1) {  // the rest is the progress thread's, and what the last round left undone
      if (again) Wake();
      again = false;
      continue;
    }
    if (progress_mu.try_lock()) {  // what a round brings may be for other channels only
      ServeRoundLocked();
      // A producer rings once per sleep its consumer declares. The progress thread may sleep on
      // through the doorbell this round read, and so declare nothing: this thread declares it,
      // as the progress thread does before it sleeps (without, rping hung within seconds).
      again = !ShmPrepareSleep();
      progress_mu.unlock();
      continue;
    }
    again = false;
    const int64_t until = NowNs() + kAlongsideSpinNs;
    pollfd q{fd, POLLIN, 0};
    while (sys::PollNow(&q, 1) == 0 && NowNs() < until) SpinPause();
    if (q.revents) return 0;
  }
}

bool Endpoint::Impl::PollOnce(bool wait) {
  if (!wait && shm_count.load(std::memory_order_relaxed) > 0) {
    // Records in a ring are found without a system call; serve them before asking epoll.
    bool ready = ShmRxReady();
    if (ready && progress_mu.try_lock()) {
      int handled = ServeShm();
      handled += DrainLoopback();
      sink.OnBatchEnd();
      const int64_t now = NowNs();  // after the work: the poll that follows may be µs away
      poll_clock_ns.store(now, std::memory_order_relaxed);
      RunTimers(now);
      progress_mu.unlock();
      if (handled > 0) PollerActive();
      NoteShmPoll(now);
      return handled > 0;
    }
    const int64_t now = EmptyPollNowNs();
    NoteShmPoll(now);
    if (ready) return false;
    // Sockets are asked only now and then: even the one system call of an empty look would delay
    // the next record, and the progress thread, whose epoll set stays armed meanwhile, serves the
    // sockets anyway.
    if (now - sockets_polled_ns.load(std::memory_order_relaxed) < kSocketPollIntervalNs &&
        loop_frames_pending.load(std::memory_order_relaxed) == 0)
      return false;
    sockets_polled_ns.store(now, std::memory_order_relaxed);
  }
  if (!wait && shm_count.load(std::memory_order_relaxed) == 0 && HoldSocketLease(NowNs())) {
    bool r = PollOnceLeased();
    if (r) PollerActive();
    return r;
  }
  if (!wait) {
    // Most polls of an empty CQ find nothing: ask epoll first, without claiming (two epoll_ctl: a
    // shm ping-pong paid them every 20 us, 9 % of ib_send_lat's time) or locking (a busy poller
    // would keep the progress thread waiting on the mutex, two context switches each time). The
    // answer is only a hint: events are fetched again under the mutex, since a channel it names
    // may be gone by then.
    epoll_event hint;
    if (sys::EpollWait(epfd, &hint, 1, 0) <= 0 &&
        loop_frames_pending.load(std::memory_order_relaxed) == 0)
      return false;
    Claim();
    bool r = PollOnceClaimed();
    if (r) PollerActive();
    Release();
    return r;
  }
  std::lock_guard g(progress_mu);
  return ServeRoundLocked() > 0;
}

int Endpoint::Impl::ServeRoundLocked() {
  epoll_event events[64];
  int handled = ReadHotSocketOut();
  int n = sys::EpollWait(epfd, events, 64, 0);
  handled += Dispatch(events, n < 0 ? 0 : n);
  RunTimers(NowNs());
  return handled;
}

// Under the socket lease the progress thread stays off the sockets until the lease ends (at most
// once a millisecond): the poller may hold the mutex for its epoll_wait and ask only once (the
// claimed poll's lock-free hint and second look cost a system call more per message).
//
// When the last answer from epoll was one connection, the polls that follow read that connection
// directly and ask epoll only every kHotSocketPollsPerEpoll-th time: a message then costs the
// poller one system call, not epoll_wait and recv.
bool Endpoint::Impl::PollOnceLeased() {
  if (!progress_mu.try_lock()) return false;
  int handled = 0;
  if (hot_socket && hot_socket->closed()) hot_socket.reset();
  if (hot_socket && ++hot_socket_polls < kHotSocketPollsPerEpoll &&
      loop_frames_pending.load(std::memory_order_relaxed) == 0) {
    handled = hot_socket->ReadNow();
    if (handled > 0) sink.OnBatchEnd();
  } else {
    hot_socket_polls = 0;
    epoll_event events[64];
    int n = sys::EpollWait(epfd, events, 64, 0);
    ServedChannel* only = nullptr;
    if (n == 1) only = static_cast<Pollable*>(events[0].data.ptr)->socket_channel();
    // A hot socket out of `epfd` is not in epoll's answer: it is read here, and a quiet one stays
    // the hot socket until another connection alone has something.
    ServedChannel* out =
        hot_socket_out.load(std::memory_order_relaxed) ? hot_socket.get() : nullptr;
    if (only != hot_socket.get() && (n > 0 || !out)) ChangeHotSocket(only);
    handled = out && out == hot_socket.get() ? out->ReadNow() : 0;
    if (n > 0 || loop_frames_pending.load(std::memory_order_relaxed) != 0)
      handled += Dispatch(events, n < 0 ? 0 : n);
    else if (handled > 0)
      sink.OnBatchEnd();
  }
  // Timers run after the work, in the next empty poll: TCP ib_write_lat's reply waited for them.
  if (handled > 0 ? ++leased_rounds_without_timers >= kLeasedRoundsPerTimerPass
                  : leased_rounds_without_timers > 0) {
    leased_rounds_without_timers = 0;
    RunTimers(NowNs());
  }
  progress_mu.unlock();
  return handled > 0;
}

bool Endpoint::Impl::ChangeHotSocket(ServedChannel* next) {
  if (hot_socket && !hot_socket->ReturnToSet()) return false;
  hot_socket_out.store(false, std::memory_order_relaxed);
  hot_socket = next ? std::static_pointer_cast<ServedChannel>(next->shared_from_this()) : nullptr;
  // Only under the lease: whoever ends it has the progress thread hand the socket back
  // (EndSocketLease, Loop). The lease may end meanwhile, seen by one of us at least (both sides
  // store, then load, sequentially consistent): then it comes back at once.
  if (!hot_socket || !socket_lease.load() || !hot_socket->LeaveSet()) return true;
  hot_socket_out.store(true);
  if (!socket_lease.load() && hot_socket->ReturnToSet()) hot_socket_out.store(false);
  return true;
}

int Endpoint::Impl::ReadHotSocketOut() {
  return hot_socket_out.load(std::memory_order_relaxed) && hot_socket ? hot_socket->ReadNow() : 0;
}

bool Endpoint::Impl::PollOnceClaimed() {
  if (!progress_mu.try_lock()) return false;
  epoll_event events[64];
  int handled = ReadHotSocketOut();
  int n = sys::EpollWait(epfd, events, 64, 0);
  handled += Dispatch(events, n < 0 ? 0 : n);
  RunTimers(NowNs());
  // The graveyard is emptied by the progress thread only, after its own Dispatch: it may be
  // waiting for progress_mu with events from an epoll_wait made before these channels closed, and
  // freeing them here made it call into freed channels (ASan heap-use-after-free,
  // hostile_peer_test with --gtest_repeat under load).
  progress_mu.unlock();
  return handled > 0;
}

std::unique_ptr<Endpoint> Endpoint::Start(FrameSink& sink, const IdentityFn& identity,
                                          std::string* err) {
  std::unique_ptr<Endpoint> ep(new Endpoint());
  ep->impl_ = std::make_unique<Impl>(sink, NodeId{});
  Impl& im = *ep->impl_;
  im.epfd = epoll_create1(EPOLL_CLOEXEC);
  im.outer_fd = epoll_create1(EPOLL_CLOEXEC);
  im.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  im.timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (im.epfd < 0 || im.outer_fd < 0 || im.wake_fd < 0 || im.timer_fd < 0) {
    *err = std::string("epoll/eventfd: ") + strerror(errno);
    return nullptr;
  }
  // TCP and UDP share one port number, so a GID names both. A port whose UDP twin is taken is
  // given back and another one tried.
  for (int attempt = 0; attempt < 32 && !im.udp; ++attempt) {
    if (im.listen_fd >= 0) close(im.listen_fd);
    im.listen_fd = sys::OwnSocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (im.listen_fd < 0 || bind(im.listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(im.listen_fd, 1024) != 0) {
      *err = std::string("listen: ") + strerror(errno);
      return nullptr;
    }
    socklen_t len = sizeof a;
    getsockname(im.listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    ep->port_ = ntohs(a.sin_port);
    im.udp = UdpLink::Bind(ep->port_, sink, err);
  }
  if (!im.udp) return nullptr;
  // Known before any connection can exist: peers learn the port only from what identity() does.
  std::optional<NodeId> self = identity(ep->port_);
  if (!self) return nullptr;
  im.self = *self;

  auto* wake =
      new WakePollable(im.wake_fd);  // lives as long as the process: the loop may race exit
  auto* listen = new ListenPollable(im);
  im.wake_pollable = wake;
  RegisterPollable(im.outer_fd, im.wake_fd, wake, EPOLLIN);
  RegisterPollable(im.outer_fd, im.epfd, nullptr, EPOLLIN);
  im.timer_pollable = new WakePollable(im.timer_fd);  // reading clears the expiry count
  RegisterPollable(im.outer_fd, im.timer_fd, im.timer_pollable, EPOLLIN);
  RegisterPollable(im.epfd, im.listen_fd, listen, EPOLLIN);
  im.listen_pollable = listen;
  im.udp_pollable = new UdpPollable(*im.udp);
  RegisterPollable(im.epfd, im.udp->fd(), im.udp_pollable, EPOLLIN);
  // Same-host peers of the same user reach us through shared memory (SOFTRDMA_LINK=tcp: never).
  const char* link = getenv("SOFTRDMA_LINK");
  if (!link || std::strcmp(link, "tcp") != 0) {
    im.shm_listen_fd = ShmChannel::Listen(ep->port_);
    if (im.shm_listen_fd >= 0) {
      im.shm_listen_pollable = new ShmListenPollable(im);
      RegisterPollable(im.epfd, im.shm_listen_fd, im.shm_listen_pollable, EPOLLIN);
      im.shm_enabled = true;
    }
  }
  im.port = ep->port_;
  im.loopback = std::make_shared<LoopbackChannel>(im, im.self);
  ep->loopback_ = im.loopback;
  im.thread = StartRunningThread([&im] { im.Loop(); });
  return ep;
}

std::shared_ptr<Channel> Endpoint::Connect(const PeerAddr& peer, bool lazy) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> g(im.mu);
  auto it = im.outbound.find(Key(peer));
  if (it != im.outbound.end() && !it->second->closed()) return it->second;
  if (std::shared_ptr<ServedChannel> twin = im.AcceptedFromLocked(Key(peer))) {
    im.outbound[Key(peer)] = twin;
    return twin;
  }
  auto ch = std::make_shared<TcpChannel>(im, peer);  // connects at its first frame (Settle)
  im.outbound[Key(peer)] = ch;
  if (lazy) return ch;
  std::shared_ptr<Channel> opened = ch->SettleLocked();
  if (!opened->closed()) return opened;
  im.outbound.erase(Key(peer));
  return nullptr;
}

std::shared_ptr<Channel> Endpoint::ConnectShm(uint16_t port) {
  Impl& im = *impl_;
  if (!im.shm_enabled) return nullptr;
  {
    std::lock_guard<std::mutex> g(im.mu);
    auto it = im.shm_outbound.find(port);
    if (it != im.shm_outbound.end() && !it->second->closed()) return it->second;
  }
  // Opened without the lock: it waits briefly for the peer's answer, which our own progress
  // thread may need the lock to let through (the peer may be connecting to us at the same time).
  auto ch = ShmChannel::Connect(im, port);
  if (!ch) return nullptr;
  std::lock_guard<std::mutex> g(im.mu);
  auto it = im.shm_outbound.find(port);
  if (it != im.shm_outbound.end() && !it->second->closed()) return it->second;  // a racing twin
  im.channels.insert(ch);
  im.shm_outbound[port] = ch;
  RegisterPollable(im.epfd, ch->fd(), ch.get(), EPOLLIN | EPOLLRDHUP);
  im.AddShm(ch);
  return ch;
}

void Endpoint::Wake() {
  impl_->Wake();
}

bool Endpoint::OnProgressThread() const {
  return impl_->OnProgressThread();
}

void Endpoint::SecureQueuedPayloads() {
  Impl& im = *impl_;
  std::vector<std::shared_ptr<ServedChannel>> all;
  {
    std::lock_guard<std::mutex> g(im.mu);
    all.assign(im.channels.begin(), im.channels.end());
  }
  for (auto& ch : all) ch->OwnQueuedPayloads();
  std::lock_guard<std::mutex> g(im.loop_mu);
  for (OutFrame& f : im.loop_frames) f.OwnPayload();
}

bool Endpoint::WaitTxIdle(int64_t max_ns) {
  Impl& im = *impl_;
  const int64_t start = NowNs();
  for (;;) {
    std::vector<std::shared_ptr<ServedChannel>> all;
    {
      std::lock_guard<std::mutex> g(im.mu);
      all.assign(im.channels.begin(), im.channels.end());
    }
    bool pending = false;
    for (auto& ch : all) pending = pending || ch->TxPending();
    if (!pending) return true;
    if (NowNs() - start > max_ns) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::shared_ptr<Channel> Endpoint::Datagram(const PeerAddr& peer) {
  return impl_->udp->To(peer);
}

bool Endpoint::PollOnce(bool wait) {
  return impl_->PollOnce(wait);
}

void Endpoint::CompletionsTaken() {
  impl_->CompletionsTaken();
}

void Endpoint::PollerMaySleep() {
  impl_->PollerMaySleep();
}

int Endpoint::WaitAlongside(int fd) {
  return impl_->WaitAlongside(fd);
}

void Endpoint::Abandon() {
  // The child of fork() has no progress thread; leak the parent's state rather than close sockets
  // the parent still uses (closing a copy is harmless, but shutdown() would not be).
  if (impl_->thread.joinable()) impl_->thread.detach();
  KeepOnPurpose(impl_.release());
}

void Endpoint::HoldForFork() {
  impl_->progress_mu.lock();
}

void Endpoint::ResumeAfterFork() {
  impl_->progress_mu.unlock();
}

Endpoint::~Endpoint() {
  if (!impl_) return;
  impl_->stop.store(true, std::memory_order_release);
  impl_->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->DropShmSnapshot();  // other threads' copies go with their next poll or their end
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->outbound.clear();
    impl_->channels.clear();
  }
  close(impl_->listen_fd);
  if (impl_->shm_listen_fd >= 0) close(impl_->shm_listen_fd);
  close(impl_->wake_fd);
  close(impl_->epfd);
  close(impl_->outer_fd);
  close(impl_->timer_fd);
}

}  // namespace softrdma::link
