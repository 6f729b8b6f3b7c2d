// The UDP link: one datagram per frame, no connection, no retransmission. It carries UD traffic
// when chosen (SOFTRDMA_UD_LINK=udp) and, later, multicast. Frames use the same link header as
// TCP; a datagram whose length disagrees with its header is dropped.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "link/link.h"

namespace softrdma::link {

class UdpLink {
 public:
  // Binds 0.0.0.0:port. nullptr (and *err) when the port is taken.
  static std::unique_ptr<UdpLink> Bind(uint16_t port, FrameSink& sink, std::string* err);
  ~UdpLink();

  int fd() const { return fd_; }
  // A channel whose frames go to `peer` as datagrams.
  std::shared_ptr<Channel> To(const PeerAddr& peer);
  // Reads the datagrams waiting now (bounded batch). Caller holds the endpoint's progress mutex.
  void OnReadable();
  uint64_t dropped() const { return dropped_; }

 private:
  UdpLink(int fd, FrameSink& sink) : fd_(fd), sink_(sink) {}
  int fd_;
  FrameSink& sink_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Channel>> peers_;
  std::shared_ptr<Channel> inbound_;
  uint64_t dropped_ = 0;
};

}  // namespace softrdma::link
