// Whether this build runs under ThreadSanitizer. Code that TSan cannot follow (a futex's
// exclusion, ordering through raw system calls) or that it slows beyond use picks another way then.
#pragma once

namespace softrdma {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

}  // namespace softrdma
