// rsockets (rsocket(7)) through the public librdmacm calls, both ends in this process: stream
// connect/accept/transfer/EOF, non-blocking EAGAIN, rpoll readiness (mixed with a pipe), shutdown,
// riomap/riowrite, options, and the errno of bad arguments. Every wait is bounded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A listener on 127.0.0.1 (ephemeral port) and one connected pair.
class Rsocket : public ::testing::Test {
 protected:
  void SetUp() override {
    lfd_ = rsocket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(lfd_, 0) << strerror(errno);
    sockaddr_in a = Loopback(0);
    ASSERT_EQ(rbind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
    ASSERT_EQ(rlisten(lfd_, 4), 0) << strerror(errno);
    socklen_t len = sizeof addr_;
    ASSERT_EQ(rgetsockname(lfd_, reinterpret_cast<sockaddr*>(&addr_), &len), 0);
    ASSERT_NE(addr_.sin_port, 0);
  }
  void TearDown() override {
    if (cfd_ >= 0) rclose(cfd_);
    if (sfd_ >= 0) rclose(sfd_);
    if (lfd_ >= 0) rclose(lfd_);
  }

  // Connects cfd_ to the listener and accepts sfd_.
  void Connect() {
    std::atomic<int> result{1};
    std::thread t([&] {
      cfd_ = rsocket(AF_INET, SOCK_STREAM, 0);
      result = rconnect(cfd_, reinterpret_cast<sockaddr*>(&addr_), sizeof addr_) ? errno : 0;
    });
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    sfd_ = raccept(lfd_, reinterpret_cast<sockaddr*>(&peer), &len);
    t.join();
    ASSERT_EQ(result.load(), 0) << strerror(result.load());
    ASSERT_GE(sfd_, 0) << strerror(errno);
    EXPECT_EQ(peer.sin_family, AF_INET);
    EXPECT_EQ(len, sizeof peer);
  }

  // Reads exactly n bytes (blocking socket).
  void ReadAll(int fd, uint8_t* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = rrecv(fd, p + got, n - got, 0);
      ASSERT_GT(r, 0) << "after " << got << ": " << strerror(errno);
      got += static_cast<size_t>(r);
    }
  }

  int lfd_ = -1;
  int cfd_ = -1;
  int sfd_ = -1;
  sockaddr_in addr_{};
};

TEST_F(Rsocket, TransfersAStreamAndEndsWithEof) {
  Connect();
  constexpr size_t kLen = 3 * 1024 * 1024 + 17;  // several rings' worth, odd size
  std::vector<uint8_t> out(kLen), in(kLen);
  for (size_t i = 0; i < kLen; ++i) out[i] = static_cast<uint8_t>(i * 7 + i / 251);
  std::thread writer([&] {
    size_t sent = 0;
    while (sent < kLen) {
      size_t chunk = std::min<size_t>(kLen - sent, 100000);
      ssize_t r = rsend(cfd_, out.data() + sent, chunk, 0);
      if (r <= 0) break;
      sent += static_cast<size_t>(r);
    }
    rshutdown(cfd_, SHUT_WR);
  });
  ReadAll(sfd_, in.data(), kLen);
  writer.join();
  EXPECT_EQ(in, out);
  uint8_t b;
  EXPECT_EQ(rrecv(sfd_, &b, 1, 0), 0);  // EOF after the writer's shutdown
  EXPECT_EQ(rrecv(sfd_, &b, 1, 0), 0);  // and it stays at EOF
  // The half-closed side still receives.
  ASSERT_EQ(rsend(sfd_, "x", 1, 0), 1);
  ASSERT_EQ(rrecv(cfd_, &b, 1, 0), 1);
  EXPECT_EQ(b, 'x');
  errno = 0;
  EXPECT_EQ(rsend(cfd_, "y", 1, 0), -1);
  EXPECT_EQ(errno, EPIPE);
}

TEST_F(Rsocket, ReadvWritevAndMsgCalls) {
  Connect();
  char a[] = "hello ", b[] = "world";
  iovec iov[2] = {{a, 6}, {b, 5}};
  ASSERT_EQ(rwritev(cfd_, iov, 2), 11);
  char x[4] = {}, y[7] = {};
  iovec riov[2] = {{x, 4}, {y, 7}};
  msghdr m{};
  m.msg_iov = riov;
  m.msg_iovlen = 2;
  ssize_t got = 0;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (got < 11 && Clock::now() < deadline) {
    ssize_t r = rrecvmsg(sfd_, &m, MSG_WAITALL);
    ASSERT_GT(r, 0);
    got += r;
  }
  EXPECT_EQ(std::string(x, 4) + std::string(y, 7), "hello world");
  ASSERT_EQ(rwrite(sfd_, "ok", 2), 2);
  char z[2];
  ASSERT_EQ(rread(cfd_, z, 2), 2);
  EXPECT_EQ(std::memcmp(z, "ok", 2), 0);
}

