// One direction of a shared-memory channel: a single-producer single-consumer ring of records in
// memory both processes map. The producer and the consumer live in different processes, and the
// producer may be hostile, so the consumer trusts nothing it reads here beyond what it validates
// (see ShmChannel), and never lets a record wrap: a record that would cross the end is preceded by
// a pad record filling the rest of the ring.
//
// Sleeping and waking (the doorbell is an eventfd of the sleeping side):
//   consumer about to sleep: asleep = 1; re-check the ring; sleep only if it is empty.
//   producer: publish the tail; if asleep: asleep = 0 and ring the doorbell.
// A consumer that is awake but whose application has not looked at the ring for a while
// (kShmConsumerIdleNs: it may be spinning on memory, waiting for an RDMA WRITE that only this
// record will bring) is rung as well: its progress thread, which leaves the rings to polling
// application threads, then serves the record instead of waiting for the end of their lease.
// Each side stores, then loads what the other stored, both sequentially consistent, so at least
// one of them sees the other (no lost wake-up), and a consumer that is awake costs the producer no
// system call. The same protocol, mirrored, wakes a producer waiting for room. (Sequentially
// consistent accesses rather than fences: ThreadSanitizer does not model fences.)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace softrdma::link {

constexpr uint32_t kShmRecordAlign = 64;            // a record starts on its own cache line
constexpr uint32_t kShmRingBytes = 1u << 20;        // per direction
constexpr uint32_t kShmMaxRecordBytes = 64 * 1024;  // inline payload travels in records this big
// An application that polled less than this long ago is polling: its records need no doorbell.
// Longer than a preemption on a busy host: at 5 us, ib_send_bw 2 B rang 35,000 doorbells in 1.5 s,
// each waking the consumer's progress thread into the mutex its poller held, which stalled the
// poller into the next doorbell (0.5-0.7 M messages/s; 2.1-2.5 M at 20 us).
constexpr int64_t kShmConsumerIdleNs = 20'000;
// Records published without a doorbell (the consumer polled within kShmConsumerIdleNs) that are
// still not taken this much later get one after all (ShmRingProducer::UnrungStalled): a consumer
// whose application polled once and then waited elsewhere left them to its progress thread's lease,
// 0.2-1 ms (ib_write_lat by frames: 100-500 us per message).
constexpr int64_t kShmUnrungCheckNs = 5'000;
// A doorbell whose records the consumer's application took before its progress thread came (the
// application was polling, only slow for a moment: its core was taken) asks the producer for this
// long without the doorbells of the two rules above (ShmRingConsumer::AskQuiet). On a host with no
// idle core each such doorbell woke a progress thread into a polling application's core, which
// made the next one: ib_send_lat by frames (an SRQ) rang for one message in ten and averaged
// 3.6-4.6 us against 1.7-2.1 in the runs that never started it. A sleeping consumer, and records
// awaited in memory, are rung all the same.
constexpr int64_t kShmQuietNs = 100'000;
// kShmUnrungCheckNs, or what SOFTRDMA_SHM_UNRUNG_CHECK_NS says: tests that stretch the trust in
// polls (SOFTRDMA_SHM_TRUST_POLL_NS) stretch this too when the doorbell must come from elsewhere.
int64_t ShmUnrungCheckNs();
// `normal`, or what SOFTRDMA_SHM_TRUST_POLL_NS says: tests stretch the times a poller is trusted to
// look again (kShmConsumerIdleNs, the poll lease, the socket lease) so that a race around them
// happens every time.
int64_t ShmTrustedPollNs(int64_t normal);

// consumer_polling: no application thread of the consumer has polled (an application that waits
// elsewhere all along, as a passive ib_write_bw; the usual rules ring it), one polls, or one
// polled, took completions and left (see ShmRingProducer::Publish, `prompt`).
constexpr uint32_t kConsumerNeverPolled = 0, kConsumerPolls = 1, kConsumerLeft = 2;

struct alignas(64) ShmRingControl {
  std::atomic<uint64_t> tail;  // bytes published (producer)
  char pad0[56];
  std::atomic<uint64_t> head;  // bytes consumed (consumer)
  char pad1[56];
  std::atomic<uint32_t> consumer_asleep;   // the consumer wants the doorbell when data arrives
  std::atomic<uint32_t> producer_blocked;  // the producer wants the doorbell when room frees
  std::atomic<int64_t> consumer_seen_ns;   // CLOCK_MONOTONIC: an application last polled the ring
  std::atomic<uint32_t> consumer_polling;  // kConsumer*: whether an application thread polls
  std::atomic<uint32_t> producer_prompts;  // 1: the producer reads consumer_polling (see Publish)
  std::atomic<int64_t> quiet_until_ns;     // CLOCK_MONOTONIC: see kShmQuietNs (0: none asked)
  char pad2[32];
};
static_assert(sizeof(ShmRingControl) == 192);
static_assert(offsetof(ShmRingControl, head) == 64);
static_assert(offsetof(ShmRingControl, consumer_asleep) == 128);
static_assert(offsetof(ShmRingControl, consumer_seen_ns) == 136);
static_assert(offsetof(ShmRingControl, consumer_polling) == 144);
static_assert(offsetof(ShmRingControl, producer_prompts) == 148);
static_assert(offsetof(ShmRingControl, quiet_until_ns) == 152);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

