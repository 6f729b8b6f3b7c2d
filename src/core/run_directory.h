// The run directory's own directories (the run directory itself, cm/ and mcast/): made as every
// user's processes share them, and removed by the last process to leave, so that nothing of
// softrdma stays in /dev/shm once none of its processes runs.
//
// A directory may so vanish between a creator's mkdir and its file's creation there: creators
// make it again and retry when that fails with ENOENT. The connection manager's directory is
// removed only under its lock (LockDirectory), which claimants hold while they look for
// conflicting claims and create theirs, so that no claim is made in a directory on its way out
// unchecked against one made in its successor.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/held_file.h"
#include "core/host_identity.h"

namespace softrdma::core {

// Tries at making a file in a directory of the run directory: each retry follows the directory's
// removal by an exiting process, rare.
constexpr int kRunDirectoryTries = 4;

// World-writable and sticky, like /tmp: every user's processes share one LID/QPN space and one
// listener registry. True when `path` is a directory now.
inline bool MakeSharedDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 01777) == 0) chmod(path.c_str(), 01777);
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The run directory's directory `name`, made (with the run directory) when missing; empty when it
// cannot be.
inline std::string MakeRunSubdirectory(const char* name) {
  const std::string run = RunDirectory();
  const std::string sub = run + "/" + name;
  for (int i = 0; i < kRunDirectoryTries; ++i) {
    MakeSharedDirectory(run);
    if (MakeSharedDirectory(sub)) return sub;
  }
  return {};
}

// Locks the directory `path` itself (flock, exclusive), for as long as the descriptor returned
// stays open. -1 when it cannot: EWOULDBLOCK when another holds it (without `wait`), ENOENT when
// the directory is gone, or was removed while we waited for it.
inline int LockDirectory(const std::string& path, bool wait) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int r;
  while ((r = flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB))) != 0 && errno == EINTR) {
  }
  if (r == 0 && NamesFile(fd, path)) return fd;
  const int e = r == 0 ? ENOENT : errno;
  close(fd);
  errno = e;
  return -1;
}

// Removes cm/ and mcast/ of `run` when they are empty, and `run` itself then when `itself`.
// rmdir refuses a directory that is not empty, so whatever a live process holds keeps them.
inline void TidyRunDirectory(const std::string& run, bool itself) {
  const std::string cm = run + "/cm";
  if (int fd = LockDirectory(cm, /*wait=*/false); fd >= 0) {
    unlink((cm + "/.lock").c_str());  // the lock file of versions that did not lock the directory
    rmdir(cm.c_str());
    close(fd);
  }
  rmdir((run + "/mcast").c_str());
  if (itself) rmdir(run.c_str());
}

// At a process's exit, once its own files are gone. The run directory itself only when it is the
// default one: a directory SOFTRDMA_RUNDIR names may be the user's.
inline void TidyRunDirectory() {
  TidyRunDirectory(RunDirectory(), getenv("SOFTRDMA_RUNDIR") == nullptr);
}

}  // namespace softrdma::core
