// The process's rsocket fd index: fd number -> socket. An fd is a real descriptor (the socket's
// eventfd), so it never collides with the application's own fds.
#pragma once

#include <memory>

#include "rsocket/socket.h"

namespace softrdma::rsocket {

void AddSocket(std::shared_ptr<Socket> s);
// The socket behind fd, or nullptr with *err set to EBADF (no such fd) or ENOTSOCK (an fd that is
// not an rsocket).
std::shared_ptr<Socket> FindSocket(int fd, int* err);
// Removes fd from the index and returns its socket (nullptr if unknown).
std::shared_ptr<Socket> RemoveSocket(int fd);
bool IsRsocket(int fd);

}  // namespace softrdma::rsocket