namespace shm_record {
constexpr uint8_t kPad = 0;
constexpr uint8_t kHello = 1;  // data: the sender's NodeId
constexpr uint8_t kFrame = 2;  // the IB headers, then refs or the first inline payload bytes
constexpr uint8_t kChunk = 3;  // more inline payload of the frame in progress
}  // namespace shm_record

// Every record starts with this header. Layout of a frame record: header, IB headers padded to
// 8 bytes, `nref` ShmPayloadRefs, then `data_len` inline payload bytes.
struct ShmRecordHeader {
  uint32_t bytes;   // whole record, a multiple of kShmRecordAlign
  uint8_t kind;     // shm_record::k*
  uint8_t hdr_len;  // kFrame: IB header bytes
  uint8_t nref;     // kFrame: payload pieces in the sender's shared segments
  uint8_t reserved;
  uint32_t payload_len;  // kFrame: the frame's whole payload
  uint32_t data_len;     // inline payload bytes in this record
};
static_assert(sizeof(ShmRecordHeader) == 16);

// A piece of a frame's payload: bytes the receiver copies straight out of the sender's arena of
// registered memory, or the next bytes of the record's inline data.
constexpr uint32_t kShmArenaSegment = 1;
constexpr uint32_t kShmInlineSegment = 2;
constexpr uint8_t kShmMaxRefs = 32;
struct ShmPayloadRef {
  uint32_t segment;
  uint32_t reserved;
  uint64_t offset;
  uint64_t len;
};
static_assert(sizeof(ShmPayloadRef) == 24);

constexpr uint32_t ShmAlign(uint64_t n, uint32_t to) {
  return static_cast<uint32_t>((n + to - 1) / to * to);
}

