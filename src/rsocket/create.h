// Creating and closing rsockets: the two operations that add to and remove from the fd index.
#pragma once

namespace softrdma::rsocket {

// rsocket(2 args of socket(2)); returns the new fd or -errno.
int Create(int domain, int type, int protocol);
// rclose; returns 0 or -errno.
int Destroy(int fd);

}  // namespace softrdma::rsocket
