#include "rsocket/create.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <memory>

#include "rsocket/dgram_socket.h"
#include "rsocket/fd_table.h"
#include "rsocket/stream_socket.h"

namespace softrdma::rsocket {

int Create(int domain, int type, int protocol) {
  if (domain != AF_INET && domain != AF_INET6) return -EAFNOSUPPORT;
  int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  std::shared_ptr<Socket> s;
  if (kind == SOCK_STREAM) {
    if (protocol != 0 && protocol != IPPROTO_TCP) return -EPROTONOSUPPORT;
    auto st = std::make_shared<StreamSocket>(domain);
    if (int r = st->Init()) {
      st->Close();
      return r;
    }
    s = std::move(st);
  } else if (kind == SOCK_DGRAM) {
    if (protocol != 0 && protocol != IPPROTO_UDP) return -EPROTONOSUPPORT;
    s = std::make_shared<DgramSocket>(domain);
    if (s->fd() < 0) return -EMFILE;
  } else {
    return -EPROTONOSUPPORT;
  }
  if (type & SOCK_NONBLOCK) s->Fcntl(F_SETFL, O_NONBLOCK);
  int fd = s->fd();
  AddSocket(std::move(s));
  return fd;
}

int Destroy(int fd) {
  std::shared_ptr<Socket> s = RemoveSocket(fd);
  if (!s) {
    int err = 0;
    FindSocket(fd, &err);
    return -err;
  }
  s->Close();
  return 0;
}

}  // namespace softrdma::rsocket
