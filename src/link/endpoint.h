// A node's network presence: one TCP listener and one UDP socket on all IPv4 addresses (same
// port number), a Unix listener for shared-memory channels from the same host, outbound
// connections cached per peer, the in-process loopback channel, and the progress thread that
// serves them. The thread
// blocks in epoll and never spins; it is the only reader of inbound frames.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "link/link.h"

namespace softrdma::link {

// The name the progress thread goes by (/proc/<pid>/task/<tid>/comm).
inline constexpr char kProgressThreadName[] = "softrdma-prog";

class Endpoint {
 public:
  // Called once the port is bound and before the progress thread starts: publishes the node
  // (e.g. claims its slot) and returns the identity announced to peers, or nullopt to give up.
  using IdentityFn = std::function<std::optional<NodeId>(uint16_t port)>;
  // Binds the listener and the UDP socket (one port number) and starts the progress thread.
  static std::unique_ptr<Endpoint> Start(FrameSink& sink, const IdentityFn& identity,
                                         std::string* err);
  ~Endpoint();

  uint16_t port() const { return port_; }
  // The connection used to reach `peer`: ours or one the peer opened to us (its hello came), opened
  // on first use, reopened after it closed; nullptr when it cannot even start connecting. `lazy`:
  // the connection opens at the first frame (Channel::Settle), unless the peer's own connection to
  // us is there by then; the paths of connected QPs are lazy, datagram paths not.
  std::shared_ptr<Channel> Connect(const PeerAddr& peer, bool lazy);
  // The shared-memory connection to the endpoint on `port` of this network namespace (same host),
  // opened on first use; nullptr when that endpoint cannot be reached so (another user, or shared
  // memory is off: SOFTRDMA_LINK=tcp), and the caller uses Connect.
  std::shared_ptr<Channel> ConnectShm(uint16_t port);
  // Frames sent here go to `peer` as UDP datagrams (same port number as its TCP listener).
  std::shared_ptr<Channel> Datagram(const PeerAddr& peer);
  // Frames sent here come back to this node's own sink.
  std::shared_ptr<Channel> Loopback() { return loopback_; }
  // Handles inbound work that has already arrived, on the calling thread. Unless `wait`, gives up
  // at once when another thread is doing it. Returns whether there was any.
  bool PollOnce(bool wait = false);
  // An application thread stops polling to sleep until a completion event: shared-memory records
  // from now on must wake the progress thread, not wait for the poller's lease to run out.
  void PollerMaySleep();
  // An application thread's poll returns completions: it polls again (undoes PollerMaySleep),
  // but may first look elsewhere (spin on memory an RDMA WRITE is to change), so shared-memory
  // producers ring for such records until it polls (ShmRingProducer::Publish, `prompt`).
  void CompletionsTaken();
  // ibv_get_cq_event's wait: returns 0 once `fd` (a completion channel's, blocking) is readable,
  // or the errno of a signal that interrupts the wait as it would a read(). Meanwhile inbound
  // work that wakes it is served on this thread, as the progress thread serves it.
  int WaitAlongside(int fd);
  // Copies the payloads that queued frames still borrow from application memory, before that
  // memory may go away (a QP failing or destroyed, a region deregistered).
  void SecureQueuedPayloads();
  // Waits (at most `max_ns`) until every frame queued on a TCP channel has been written to its
  // socket: a destroyed QP's last sends and ACKs must not die in our queue when the process
  // exits right after (a UD reply sent just before exit, to a peer still being connected to).
  bool WaitTxIdle(int64_t max_ns);
  // Makes the progress thread re-evaluate its timers now.
  void Wake();
  // Whether the caller is this endpoint's progress thread, whose rounds end by setting the timers
  // (a deadline another thread notes needs Wake to count).
  bool OnProgressThread() const;
  // Stops the thread without touching sockets: for a fork()ed child that must not act on the
  // parent's connections.
  void Abandon();
  // Around fork() (in the parent and in the child alike): the progress thread is held between
  // batches of work, where it holds no lock and allocates nothing.
  void HoldForFork();
  void ResumeAfterFork();

  struct Impl;

 private:
  Endpoint() = default;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<Channel> loopback_;
  uint16_t port_ = 0;
};

}  // namespace softrdma::link
