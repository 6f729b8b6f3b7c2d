// rdma_destroy_id(3): "Users must ... ack all related events" — rdma_destroy_id waits until every
// event rdma_get_cm_event handed out for the id has been acked, so a thread still reading an
// event never reads a freed id. A connection request counts on its listener, not on the new id:
// a program may reject and destroy the new id before acking the request.
#include "support/cm_harness.h"

#include <atomic>
#include <future>

namespace cmtest {
namespace {

class CmDestroyAck : public CmTest {};

constexpr milliseconds kBlockedFor{300};  // how long "still blocked" is watched
constexpr milliseconds kReturnsWithin{5000};

// Destroys `id` on another thread; the future is ready when rdma_destroy_id returned.
std::future<void> DestroyLater(rdma_cm_id* id) {
  return std::async(std::launch::async, [id] { rdma_destroy_id(id); });
}

rdma_cm_event* Hold(rdma_event_channel* ch, rdma_cm_event_type type) {
  if (!Readable(ch->fd, kWait)) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return nullptr;
  if (ev->event != type) {
    rdma_ack_cm_event(ev);
    return nullptr;
  }
  return ev;
}

TEST_F(CmDestroyAck, DestroyWaitsForTheAckOfAnEventHandedOut) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);  // not the fixture's: destroyed here
  sockaddr_storage dst = Ip("127.0.0.1", NextPort());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&dst), 2000), 0) << strerror(errno);
  rdma_cm_event* ev = Hold(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_NE(ev, nullptr);

  std::future<void> done = DestroyLater(id);
  EXPECT_EQ(done.wait_for(kBlockedFor), std::future_status::timeout)
      << "rdma_destroy_id returned while its event was not acked";
  EXPECT_EQ(ev->id, id);  // still readable: the id is not freed yet
  rdma_ack_cm_event(ev);
  EXPECT_EQ(done.wait_for(kReturnsWithin), std::future_status::ready);
}

// Events that were queued but never taken go with the id: nothing to wait for.
TEST_F(CmDestroyAck, EventsNeverTakenDoNotHoldTheDestroy) {
  rdma_event_channel* ch = Channel();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_storage dst = Ip("127.0.0.1", NextPort());
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, Sa(&dst), 2000), 0) << strerror(errno);
  ASSERT_TRUE(Readable(ch->fd, kWait));  // ADDR_RESOLVED is queued
  std::future<void> done = DestroyLater(id);
  EXPECT_EQ(done.wait_for(kReturnsWithin), std::future_status::ready);
  EXPECT_TRUE(Quiet(ch));
}

TEST_F(CmDestroyAck, AConnectionRequestHoldsItsListenerNotTheNewId) {
  rdma_event_channel* sch = Channel();
  rdma_event_channel* cch = Channel();
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_id(sch, &listen, nullptr, RDMA_PS_TCP), 0);
  uint16_t port = 0;
  ASSERT_TRUE(BindFreePort(listen, "127.0.0.1", &port));
  ASSERT_EQ(rdma_listen(listen, 4), 0) << strerror(errno);
  rdma_cm_id* client = Resolved(cch, port);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(MakeQp(client));
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(client, &cp), 0) << strerror(errno);
  rdma_cm_event* req = Hold(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_NE(req, nullptr);
  ASSERT_EQ(req->listen_id, listen);

  // Reject and destroy the new id with the request still held, as servers that turn a request
  // down do.
  rdma_cm_id* child = req->id;
  ASSERT_EQ(rdma_reject(child, nullptr, 0), 0) << strerror(errno);
  std::future<void> child_done = DestroyLater(child);
  bool child_returned = child_done.wait_for(kReturnsWithin) == std::future_status::ready;
  EXPECT_TRUE(child_returned) << "destroying the new id waited for the listener's event";

  std::future<void> listen_done = DestroyLater(listen);
  EXPECT_EQ(listen_done.wait_for(kBlockedFor), std::future_status::timeout)
      << "the listener went with its connection request not acked";
  rdma_ack_cm_event(req);
  EXPECT_EQ(listen_done.wait_for(kReturnsWithin), std::future_status::ready);
  if (!child_returned) child_done.wait();
  EXPECT_TRUE(Next(cch, RDMA_CM_EVENT_REJECTED));
}

}  // namespace
}  // namespace cmtest
