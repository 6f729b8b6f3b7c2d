// Files in the run directory (RunDirectory) that say a process is alive: a slot, a CM claim, a
// multicast membership. The process holds each with flock(LOCK_EX) for as long as it lives and
// removes it when it exits; a file nobody holds belongs to a process that died without its exit
// handlers (killed), and any process may remove it.
//
// Creating and removing race: a remover can take the lock of a file created a moment before its
// creator locks it, and unlink it. The creator therefore checks, once it holds the lock, that the
// path still names its file, and starts again if not; a remover checks the same before unlinking,
// so that it never removes a newer file under the same name.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace softrdma::core {

// True when `path` names the file open as `fd`, not one unlinked and created again meanwhile.
inline bool NamesFile(int fd, const std::string& path) {
  struct stat open_file {
  }, named{};
  return fstat(fd, &open_file) == 0 && stat(path.c_str(), &named) == 0 &&
         open_file.st_ino == named.st_ino && open_file.st_dev == named.st_dev;
}

// Opens `path` (created with `extra_flags`, e.g. O_TRUNC) and locks it exclusively. -1 with errno
// when it cannot; with `nonblock`, also when another process holds it (EWOULDBLOCK).
inline int OpenHeldFile(const std::string& path, int extra_flags, bool nonblock) {
  constexpr int kTries = 16;  // each retry follows a removal by another process: rare
  for (int i = 0; i < kTries; ++i) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | extra_flags, 0644);
    if (fd < 0) return -1;
    int r;
    while ((r = flock(fd, LOCK_EX | (nonblock ? LOCK_NB : 0))) != 0 && errno == EINTR) {
    }
    if (r != 0) {
      const int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    if (NamesFile(fd, path)) return fd;
    close(fd);  // removed as abandoned between our open and our lock: make it again
  }
  errno = EAGAIN;
  return -1;
}

// Removes `path` when no process holds it. `fd`: the file open (any mode), locked by the caller
// (flock, shared or exclusive), which proves that its holder is gone.
inline bool RemoveLockedAbandoned(int fd, const std::string& path) {
  return NamesFile(fd, path) && unlink(path.c_str()) == 0;
}

// Removes `path` when no process holds it; true when removed.
inline bool RemoveIfAbandoned(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool removed = flock(fd, LOCK_EX | LOCK_NB) == 0 && RemoveLockedAbandoned(fd, path);
  close(fd);
  return removed;
}

}  // namespace softrdma::core
