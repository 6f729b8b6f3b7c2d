#include "rsocket/fd_table.h"

#include <fcntl.h>

#include <cerrno>
#include <mutex>
#include <unordered_map>

namespace softrdma::rsocket {
namespace {

struct Table {
  std::mutex mu;
  std::unordered_map<int, std::shared_ptr<Socket>> sockets;
};

Table& TheTable() {
  static Table* t = new Table;  // never destroyed: sockets may outlive static destruction
  return *t;
}

}  // namespace

void AddSocket(std::shared_ptr<Socket> s) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> g(t.mu);
  t.sockets[s->fd()] = std::move(s);
}

std::shared_ptr<Socket> FindSocket(int fd, int* err) {
  Table& t = TheTable();
  {
    std::lock_guard<std::mutex> g(t.mu);
    auto it = t.sockets.find(fd);
    if (it != t.sockets.end()) return it->second;
  }
  *err = (fd >= 0 && fcntl(fd, F_GETFD) >= 0) ? ENOTSOCK : EBADF;
  return nullptr;
}

std::shared_ptr<Socket> RemoveSocket(int fd) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.sockets.find(fd);
  if (it == t.sockets.end()) return nullptr;
  std::shared_ptr<Socket> s = std::move(it->second);
  t.sockets.erase(it);
  return s;
}

bool IsRsocket(int fd) {
  Table& t = TheTable();
  std::lock_guard<std::mutex> g(t.mu);
  return t.sockets.count(fd) != 0;
}

}  // namespace softrdma::rsocket
