// rpoll / rselect over a mix of rsockets and ordinary file descriptors.
#pragma once

#include <poll.h>
#include <sys/select.h>

namespace softrdma::rsocket {

// poll(2) semantics; returns the number of ready entries or -errno.
int Poll(pollfd* fds, nfds_t nfds, int timeout_ms);
// select(2) semantics on top of Poll; timeout is updated with the time left.
int Select(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout);

}  // namespace softrdma::rsocket
