// Writing a payload into application memory the way an HCA places it: every byte once, in
// ascending address order, so the last bytes land last.
//
// Applications poll the last byte of an RDMA WRITE's destination and, once it changes, use the
// buffer: riostream then writes its next marker into that very byte and sends the buffer back.
// memcpy promises neither order nor single stores: glibc's AVX-512 copy of 64 bytes stores the
// same 64 bytes twice (the marker written between the two stores was overwritten, and both
// riostream processes spun forever), and its copies of more than eight vectors store the first
// vector last (a poller of the last byte would read stale head bytes).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace softrdma::link {

// The bytes at the end that are written one store at a time, after all the others.
constexpr size_t kPlaceTailBytes = 64;

// On x86 ordinary stores stay in order (and glibc fences its non-temporal ones): only the compiler
// must not reorder. Elsewhere a fence orders them. (ThreadSanitizer refuses fences.)
inline void OrderStores() {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("" ::: "memory");
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

inline void PlaceBytesWide(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = n > kPlaceTailBytes ? n - kPlaceTailBytes : 0;
  // Where a caller bounds n (a branch on its size), GCC expands this memcpy inline as rep movsq,
  // slower than glibc's below 2-3 KiB: ib_write_bw 1 KiB 32 -> 25 M msgs/s. The bound is hidden.
  asm("" : "+r"(i));
  if (i) std::memcpy(d, s, i);
  OrderStores();  // the bulk is complete before the tail
  // The tail through volatile stores, each one instruction: no memcpy here (its small copies
  // store overlapping words too), and aligned words so that each store is a single one.
  volatile uint8_t* vd = d;
  for (; i < n && (reinterpret_cast<uintptr_t>(d + i) & 7) != 0; ++i) vd[i] = s[i];
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, s + i, 8);  // a load: any width is fine
    *reinterpret_cast<volatile uint64_t*>(d + i) = w;
  }
  for (; i < n; ++i) vd[i] = s[i];
}

// Fewer than eight bytes go one byte store each whatever their alignment, as PlaceBytesWide would
// store them; the test is kept small enough to inline, where the request-response messages are.
inline void PlaceBytes(void* dst, const void* src, size_t n) {
  if (n < 8) {
    volatile uint8_t* vd = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    for (size_t i = 0; i < n; ++i) vd[i] = s[i];
    return;
  }
  PlaceBytesWide(dst, src, n);
}

}  // namespace softrdma::link
