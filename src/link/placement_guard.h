// Placing bytes into registered memory that the application has made read-only (mprotect) since
// it registered it, or unmapped, or whose file it truncated. An HCA writes such pages all the
// same: they are pinned, and its DMA does not go through the process's page tables. We write
// through them, and the write faults.
//
// So placements go through copies and atomics written in assembly (link/guarded_copy_x86_64.S),
// as a kernel's copies to user memory do: leaves that touch no stack, so that the fault handler
// (link/page_move_guard.cpp) resumes a fault inside them at an exit returning failure, with
// nothing to unwind and nothing to arm beforehand. The bytes then go past the protection: through
// /proc/self/mem, as a debugger's writes go into read-only pages, or for pages moved onto the arena
// (a shared mapping, which /proc/self/mem leaves alone) through a mapping of the arena of their
// own. Only faults inside those copies are resumed: the application's own go on to its handler or
// end the process, as without us. Elsewhere than on x86-64 placements are plain (unguarded) stores.
#pragma once

#include <signal.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "link/place.h"
#include "link/sanitizers.h"

#if defined(__x86_64__)
extern "C" {
// link/guarded_copy_x86_64.S: {value, 1}, or {0, 0} when the access faulted.
struct SoftrdmaGuardedResult {
  uint64_t value;
  uint64_t ok;
};
SoftrdmaGuardedResult softrdma_guarded_place(void* dst, const void* src, size_t n);
SoftrdmaGuardedResult softrdma_guarded_store8(void* p, uint64_t value);
SoftrdmaGuardedResult softrdma_guarded_compare_swap(uint64_t* p, uint64_t compare, uint64_t swap);
SoftrdmaGuardedResult softrdma_guarded_fetch_add(uint64_t* p, uint64_t add);
SoftrdmaGuardedResult softrdma_guarded_probe(const void* p, size_t n);
}
#endif

// ThreadSanitizer does not see the assembly's accesses, and AddressSanitizer does not check them:
// they are told.
#if defined(__SANITIZE_THREAD__) || SOFTRDMA_HAS_FEATURE(thread_sanitizer)
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_read_range(const void* p, unsigned long n);
extern "C" void __tsan_write_range(void* p, unsigned long n);
#elif defined(__SANITIZE_ADDRESS__) || SOFTRDMA_HAS_FEATURE(address_sanitizer)
extern "C" void __asan_loadN(void* p, size_t n);
extern "C" void __asan_storeN(void* p, size_t n);
#endif

namespace softrdma::link {

inline void SanitizersSeeCopy(void* dst, const void* src, size_t n) {
#if defined(__SANITIZE_THREAD__) || SOFTRDMA_HAS_FEATURE(thread_sanitizer)
  __tsan_read_range(src, n);
  __tsan_write_range(dst, n);
#elif defined(__SANITIZE_ADDRESS__) || SOFTRDMA_HAS_FEATURE(address_sanitizer)
  __asan_loadN(const_cast<void*>(src), n);
  __asan_storeN(dst, n);
#else
  (void)dst, (void)src, (void)n;
#endif
}

// PlaceBytes (link/place.h), or false when it faulted (it may have written part of the bytes).
inline bool GuardedPlace(void* dst, const void* src, size_t n) {
  SanitizersSeeCopy(dst, src, n);
#if defined(__x86_64__)
  return softrdma_guarded_place(dst, src, n).ok != 0;
#else
  PlaceBytes(dst, src, n);
  return true;
#endif
}

// Eight bytes at `p` (any alignment) in one store, or false when it faulted.
inline bool GuardedStore8(void* p, uint64_t value) {
  SanitizersSeeCopy(p, &value, sizeof value);
#if defined(__x86_64__)
  return softrdma_guarded_store8(p, value).ok != 0;
#else
  std::memcpy(p, &value, sizeof value);
  return true;
#endif
}

// The atomics of an HCA on a word of application memory, or false when it faulted (nothing was
// written). `*orig` gets the word's value before.
#if defined(__x86_64__)
// An atomic of the assembly as the sanitizers should see it: AddressSanitizer checks the word,
// ThreadSanitizer orders it as a sequentially consistent read-modify-write (not as plain accesses,
// which would race with the application's own atomics on the word).
template <typename Op>
inline bool SeenAsAtomic(uint64_t* p, uint64_t* orig, Op op) {
#if defined(__SANITIZE_THREAD__) || SOFTRDMA_HAS_FEATURE(thread_sanitizer)
  __tsan_release(p);
#elif defined(__SANITIZE_ADDRESS__) || SOFTRDMA_HAS_FEATURE(address_sanitizer)
  __asan_storeN(p, sizeof *p);
#else
  (void)p;
#endif
  const SoftrdmaGuardedResult r = op();
#if defined(__SANITIZE_THREAD__) || SOFTRDMA_HAS_FEATURE(thread_sanitizer)
  __tsan_acquire(p);
#endif
  *orig = r.value;
  return r.ok != 0;
}
#endif

inline bool GuardedCompareSwap(uint64_t* p, uint64_t compare, uint64_t swap, uint64_t* orig) {
#if defined(__x86_64__)
  return SeenAsAtomic(p, orig, [&] { return softrdma_guarded_compare_swap(p, compare, swap); });
#else
  *orig = compare;
  __atomic_compare_exchange_n(p, orig, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return true;
#endif
}

inline bool GuardedFetchAdd(uint64_t* p, uint64_t add, uint64_t* orig) {
#if defined(__x86_64__)
  return SeenAsAtomic(p, orig, [&] { return softrdma_guarded_fetch_add(p, add); });
#else
  *orig = __atomic_fetch_add(p, add, __ATOMIC_SEQ_CST);
  return true;
#endif
}

// Whether every page of [p, p + n) can be read now: the source of a READ response, which the
// application may have unmapped or made inaccessible since it registered it (a remote READ must
// not end its process).
inline bool Readable(const void* p, size_t n) {
#if defined(__x86_64__)
  return softrdma_guarded_probe(p, n).ok != 0;
#else
  (void)p, (void)n;
  return true;
#endif
}

// The same for each of `n` pieces of a message (a SEND's or a WRITE's sources, which the
// application may have taken away since it registered them).
inline bool Readable(const uint8_t* const* pieces, const uint32_t* lens, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    if (!Readable(pieces[i], lens[i])) return false;
  return true;
}

// For the fault handler: true when the fault is one of the accesses above, which then returns
// false once the handler returns.
bool ResumeFaultedPlacement(const siginfo_t* info, void* context);

// Reads and writes past the pages' protections (see above): false when refused.
bool ReadIgnoringProtection(void* to, const void* from, size_t n);
bool WriteIgnoringProtection(void* to, const void* from, size_t n);

// PlaceBytes that survives a destination the application made read-only. False when the bytes
// could not be written at all (no /proc/self/mem, say): the caller fails the access.
inline bool PlaceGuarded(void* dst, const void* src, size_t n) {
  return GuardedPlace(dst, src, n) || WriteIgnoringProtection(dst, src, n);
}

// The same for an atomic's eight-byte result.
inline bool StoreGuarded(void* p, uint64_t value) {
  return GuardedStore8(p, value) || WriteIgnoringProtection(p, &value, sizeof value);
}

}  // namespace softrdma::link
