// The shared-memory ring on its own: records never wrap (a pad fills the end), a full ring refuses
// a record instead of overwriting unread ones, and the sleep/wake flags ask for exactly the
// doorbells that are needed.
#include "link/shm_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "link/link.h"

namespace softrdma::link {
namespace {

struct RingFixture {
  int64_t now = 1'000'000'000;  // the producer's clock
  ShmRingControl ctl{};
  std::unique_ptr<uint8_t[]> data{new uint8_t[kShmRingBytes]};
  ShmRingProducer tx{&ctl, data.get()};
  ShmRingConsumer rx{&ctl, data.get()};

  // Writes one record; false when the ring has no room for it.
  bool Write(uint32_t bytes, uint8_t tag) {
    uint8_t* p = tx.Reserve(bytes);
    if (!p) return false;
    ShmRecordHeader h{bytes, shm_record::kChunk, 0, 0, 0, 0, 0};
    std::memcpy(p, &h, sizeof h);
    p[sizeof h] = tag;
    tx.Commit();
    return true;
  }
  bool Put(uint32_t bytes, uint8_t tag) {
    if (!Write(bytes, tag)) return false;
    Publish();
    return true;
  }
  bool Publish(bool prompt = false) {
    return tx.Publish([this] { return now; }, prompt);
  }
  // Whether publishing one record rings; `prompt`: it changes memory the consumer's application
  // may be spinning on (an RDMA WRITE).
  bool PutRings(uint8_t tag, bool prompt) { return Write(kShmRecordAlign, tag) && Publish(prompt); }
  // The next non-pad record's tag, or -1 when the ring is empty.
  int Take() {
    for (;;) {
      uint64_t avail = 0;
      const uint8_t* p = rx.Peek(&avail);
      if (!p) return -1;
      ShmRecordHeader h;
      std::memcpy(&h, p, sizeof h);
      EXPECT_LE(h.bytes, avail);
      rx.Consume(h.bytes);
      if (h.kind != shm_record::kPad) return p[sizeof h];
    }
  }
};

TEST(ShmRing, RecordsComeOutInOrderAcrossTheEndOfTheRing) {
  RingFixture r;
  const uint32_t kRec = 3 * kShmRecordAlign;
  int next_out = 0;
  for (int i = 0; i < 20000; ++i) {
    ASSERT_TRUE(r.Put(kRec, static_cast<uint8_t>(i)));
    if (i % 3 == 2) {
      for (int k = 0; k < 3; ++k) ASSERT_EQ(r.Take(), static_cast<uint8_t>(next_out++));
    }
  }
  while (next_out < 20000) ASSERT_EQ(r.Take(), static_cast<uint8_t>(next_out++));
  EXPECT_EQ(r.Take(), -1);
}

TEST(ShmRing, AFullRingRefusesARecordAndTakesItOnceRoomFrees) {
  RingFixture r;
  const uint32_t kRec = kShmMaxRecordBytes;
  int put = 0;
  while (r.Put(kRec, static_cast<uint8_t>(put))) ++put;
  EXPECT_EQ(put, static_cast<int>(kShmRingBytes / kRec));
  EXPECT_TRUE(r.tx.WaitForRoom(kRec));  // still full: asks for the doorbell
  ASSERT_EQ(r.Take(), 0);
  EXPECT_TRUE(r.rx.ProducerWaiting());   // the consumer must ring
  EXPECT_FALSE(r.rx.ProducerWaiting());  // once
  ASSERT_EQ(r.Take(), 1);
  EXPECT_FALSE(r.tx.WaitForRoom(kRec));  // room for two records: no need to wait
  EXPECT_TRUE(r.Put(kRec, 99));
}

// A UD sender asks at every datagram whether the backlog allows it (ShmChannel::AwaitRoom). Below
// the backlog, the question must leave nothing a consumer could see: the flag raised and lowered
// around the look had the receiver ring the sender's doorbell for nothing whenever it served the
// ring meanwhile (ib_send_bw -c UD 64 B: 28,000-37,000 such doorbells in 2 s).
TEST(ShmRing, AProducerWithinItsBacklogNeverAsksForTheDoorbell) {
  RingFixture r;
  ASSERT_TRUE(r.Put(kShmRecordAlign, 1));
  constexpr int kAsks = 2'000'000;
  std::atomic<bool> done{false};
  std::thread sender([&] {
    for (int i = 0; i < kAsks; ++i) EXPECT_FALSE(r.tx.AskForRoom(kDatagramBacklogBytes));
    done.store(true);
  });
  int rings = 0;
  while (!done.load()) rings += r.rx.ProducerWaiting();
  sender.join();
  EXPECT_EQ(rings, 0) << "doorbells asked for by a producer that had room";
}

TEST(ShmRing, TheProducerRingsOnlyForASleepingConsumer) {
  RingFixture r;
  EXPECT_TRUE(r.rx.PrepareSleep());  // empty: may sleep
  uint8_t* p = r.tx.Reserve(kShmRecordAlign);
  ASSERT_NE(p, nullptr);
  ShmRecordHeader h{kShmRecordAlign, shm_record::kChunk, 0, 0, 0, 0, 0};
  std::memcpy(p, &h, sizeof h);
  r.tx.Commit();
  EXPECT_TRUE(r.Publish());  // the consumer sleeps: ring
  r.tx.Commit();
  EXPECT_FALSE(r.Publish());          // already woken: no second doorbell
  EXPECT_FALSE(r.rx.PrepareSleep());  // data waits: do not sleep
  r.rx.Awake();
  EXPECT_NE(r.Take(), -1);
  EXPECT_TRUE(r.rx.PrepareSleep());
}

// riostream's receiver spins on its buffer after its last poll: the WRITE that ends the spin
// waited in the ring until the progress thread's lease ran out (tens of microseconds per message).
TEST(ShmRing, AnAwakeConsumerThatStoppedPollingIsRung) {
  RingFixture r;
  r.rx.Seen(r.now);  // an application polls
  r.now += kShmConsumerIdleNs / 2;
  EXPECT_TRUE(r.Put(kShmRecordAlign, 1));
  EXPECT_FALSE(r.Publish()) << "the application polls: it finds the record itself";
  r.now += kShmConsumerIdleNs;
  EXPECT_TRUE(r.Publish()) << "no poll for longer than kShmConsumerIdleNs: ring";
  r.now += 1;
  EXPECT_FALSE(r.Publish()) << "the doorbell counts as a poll: no second one at once";
  r.now += kShmConsumerIdleNs + 1;
  EXPECT_TRUE(r.Publish());
  r.rx.Seen(r.now);
  EXPECT_FALSE(r.Publish());
}

// Records published without a doorbell (the consumer had just polled) that it has not taken
// kShmUnrungCheckNs later get one from the producer's next poll: ib_write_lat by frames waited for
// the consumer's poll lease (0.2-1 ms) with every message, its receiver spinning on memory.
TEST(ShmRing, RecordsLeftUntakenAfterTheLastPollAreRungForByTheProducer) {
  RingFixture r;
  EXPECT_FALSE(r.tx.UnrungStalled(r.now)) << "nothing published: nothing to ring for";
  r.rx.Seen(r.now);
  EXPECT_TRUE(r.Put(kShmRecordAlign, 1));  // no doorbell: the application polls
  EXPECT_FALSE(r.tx.UnrungStalled(r.now + kShmUnrungCheckNs - 1)) << "not yet";
  r.now += kShmUnrungCheckNs;
  EXPECT_TRUE(r.tx.UnrungStalled(r.now)) << "not taken since: the application looks elsewhere";
  EXPECT_FALSE(r.tx.UnrungStalled(r.now + kShmUnrungCheckNs)) << "one doorbell per wait";
  EXPECT_FALSE(r.Publish()) << "and the doorbell counts as a poll";

  // Taken in time: no doorbell; records published meanwhile get their own time.
  ASSERT_EQ(r.Take(), 1);
  r.rx.Seen(r.now);
  EXPECT_TRUE(r.Put(kShmRecordAlign, 2));
  r.now += 10;
  EXPECT_TRUE(r.Put(kShmRecordAlign, 3));
  ASSERT_EQ(r.Take(), 2);
  r.now += kShmUnrungCheckNs;
  EXPECT_FALSE(r.tx.UnrungStalled(r.now)) << "the consumer took what waited longest";
  EXPECT_FALSE(r.tx.UnrungStalled(r.now + kShmUnrungCheckNs - 1));
  EXPECT_TRUE(r.tx.UnrungStalled(r.now + kShmUnrungCheckNs)) << "record 3, untaken since";
  ASSERT_EQ(r.Take(), 3);

  // A record the consumer takes before the check leaves nothing waiting.
  r.now += kShmUnrungCheckNs;
  r.rx.Seen(r.now);
  EXPECT_TRUE(r.Put(kShmRecordAlign, 4));
  ASSERT_EQ(r.Take(), 4);
  EXPECT_FALSE(r.tx.UnrungStalled(r.now + kShmUnrungCheckNs));
  EXPECT_FALSE(r.tx.UnrungStalled(r.now + 3 * kShmUnrungCheckNs));
}

// ib_write_lat by frames: the application took its completion and spins on memory; the peer's
// WRITE waited for the unrung check (5 us, then the doorbell) although it was seen polling just
// before.
TEST(ShmRing, AWriteRingsAConsumerWhoseApplicationTookCompletionsAndLeft) {
  RingFixture r;
  ASSERT_EQ(r.ctl.consumer_polling.load(), kConsumerNeverPolled);
  r.rx.Seen(r.now);  // a progress thread serving a batch, its application never polled
  EXPECT_FALSE(r.PutRings(0, true)) << "it takes the record with its batch";
  ASSERT_EQ(r.Take(), 0);
  r.rx.Polling();
  EXPECT_FALSE(r.PutRings(1, true)) << "the application polls: it finds the record itself";
  ASSERT_EQ(r.Take(), 1);
  EXPECT_FALSE(r.rx.Leaving()) << "nothing came meanwhile";
  r.now += 1'000;
  EXPECT_TRUE(r.PutRings(2, true)) << "the application left after its completions: ring";
  EXPECT_FALSE(r.PutRings(3, true)) << "the woken consumer takes this one with the first";
  ASSERT_EQ(r.Take(), 2);
  ASSERT_EQ(r.Take(), 3);
  EXPECT_TRUE(r.PutRings(4, true)) << "the doorbell's records are taken: ring again";
  ASSERT_EQ(r.Take(), 4);
  EXPECT_FALSE(r.PutRings(5, false)) << "any other record waits for the application's poll";
  ASSERT_EQ(r.Take(), 5);
  r.rx.Polling();
  EXPECT_FALSE(r.PutRings(6, true)) << "back to polling: no doorbell";
  EXPECT_TRUE(r.rx.Leaving()) << "a record it was seen polling for waits: the leaver serves it";
  ASSERT_EQ(r.Take(), 6);
}

// A consumer whose application took the records a doorbell was rung for asks for quiet: on a host
// with no idle core each such doorbell woke its progress thread into a polling application's core,
// which made the next one (ib_send_lat by frames averaged 3.6-4.6 us instead of 1.7-2.1). While
// it lasts, records it does not await in memory ring neither for an idle consumer nor when left
// untaken; a sleeping consumer and records awaited in memory are rung as ever.
TEST(ShmRing, AConsumerThatAskedForQuietIsRungOnlyWhenItSleepsOrAwaitsMemory) {
  RingFixture r;
  r.rx.Seen(r.now);
  r.rx.AskQuiet(r.now + kShmQuietNs);
  r.now += kShmConsumerIdleNs + 1;
  EXPECT_FALSE(r.PutRings(1, false)) << "idle, but quiet: no doorbell";
  EXPECT_FALSE(r.tx.UnrungStalled(r.now + kShmUnrungCheckNs)) << "untaken, but quiet";
  EXPECT_TRUE(r.PutRings(2, true)) << "awaited in memory: the idle consumer is rung";
  ASSERT_EQ(r.Take(), 1);
  ASSERT_EQ(r.Take(), 2);

  r.rx.Seen(r.now);
  EXPECT_FALSE(r.PutRings(3, false));
  r.now = r.ctl.quiet_until_ns.load() + 1;
  EXPECT_TRUE(r.tx.UnrungStalled(r.now)) << "the quiet is over: left untaken, it is rung for";
  ASSERT_EQ(r.Take(), 3);

  r.rx.AskQuiet(r.now + kShmQuietNs);
  EXPECT_TRUE(r.rx.PrepareSleep());
  EXPECT_TRUE(r.PutRings(4, false)) << "a sleeping consumer is rung, quiet or not";
  ASSERT_EQ(r.Take(), 4);
}

TEST(ShmRing, ATailMovedBeyondTheRingReadsAsMoreThanTheRingHolds) {
  RingFixture r;
  r.ctl.tail.store(uint64_t{kShmRingBytes} * 3);  // what a hostile producer may write
  uint64_t avail = 0;
  ASSERT_NE(r.rx.Peek(&avail), nullptr);
  EXPECT_GT(avail, kShmRingBytes);
  r.ctl.tail.store(~uint64_t{0});  // "behind" the consumer
  ASSERT_NE(r.rx.Peek(&avail), nullptr);
  EXPECT_GT(avail, kShmRingBytes);
}

}  // namespace
}  // namespace softrdma::link
