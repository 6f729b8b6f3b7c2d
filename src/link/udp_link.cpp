#include "link/udp_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "link/frame_codec.h"
#include "link/own_socket.h"
#include "link/placement_guard.h"
#include "link/plain_syscall.h"

namespace softrdma::link {
namespace {

constexpr size_t kMaxDatagram = 65536;
constexpr int kBatch = 16;
constexpr int kSocketBuffer = 8 << 20;

class UdpChannel final : public Channel {
 public:
  UdpChannel(int fd, const PeerAddr& peer) : fd_(fd) {
    addr_.sin_family = AF_INET;
    addr_.sin_addr.s_addr = htonl(peer.ip);
    addr_.sin_port = htons(peer.port);
  }
  // Datagrams are sent at once or lost, as unreliable datagrams may be.
  void Send(OutFrame&& f) override {
    uint8_t head[sizeof(LinkHeader) + kMaxHeaderBytes];
    EncodeLinkHeader(head, f.hdr_len, f.payload_len);
    std::memcpy(head + sizeof(LinkHeader), f.hdr, f.hdr_len);
    iovec iov[kMaxSegs + 1];
    iov[0] = iovec{head, sizeof(LinkHeader) + f.hdr_len};
    for (int i = 0; i < f.nseg; ++i) iov[i + 1] = f.seg[i];
    msghdr msg{};
    msg.msg_name = &addr_;
    msg.msg_namelen = sizeof addr_;
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(f.nseg + 1);
    while (sys::SendMsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
  }
  bool closed() const override { return false; }
  bool is_loopback() const override { return false; }
  bool is_datagram() const override { return true; }
  void Abort() override {}

 private:
  int fd_;
  sockaddr_in addr_{};
};

// Where inbound datagrams come from as far as the sink is concerned: replies are not possible on
// a connectionless link, so anything sent back is dropped.
class InboundChannel final : public Channel {
 public:
  void Send(OutFrame&&) override {}
  bool closed() const override { return false; }
  bool is_loopback() const override { return false; }
  bool is_datagram() const override { return true; }
  void Abort() override {}
};

}  // namespace

std::unique_ptr<UdpLink> UdpLink::Bind(uint16_t port, FrameSink& sink, std::string* err) {
  int fd = sys::OwnSocket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = std::string("udp socket: ") + strerror(errno);
    return nullptr;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    *err = std::string("udp bind: ") + strerror(errno);
    close(fd);
    return nullptr;
  }
  // Bursts of datagrams must not overflow the default buffers; the forced variants need
  // CAP_NET_ADMIN and quietly fall back to the unprivileged limit.
  int size = kSocketBuffer;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  std::unique_ptr<UdpLink> link(new UdpLink(fd, sink));
  link->inbound_ = std::make_shared<InboundChannel>();
  return link;
}

UdpLink::~UdpLink() {
  close(fd_);
}

std::shared_ptr<Channel> UdpLink::To(const PeerAddr& peer) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t key = uint64_t{peer.ip} << 16 | peer.port;
  auto& ch = peers_[key];
  if (!ch) ch = std::make_shared<UdpChannel>(fd_, peer);
  return ch;
}

void UdpLink::OnReadable() {
  static thread_local std::unique_ptr<uint8_t[]> buf(new uint8_t[kBatch * kMaxDatagram]);
  mmsghdr msgs[kBatch];
  iovec iov[kBatch];
  for (int i = 0; i < kBatch; ++i) {
    iov[i] = iovec{buf.get() + size_t(i) * kMaxDatagram, kMaxDatagram};
    msgs[i] = mmsghdr{};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  int n = sys::RecvMmsg(fd_, msgs, kBatch, MSG_DONTWAIT);
  for (int i = 0; i < n; ++i) {
    const uint8_t* p = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t len = msgs[i].msg_len;
    DecodedHeader h;
    if (len < sizeof(LinkHeader) || !DecodeLinkHeader(p, &h) ||
        (h.flags & (kLinkFlagCredit | kLinkFlagAck)) ||
        sizeof(LinkHeader) + h.hdr_len + h.payload_len != len) {
      ++dropped_;
      continue;
    }
    const uint8_t* hdr = p + sizeof(LinkHeader);
    const uint8_t* payload = hdr + h.hdr_len;
    RxTarget t;
    sink_.OnFrameHeader(*inbound_, hdr, h.hdr_len, h.payload_len, t, kNoRiderAck);
    size_t left = h.payload_len;
    for (int s = 0; s < t.nseg && left > 0; ++s) {
      size_t c = t.seg[s].iov_len < left ? t.seg[s].iov_len : left;
      if (!PlaceGuarded(t.seg[s].iov_base, payload, c)) t.refused = true;
      payload += c;
      left -= c;
    }
    sink_.OnFrameEnd(*inbound_, t);
  }
}

}  // namespace softrdma::link