// The producer's view. Not thread-safe: the channel's tx lock serialises it.
class ShmRingProducer {
 public:
  ShmRingProducer() = default;
  ShmRingProducer(ShmRingControl* c, uint8_t* data, int64_t idle_ns = kShmConsumerIdleNs,
                  int64_t unrung_check_ns = kShmUnrungCheckNs)
      : c_(c), data_(data), idle_ns_(idle_ns), unrung_check_ns_(unrung_check_ns) {
    tail_ = c->tail.load(std::memory_order_relaxed);
    head_seen_ = c->head.load(std::memory_order_relaxed);
  }
  // Room for a record of `bytes` (aligned), contiguous; nullptr when the ring is too full. Writes a
  // pad record first when the record would cross the end.
  uint8_t* Reserve(uint32_t bytes) {
    uint32_t at = static_cast<uint32_t>(tail_ % kShmRingBytes);
    uint32_t to_end = kShmRingBytes - at;
    uint64_t need = bytes <= to_end ? bytes : uint64_t{to_end} + bytes;
    // The consumer's head is read again only when the one last read leaves too little room: the
    // line it lives on moves between the cores at every record the consumer takes, and reading it
    // per record cost each message a cache miss on each side.
    if (tail_ + need - head_seen_ > kShmRingBytes) {
      head_seen_ = c_->head.load(std::memory_order_acquire);
      if (tail_ + need - head_seen_ > kShmRingBytes) return nullptr;
    }
    if (bytes > to_end) {
      auto* pad = reinterpret_cast<ShmRecordHeader*>(data_ + at);
      *pad = ShmRecordHeader{to_end, shm_record::kPad, 0, 0, 0, 0, 0};
      tail_ += to_end;
      at = 0;
    }
    reserved_ = bytes;
    return data_ + at;
  }
  // Makes the reserved record visible to the consumer (after Publish).
  void Commit() {
    tail_ += reserved_;
    reserved_ = 0;
  }
  // Publishes committed records. True when the consumer must be woken: it sleeps, or no
  // application of its has polled for kShmConsumerIdleNs (`now_ns` gives the time when asked).
  // A doorbell counts as a poll: the records that follow it within kShmConsumerIdleNs ring none.
  // `prompt`: the records change memory the consumer's application may be spinning on (an RDMA
  // WRITE), and it rings too when that application took completions and has not polled since
  // (ConsumerLeft): waiting for the unrung check cost ib_write_lat by frames 5-15 us a message.
  template <typename Clock>
  bool Publish(Clock now_ns, bool prompt = false) {
    c_->tail.store(tail_, std::memory_order_seq_cst);
    bool asleep = c_->consumer_asleep.load(std::memory_order_seq_cst) != 0;
    if (asleep && c_->consumer_asleep.exchange(0, std::memory_order_relaxed) == 0) return false;
    int64_t now = now_ns();
    if (prompt && !prompts_told_) {
      c_->producer_prompts.store(1, std::memory_order_relaxed);
      prompts_told_ = true;
    }
    if (!asleep && !(prompt && ConsumerLeft()) &&
        (now - c_->consumer_seen_ns.load(std::memory_order_relaxed) <= idle_ns_ ||
         (!prompt && Quiet(now)))) {
      if (unrung_since_ == 0) {
        unrung_since_ = now;
        unrung_until_ = tail_;
      }
      unrung_prompt_ = unrung_prompt_ || prompt;
      return false;
    }
    c_->consumer_seen_ns.store(now, std::memory_order_relaxed);
    unrung_since_ = 0;
    unrung_prompt_ = false;
    rung_until_ = tail_;
    return true;
  }
  // True when records published without a doorbell kShmUnrungCheckNs ago or more are still not
  // taken: the consumer's application stopped polling after its last look (it waits elsewhere,
  // e.g. spins on the memory a WRITE it waits for is to change) and the caller rings. Asked from
  // the producer's own polls; reads the consumer's head only when such records wait.
  bool UnrungStalled(int64_t now) {
    if (unrung_since_ == 0 || now - unrung_since_ < unrung_check_ns_) return false;
    if (!unrung_prompt_ && Quiet(now)) return false;  // looked at again once the quiet ends
    head_seen_ = c_->head.load(std::memory_order_acquire);
    if (head_seen_ - unrung_until_ < uint64_t{1} << 63) {  // those taken (head >= mark)
      // Later ones, if any, get their own time.
      unrung_since_ = head_seen_ == tail_ ? 0 : now;
      unrung_until_ = tail_;
      unrung_prompt_ = unrung_prompt_ && unrung_since_ != 0;
      return false;
    }
    unrung_since_ = 0;
    unrung_prompt_ = false;
    rung_until_ = tail_;
    c_->consumer_seen_ns.store(now, std::memory_order_relaxed);  // a doorbell counts as a poll
    return true;
  }
  // Whether the consumer has not declared itself asleep (a look, no store).
  bool ConsumerAwake() const { return c_->consumer_asleep.load(std::memory_order_relaxed) == 0; }
  // True (once) when the consumer declared itself asleep: the caller rings. After a store the
  // consumer must see (a store-load fence orders them against its declaration).
  bool TakeSleeper() {
    return c_->consumer_asleep.load(std::memory_order_seq_cst) != 0 &&
           c_->consumer_asleep.exchange(0, std::memory_order_relaxed) != 0;
  }
  // Asks for the doorbell when room for two records of `bytes` frees. False when it freed
  // meanwhile (try again now).
  bool WaitForRoom(uint32_t bytes) { return AskForRoom(kShmRingBytes - uint64_t{bytes} * 2); }
  bool Drained() const { return c_->head.load(std::memory_order_acquire) == tail_; }
  // Asks for the doorbell when the consumer frees room. False when the bytes published and not
  // yet consumed are at most `max_backlog` already (nothing to wait for). The flag is raised only
  // when that first look finds a backlog: raised and lowered around every UD datagram's check
  // (ShmChannel::AwaitRoom), it had the consumer ring for nothing whenever it looked meanwhile.
  bool AskForRoom(uint64_t max_backlog) {
    if (tail_ - c_->head.load(std::memory_order_acquire) <= max_backlog) return false;
    c_->producer_blocked.store(1, std::memory_order_seq_cst);
    if (tail_ - c_->head.load(std::memory_order_seq_cst) <= max_backlog) {
      c_->producer_blocked.store(0, std::memory_order_relaxed);
      return false;
    }
    return true;
  }

 private:
  ShmRingControl* c_ = nullptr;
  uint8_t* data_ = nullptr;
  int64_t idle_ns_ = kShmConsumerIdleNs;
  int64_t unrung_check_ns_ = kShmUnrungCheckNs;
  int64_t unrung_since_ = 0;    // when records were first published without a doorbell, 0: none
  uint64_t unrung_until_ = 0;   // the tail then: all those records are taken once head reaches it
  uint64_t rung_until_ = 0;     // the tail at the last doorbell: the woken consumer takes those
  bool unrung_prompt_ = false;  // some of those unrung records are awaited in memory
  bool prompts_told_ = false;
  // The consumer asked for no doorbell for records its application takes (kShmQuietNs). Its line
  // is the one Publish reads the consumer's flags from.
  bool Quiet(int64_t now) const { return now < c_->quiet_until_ns.load(std::memory_order_relaxed); }
  // Whether no application thread of the consumer polls (it took completions and left: it may be
  // spinning on the memory a record is to change) and the last doorbell's records are taken (a
  // consumer serving them sees later ones before it sleeps).
  bool ConsumerLeft() const {
    return c_->consumer_polling.load(std::memory_order_seq_cst) == kConsumerLeft &&
           c_->head.load(std::memory_order_acquire) - rung_until_ < uint64_t{1} << 63;
  }
  uint64_t tail_ = 0;
  uint64_t head_seen_ = 0;  // the consumer's head when last read: room it has freed at least
  uint32_t reserved_ = 0;
};

