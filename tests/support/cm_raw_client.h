// A CM peer without librdmacm, for the suites that feed the CM service what no softrdma process
// sends: wire messages built by hand (src/cm/cm_wire.h) on a plain TCP socket.
#pragma once

#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "cm/cm_wire.h"
#include "support/cm_harness.h"

namespace cmtest {

namespace wire = softrdma::cm;

inline void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
inline uint32_t Get32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

inline std::vector<uint8_t> Header(wire::MsgType type, size_t len, uint32_t sender,
                                   uint32_t receiver) {
  std::vector<uint8_t> m(sizeof(wire::MsgHeader), 0);
  auto* h = reinterpret_cast<wire::MsgHeader*>(m.data());
  h->version = wire::kCmWireVersion;
  h->type = static_cast<uint8_t>(type);
  Put16(h->length, static_cast<uint16_t>(len));
  Put32(h->sender_id, sender);
  Put32(h->receiver_id, receiver);
  return m;
}

inline std::vector<uint8_t> Hello() {
  auto m = Header(wire::MsgType::kHello, sizeof(wire::MsgHeader) + sizeof(wire::HelloBody), 0, 0);
  wire::HelloBody b{};
  Put32(b.magic, wire::kCmMagic);
  auto* p = reinterpret_cast<uint8_t*>(&b);
  m.insert(m.end(), p, p + sizeof b);
  return m;
}

inline void PutLoopback4(wire::WireAddr* a, uint16_t port) {
  a->family = 4;
  Put16(a->port, port);
  static const uint8_t kMapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  std::memcpy(a->ip, kMapped, 16);
}

// A REQ for 127.0.0.1:`port` in RDMA_PS_TCP from "QP" `qpn`.
inline std::vector<uint8_t> Req(uint32_t sender, uint16_t port, uint8_t resp, uint8_t init,
                                uint8_t declared_private = 0, size_t actual_private = 0) {
  size_t len = sizeof(wire::MsgHeader) + sizeof(wire::ReqBody) + actual_private;
  auto m = Header(wire::MsgType::kReq, len, sender, 0);
  wire::ReqBody b{};
  Put16(b.port_space, RDMA_PS_TCP);
  b.qp_type = IBV_QPT_RC;
  PutLoopback4(&b.src, 40000);
  PutLoopback4(&b.dst, port);
  Put32(b.end.qpn, 0x1234);
  Put32(b.end.psn, 0x777);
  b.end.responder_resources = resp;
  b.end.initiator_depth = init;
  b.end.flow_control = 1;
  b.retry_count = 7;
  b.end.rnr_retry_count = 7;
  b.end.private_data_len = declared_private;
  auto* p = reinterpret_cast<uint8_t*>(&b);
  m.insert(m.end(), p, p + sizeof b);
  m.insert(m.end(), actual_private, 0x5a);
  return m;
}

// Bytes that are no CM message (their header's version and length are nonsense).
inline std::vector<uint8_t> Garbage(size_t n = 300) {
  std::vector<uint8_t> junk(n);
  for (size_t i = 0; i < n; ++i) junk[i] = static_cast<uint8_t>(i * 131 + 17);
  return junk;
}

class RawClient {
 public:
  explicit RawClient(uint16_t service_port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage a = Ip("127.0.0.1", service_port);
    if (fd_ >= 0 && connect(fd_, Sa(&a), sizeof(sockaddr_in)) != 0) {
      close(fd_);
      fd_ = -1;
    }
    int one = 1;
    if (fd_ >= 0) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool Send(const std::vector<uint8_t>& m) {
    return ::send(fd_, m.data(), m.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(m.size());
  }
  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }

  // Reads one whole message within `timeout` (false at EOF or timeout).
  bool ReadMessage(std::vector<uint8_t>* out, milliseconds timeout = kWait) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (rx_.size() >= sizeof(wire::MsgHeader)) {
        size_t len = size_t(rx_[2]) << 8 | rx_[3];
        if (len >= sizeof(wire::MsgHeader) && rx_.size() >= len) {
          out->assign(rx_.begin(), rx_.begin() + static_cast<ptrdiff_t>(len));
          rx_.erase(rx_.begin(), rx_.begin() + static_cast<ptrdiff_t>(len));
          return true;
        }
      }
      if (!Fill(deadline)) return false;
    }
  }

  // True when the service closes the channel within `timeout` (whatever it sent before).
  bool ClosedByPeer(milliseconds timeout = kWait) {
    auto deadline = Clock::now() + timeout;
    while (Fill(deadline)) {
    }
    return eof_;
  }

 private:
  bool Fill(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !Readable(fd_, left)) return false;
    uint8_t buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;  // orderly close or reset
      return false;
    }
    rx_.insert(rx_.end(), buf, buf + n);
    return true;
  }

  int fd_ = -1;
  bool eof_ = false;
  std::vector<uint8_t> rx_;
};

}  // namespace cmtest