TEST_F(Rsocket, PeerCloseGivesEofAfterTheData) {
  Connect();
  ASSERT_EQ(rsend(cfd_, "bye", 3, 0), 3);
  ASSERT_EQ(rclose(cfd_), 0);
  cfd_ = -1;
  char b[8];
  uint8_t* p = reinterpret_cast<uint8_t*>(b);
  ReadAll(sfd_, p, 3);
  EXPECT_EQ(std::memcmp(b, "bye", 3), 0);
  EXPECT_EQ(rrecv(sfd_, b, sizeof b, 0), 0);
}

TEST_F(Rsocket, NonBlockingCallsSayEagain) {
  ASSERT_EQ(rfcntl(lfd_, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(rfcntl(lfd_, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
  errno = 0;
  EXPECT_EQ(raccept(lfd_, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(rfcntl(lfd_, F_SETFL, 0), 0);
  Connect();
  char b[16];
  errno = 0;
  EXPECT_EQ(rrecv(sfd_, b, sizeof b, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  // A sender whose peer does not read fills the peer's ring, then gets a partial write and EAGAIN.
  ASSERT_EQ(rfcntl(cfd_, F_SETFL, O_NONBLOCK), 0);
  std::vector<uint8_t> big(64 * 1024, 0x5a);
  size_t total = 0;
  bool eagain = false;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!eagain && Clock::now() < deadline) {
    ssize_t r = rsend(cfd_, big.data(), big.size(), 0);
    if (r < 0) {
      ASSERT_EQ(errno, EAGAIN);
      eagain = true;
    } else {
      total += static_cast<size_t>(r);
    }
  }
  EXPECT_TRUE(eagain);
  EXPECT_GT(total, 0u);
  // Draining the receiver lets the sender go on.
  std::vector<uint8_t> sink(total);
  ReadAll(sfd_, sink.data(), total);
  pollfd p{cfd_, POLLOUT, 0};
  EXPECT_EQ(rpoll(&p, 1, 5000), 1);
  EXPECT_TRUE(p.revents & POLLOUT);
}

TEST_F(Rsocket, PollReportsReadinessOnMixedFds) {
  Connect();
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pollfd fds[2] = {{sfd_, POLLIN, 0}, {pipefd[0], POLLIN, 0}};
  EXPECT_EQ(rpoll(fds, 2, 50), 0);  // nothing yet: times out
  pollfd out{cfd_, POLLOUT, 0};
  EXPECT_EQ(rpoll(&out, 1, 1000), 1);
  EXPECT_EQ(out.revents, POLLOUT);
  ASSERT_EQ(write(pipefd[1], "p", 1), 1);
  EXPECT_EQ(rpoll(fds, 2, 1000), 1);
  EXPECT_EQ(fds[0].revents, 0);
  EXPECT_EQ(fds[1].revents, POLLIN);
  char c;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  // Data sent later wakes a poll that is already sleeping.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rsend(cfd_, "r", 1, 0);
  });
  auto t0 = Clock::now();
  EXPECT_EQ(rpoll(fds, 2, 5000), 1);
  late.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(fds[0].revents, POLLIN);
  // rselect agrees.
  fd_set r;
  FD_ZERO(&r);
  FD_SET(sfd_, &r);
  timeval tv{1, 0};
  EXPECT_EQ(rselect(sfd_ + 1, &r, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(sfd_, &r));
  // The peer's close makes the socket readable (EOF).
  ASSERT_EQ(rrecv(sfd_, &c, 1, 0), 1);
  rclose(cfd_);
  cfd_ = -1;
  pollfd in{sfd_, POLLIN, 0};
  EXPECT_EQ(rpoll(&in, 1, 5000), 1);
  EXPECT_TRUE(in.revents & (POLLIN | POLLHUP));
  EXPECT_EQ(rrecv(sfd_, &c, 1, 0), 0);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST_F(Rsocket, IoMapTakesRemoteWrites) {
  Connect();
  std::vector<uint8_t> target(8192, 0);
  off_t off = riomap(sfd_, target.data(), target.size(), PROT_WRITE, 0, -1);
  ASSERT_GE(off, 0) << strerror(errno);
  // The mapping travels in order with the stream: once this byte arrives, the peer knows it.
  ASSERT_EQ(rsend(sfd_, "m", 1, 0), 1);
  char c;
  ASSERT_EQ(rrecv(cfd_, &c, 1, 0), 1);
  std::vector<uint8_t> src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i ^ 0x3c);
  size_t w = riowrite(cfd_, src.data(), src.size(), off + 100, 0);
  ASSERT_EQ(w, src.size()) << strerror(errno);
  // Data written after the iomap write arrives after it.
  ASSERT_EQ(rsend(cfd_, "d", 1, 0), 1);
  ASSERT_EQ(rrecv(sfd_, &c, 1, 0), 1);
  EXPECT_EQ(std::memcmp(target.data() + 100, src.data(), src.size()), 0);
  EXPECT_EQ(target[99], 0);
  // Outside every mapping: EINVAL.
  errno = 0;
  EXPECT_EQ(riowrite(cfd_, src.data(), 16, off + 100000, 0), static_cast<size_t>(-1));
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(riounmap(sfd_, target.data(), target.size()), 0);
  errno = 0;
  EXPECT_EQ(riounmap(sfd_, target.data(), target.size()), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Rsocket, OptionsAndNames) {
  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int v = 1 << 17;
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  int got = 0;
  socklen_t len = sizeof got;
  EXPECT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &got, &len), 0);
  EXPECT_EQ(got, v);
  v = 1;
  EXPECT_EQ(rsetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v), 0);
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v), 0);
  linger lg{1, 2};
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
  v = 128;
  EXPECT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), 0);
  EXPECT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_RQSIZE, &v, sizeof v), 0);
  EXPECT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_INLINE, &v, sizeof v), 0);
  EXPECT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &v, sizeof v), 0);
  len = sizeof got;
  EXPECT_EQ(rgetsockopt(fd, SOL_RDMA, RDMA_RQSIZE, &got, &len), 0);
  EXPECT_EQ(got, 128);
  len = sizeof got;
  EXPECT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_ERROR, &got, &len), 0);
  EXPECT_EQ(got, 0);
  len = sizeof got;
  EXPECT_EQ(rgetsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &got, &len), 0);
  EXPECT_GT(got, 0);
  errno = 0;
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_BROADCAST + 1000, &v, sizeof v), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  errno = 0;
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in peer{};
  len = sizeof peer;
  errno = 0;
  EXPECT_EQ(rgetpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len), -1);
  EXPECT_EQ(errno, ENOTCONN);
  rclose(fd);

  Connect();
  len = sizeof peer;
  ASSERT_EQ(rgetpeername(cfd_, reinterpret_cast<sockaddr*>(&peer), &len), 0);
  EXPECT_EQ(peer.sin_port, addr_.sin_port);
  sockaddr_in local{};
  len = sizeof local;
  ASSERT_EQ(rgetsockname(sfd_, reinterpret_cast<sockaddr*>(&local), &len), 0);
  EXPECT_EQ(local.sin_port, addr_.sin_port);
}

