// This process's id without a system call. glibc caches nothing since 2.25, and getpid() costs
// ~250 ns here: on the path of every access to a region on demand (which descriptor of
// /proc/self/maps to ask) it was a fifth of the check. A fork() child learns its own from a
// pthread_atfork handler; a child made by a raw clone() system call, which runs no handlers, is not
// told (nothing of ours runs in one).
#pragma once

#include <sys/types.h>

namespace softrdma::link {

pid_t ProcessId();

}  // namespace softrdma::link
