// Where softrdma processes of one host meet without a daemon, and which network namespace (which
// "host", for addressing) the calling process is in. Shared by the verbs addressing (slots) and
// the connection manager (listener registry), which live in different libraries.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace softrdma::core {

// SOFTRDMA_RUNDIR, else /dev/shm/softrdma.
inline std::string RunDirectory() {
  if (const char* d = getenv("SOFTRDMA_RUNDIR")) return d;
  return "/dev/shm/softrdma";
}

// Network namespace identity (inode of /proc/self/ns/net).
inline uint64_t NetnsId() {
  struct stat st;
  if (stat("/proc/self/ns/net", &st) != 0) return 0;
  return st.st_ino;
}

}  // namespace softrdma::core