// The options rsocket(7) lists beyond those above, and what monitors read (iperf3 through
// librspreload reads TCP_MAXSEG once and TCP_INFO every interval).
TEST_F(Rsocket, OptionsMonitorsReadAnswerAsTcpDoes) {
  int v = 1;
  int got = -1;
  socklen_t len = sizeof got;
  EXPECT_EQ(rsetsockopt(lfd_, SOL_SOCKET, SO_OOBINLINE, &v, sizeof v), 0) << strerror(errno);
  EXPECT_EQ(rgetsockopt(lfd_, SOL_SOCKET, SO_OOBINLINE, &got, &len), 0) << strerror(errno);
  EXPECT_EQ(got, 1);
  for (int name : {TCP_KEEPCNT, TCP_KEEPINTVL}) {
    v = 7;
    EXPECT_EQ(rsetsockopt(lfd_, IPPROTO_TCP, name, &v, sizeof v), 0) << name;
    len = sizeof got;
    EXPECT_EQ(rgetsockopt(lfd_, IPPROTO_TCP, name, &got, &len), 0) << name;
    EXPECT_EQ(got, 7) << name;
    v = 0;
    errno = 0;
    EXPECT_EQ(rsetsockopt(lfd_, IPPROTO_TCP, name, &v, sizeof v), -1) << name;
    EXPECT_EQ(errno, EINVAL) << name;
  }
  // Larger than a UDP datagram (65507 bytes) iperf3 calls "nonsense".
  len = sizeof got;
  ASSERT_EQ(rgetsockopt(lfd_, IPPROTO_TCP, TCP_MAXSEG, &got, &len), 0);
  EXPECT_GT(got, 0);
  EXPECT_LE(got, 65507);

  tcp_info info{};
  len = sizeof info;
  ASSERT_EQ(rgetsockopt(lfd_, IPPROTO_TCP, TCP_INFO, &info, &len), 0) << strerror(errno);
  EXPECT_EQ(len, sizeof info);
  EXPECT_EQ(info.tcpi_state, TCP_CLOSE) << "a listener";
  Connect();
  std::memset(&info, 0xff, sizeof info);
  len = sizeof info;
  ASSERT_EQ(rgetsockopt(cfd_, IPPROTO_TCP, TCP_INFO, &info, &len), 0) << strerror(errno);
  EXPECT_EQ(info.tcpi_state, TCP_ESTABLISHED);
  EXPECT_EQ(info.tcpi_total_retrans, 0u);
  EXPECT_EQ(info.tcpi_snd_mss, static_cast<uint32_t>(got));
  // A shorter buffer takes what fits, as from a kernel socket.
  uint8_t first = 0xff;
  len = 1;
  ASSERT_EQ(rgetsockopt(sfd_, IPPROTO_TCP, TCP_INFO, &first, &len), 0);
  EXPECT_EQ(len, 1u);
  EXPECT_EQ(first, TCP_ESTABLISHED);
}