// The consumer's view. Callers hold the endpoint's progress mutex.
class ShmRingConsumer {
 public:
  ShmRingConsumer() = default;
  ShmRingConsumer(ShmRingControl* c, const uint8_t* data) : c_(c), data_(data) {
    head_.store(c->head.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  ShmRingConsumer& operator=(const ShmRingConsumer& o) {
    c_ = o.c_;
    data_ = o.data_;
    head_.store(o.head_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  // Lock-free (pollers ask it without the progress mutex).
  bool Empty() const {
    return c_->tail.load(std::memory_order_acquire) == head_.load(std::memory_order_relaxed);
  }
  // The next record's bytes (contiguous: records never wrap) and how many are published from
  // there to the end of the ring; nullptr when the ring is empty. A tail the producer moved
  // backwards or beyond the ring reads as `*avail` > ring size, which the caller rejects.
  const uint8_t* Peek(uint64_t* avail) const {
    uint64_t tail = c_->tail.load(std::memory_order_acquire);
    uint64_t head = head_.load(std::memory_order_relaxed);
    if (tail == head) return nullptr;
    uint32_t at = static_cast<uint32_t>(head % kShmRingBytes);
    uint64_t published = tail - head;
    uint64_t to_end = kShmRingBytes - at;
    *avail = published > kShmRingBytes ? published : (published < to_end ? published : to_end);
    return data_ + at;
  }
  void Consume(uint32_t bytes) {
    uint64_t head = head_.load(std::memory_order_relaxed) + bytes;
    head_.store(head, std::memory_order_relaxed);
    c_->head.store(head, std::memory_order_seq_cst);
  }
  // After a batch: true when the producer waits for room and must be woken.
  bool ProducerWaiting() const {
    return c_->producer_blocked.load(std::memory_order_seq_cst) != 0 &&
           c_->producer_blocked.exchange(0, std::memory_order_relaxed) != 0;
  }
  // Before sleeping: false when data arrived meanwhile (do not sleep).
  bool PrepareSleep() {
    c_->consumer_asleep.store(1, std::memory_order_seq_cst);
    return c_->tail.load(std::memory_order_seq_cst) == head_.load(std::memory_order_relaxed);
  }
  void Awake() {
    if (c_->consumer_asleep.load(std::memory_order_relaxed))
      c_->consumer_asleep.store(0, std::memory_order_relaxed);
  }
  // An application thread polled (or is about to serve) the ring at `now_ns`.
  void Seen(int64_t now_ns) { c_->consumer_seen_ns.store(now_ns, std::memory_order_relaxed); }
  // A doorbell came for records our application took itself: see kShmQuietNs.
  void AskQuiet(int64_t until_ns) { c_->quiet_until_ns.store(until_ns, std::memory_order_relaxed); }
  // Whether the producer publishes records awaited in memory, and so reads consumer_polling:
  // otherwise Polling and Leaving are left out (a fenced store on every poll that found
  // completions cost ib_send_lat 0.275 -> 0.32 us).
  bool ProducerPrompts() const { return c_->producer_prompts.load(std::memory_order_relaxed) != 0; }
  // An application thread polls: it looks at the ring again.
  void Polling() {
    if (c_->consumer_polling.load(std::memory_order_relaxed) != kConsumerPolls)
      c_->consumer_polling.store(kConsumerPolls, std::memory_order_relaxed);
  }
  // An application thread took completions and may look elsewhere now. True when records came
  // meanwhile: their producer may have seen it polling and not rung (store, then load, against
  // the producer's store of the tail and load of the flag: one of the two sees the other).
  bool Leaving() {
    if (c_->consumer_polling.load(std::memory_order_relaxed) != kConsumerPolls) return false;
    c_->consumer_polling.store(kConsumerLeft, std::memory_order_seq_cst);
    return c_->tail.load(std::memory_order_seq_cst) != head_.load(std::memory_order_relaxed);
  }

 private:
  ShmRingControl* c_ = nullptr;
  const uint8_t* data_ = nullptr;
  // Our own count of consumed bytes (the shared copy is the producer's to read, not ours to trust).
  std::atomic<uint64_t> head_{0};
};

}  // namespace softrdma::link
