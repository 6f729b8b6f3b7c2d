// Whether this build runs under a sanitizer. Code that ThreadSanitizer cannot follow (a futex's
// exclusion, ordering through raw system calls) picks another way under it; tests whose limits are
// measured in time relax them under either (both are several times slower).
#pragma once

// GCC says __SANITIZE_*__; clang answers __has_feature.
#if defined(__has_feature)
#define SOFTRDMA_HAS_FEATURE(x) __has_feature(x)
#else
#define SOFTRDMA_HAS_FEATURE(x) 0
#endif

#if defined(__SANITIZE_ADDRESS__) || SOFTRDMA_HAS_FEATURE(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#endif

namespace softrdma {

#if defined(__SANITIZE_THREAD__) || SOFTRDMA_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__) || SOFTRDMA_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// An object left allocated on purpose (what a fork() child inherits of the parent's HCA): its leak
// checker must not report it, nor what it points to. It used to be found only through stale
// copies of its address on the child's stack, so a deeper fork handler made the report appear.
inline void KeepOnPurpose(const void* p) {
#if defined(__SANITIZE_ADDRESS__) || SOFTRDMA_HAS_FEATURE(address_sanitizer)
  if (p) __lsan_ignore_object(p);
#else
  (void)p;
#endif
}

}  // namespace softrdma