// IPV6_V6ONLY, as on Linux: an option of AF_INET6 sockets only, off by default (a wildcard
// listener also takes IPv4 peers), fixed once the socket has its address.
TEST(RsocketIpv6Only, IsAnIpv6OptionUntilTheSocketIsBound) {
  int v4 = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(v4, 0);
  int one = 1;
  errno = 0;
  EXPECT_EQ(rsetsockopt(v4, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  rclose(v4);

  for (int type : {SOCK_STREAM, SOCK_DGRAM}) {
    int fd = rsocket(AF_INET6, type, 0);
    ASSERT_GE(fd, 0) << type;
    int got = -1;
    socklen_t len = sizeof got;
    ASSERT_EQ(rgetsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &got, &len), 0) << type;
    EXPECT_EQ(got, 0) << type;
    EXPECT_EQ(rsetsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one), 0) << type;
    len = sizeof got;
    ASSERT_EQ(rgetsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &got, &len), 0) << type;
    EXPECT_EQ(got, 1) << type;
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    ASSERT_EQ(rbind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0) << strerror(errno);
    int zero = 0;
    errno = 0;
    EXPECT_EQ(rsetsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero), -1) << type;
    EXPECT_EQ(errno, EINVAL) << type;
    rclose(fd);
  }
}

TEST(RsocketIpv6Only, DecidesWhetherAWildcardListenerTakesIpv4Peers) {
  for (int only : {0, 1}) {
    SCOPED_TRACE(only ? "IPV6_V6ONLY 1" : "IPV6_V6ONLY 0");
    int l = rsocket(AF_INET6, SOCK_STREAM, 0);
    ASSERT_GE(l, 0);
    ASSERT_EQ(rsetsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof only), 0);
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    ASSERT_EQ(rbind(l, reinterpret_cast<sockaddr*>(&any), sizeof any), 0) << strerror(errno);
    ASSERT_EQ(rlisten(l, 4), 0) << strerror(errno);
    ASSERT_EQ(rfcntl(l, F_SETFL, O_NONBLOCK), 0);
    socklen_t len = sizeof any;
    ASSERT_EQ(rgetsockname(l, reinterpret_cast<sockaddr*>(&any), &len), 0);
    sockaddr_in to = Loopback(ntohs(any.sin6_port));
    int c = rsocket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(c, 0);
    std::atomic<int> result{-1};
    std::thread t(
        [&] { result = rconnect(c, reinterpret_cast<sockaddr*>(&to), sizeof to) ? errno : 0; });
    // The listener takes whatever comes until the connect has its answer (bounded: 10 s).
    int s = -1;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (s < 0 && Clock::now() < deadline) {
      s = raccept(l, nullptr, nullptr);
      if (s < 0 && result.load() >= 0) break;
      if (s < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    t.join();
    if (only) {
      EXPECT_LT(s, 0) << "an IPv4 peer reached an IPv6-only listener";
      EXPECT_EQ(result.load(), ECONNREFUSED) << strerror(result.load());
    } else {
      EXPECT_GE(s, 0) << "the IPv4 peer was not taken";
      EXPECT_EQ(result.load(), 0) << strerror(result.load());
    }
    if (s >= 0) rclose(s);
    rclose(c);
    rclose(l);
  }
}

TEST(RsocketErrors, BadArgumentsFailAsSocketsDo) {
  errno = 0;
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET, SOCK_RAW, 0), -1);
  EXPECT_EQ(errno, EPROTONOSUPPORT);
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP), -1);
  EXPECT_EQ(errno, EPROTONOSUPPORT);

  char b[4];
  errno = 0;
  EXPECT_EQ(rsend(-1, b, 1, 0), -1);
  EXPECT_EQ(errno, EBADF);
  errno = 0;
  EXPECT_EQ(rclose(-1), -1);
  EXPECT_EQ(errno, EBADF);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  errno = 0;
  EXPECT_EQ(rrecv(pipefd[0], b, 1, 0), -1);
  EXPECT_EQ(errno, ENOTSOCK);
  errno = 0;
  EXPECT_EQ(rlisten(pipefd[0], 1), -1);
  EXPECT_EQ(errno, ENOTSOCK);
  close(pipefd[0]);
  close(pipefd[1]);

  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  errno = 0;
  EXPECT_EQ(rrecv(fd, b, 1, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  errno = 0;
  EXPECT_EQ(rsend(fd, b, 1, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  errno = 0;
  EXPECT_EQ(rshutdown(fd, 42), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(rbind(fd, nullptr, sizeof(sockaddr_in)), -1);
  EXPECT_EQ(errno, EFAULT);
  sockaddr_in a = Loopback(0);
  errno = 0;
  EXPECT_EQ(rbind(fd, reinterpret_cast<sockaddr*>(&a), 3), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(raccept(fd, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rclose(fd), 0);
  errno = 0;
  EXPECT_EQ(rclose(fd), -1);  // already closed
  EXPECT_TRUE(errno == EBADF || errno == ENOTSOCK);
}

TEST(RsocketErrors, ConnectWithoutListenerIsRefused) {
  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  // A port nobody listens on: bind and close a listener to learn a free one.
  int l = rsocket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(0);
  ASSERT_EQ(rbind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(rgetsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
  rclose(l);
  auto t0 = Clock::now();
  errno = 0;
  EXPECT_EQ(rconnect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, ECONNREFUSED) << strerror(errno);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  rclose(fd);
}

}  // namespace

namespace {

TEST(RsocketDgram, ExchangesDatagramsAndReportsTheSender) {
  int s = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(s, 0) << strerror(errno);
  sockaddr_in a = Loopback(0);
  ASSERT_EQ(rbind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  socklen_t len = sizeof a;
  ASSERT_EQ(rgetsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_NE(a.sin_port, 0);

  int c = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(c, 0);
  errno = 0;
  EXPECT_EQ(rsend(c, "x", 1, 0), -1);  // no destination yet
  EXPECT_EQ(errno, EDESTADDRREQ);
  char big[8192] = {};
  errno = 0;
  EXPECT_EQ(rsendto(c, big, sizeof big, 0, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, EMSGSIZE);
  ASSERT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  // Each datagram arrives whole and separately; a short buffer truncates one datagram only.
  ASSERT_EQ(rsend(c, "first", 5, 0), 5);
  ASSERT_EQ(rsend(c, "second", 6, 0), 6);
  pollfd p{s, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);
  char buf[64] = {};
  sockaddr_in from{};
  socklen_t fl = sizeof from;
  ASSERT_EQ(rrecvfrom(s, buf, 3, 0, reinterpret_cast<sockaddr*>(&from), &fl), 3);
  EXPECT_EQ(std::string(buf, 3), "fir");
  EXPECT_EQ(fl, sizeof from);
  EXPECT_EQ(from.sin_family, AF_INET);
  EXPECT_EQ(from.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  sockaddr_in cname{};
  len = sizeof cname;
  ASSERT_EQ(rgetsockname(c, reinterpret_cast<sockaddr*>(&cname), &len), 0);
  EXPECT_EQ(from.sin_port, cname.sin_port);
  ASSERT_EQ(rrecvfrom(s, buf, sizeof buf, 0, nullptr, nullptr), 6);
  EXPECT_EQ(std::string(buf, 6), "second");
  errno = 0;
  EXPECT_EQ(rrecv(s, buf, sizeof buf, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  // The reply goes back to the reported sender.
  ASSERT_EQ(rsendto(s, "reply", 5, 0, reinterpret_cast<sockaddr*>(&from), fl), 5);
  pollfd q{c, POLLIN, 0};
  ASSERT_EQ(rpoll(&q, 1, 5000), 1);
  ASSERT_EQ(rrecv(c, buf, sizeof buf, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "reply");
  EXPECT_EQ(rclose(c), 0);
  EXPECT_EQ(rclose(s), 0);
}

}  // namespace
