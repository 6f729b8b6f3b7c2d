// Sockets softrdma opens for itself: its links' connections and listeners, the CM's service and
// route lookups.
//
// They are made by the system call, never by a socket() that a program interposes. librspreload
// (rsocket(7)'s preload library, over this very librdmacm) turns every socket() of the process
// into an rsocket, ours included: the first rbind opened the device under the CM's lock, the
// device opened the TCP link's listener, and that socket() came back into rsocket() and waited
// for the same lock. The preload's other wrappers pass descriptors it did not make straight
// through.
//
// Under ThreadSanitizer the wrapper stays: its interceptor is where it learns of the descriptor
// (link/plain_syscall.h says why that matters).
#pragma once

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "link/sanitizers.h"

namespace softrdma::sys {

// As socket(2): the descriptor, or -1 with errno set.
inline int OwnSocket(int domain, int type, int protocol) {
  if constexpr (kThreadSanitizer) return ::socket(domain, type, protocol);
  return static_cast<int>(syscall(SYS_socket, domain, type, protocol));
}

}  // namespace softrdma::sys
