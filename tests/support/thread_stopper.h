// Stops one thread of this process (the progress thread, for tests of what other threads do
// without it): a forked child traces it with PTRACE_SEIZE and PTRACE_INTERRUPT, which stop that
// thread alone while the rest of the process runs on.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "link/endpoint.h"

namespace semantics {

// The thread of this process named softrdma's progress thread, or 0.
inline pid_t ProgressThread() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  pid_t found = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == softrdma::link::kProgressThreadName)
      found = static_cast<pid_t>(std::stoi(e->d_name));
  }
  closedir(d);
  return found;
}

inline bool IsEventWait(long nr) {
#ifdef SYS_epoll_wait
  if (nr == SYS_epoll_wait) return true;
#endif
#ifdef SYS_poll
  if (nr == SYS_poll) return true;
#endif
#ifdef SYS_epoll_pwait2
  if (nr == SYS_epoll_pwait2) return true;
#endif
  return nr == SYS_epoll_pwait || nr == SYS_ppoll;
}

// Keeps one thread of this process stopped, from a child that traces it (PTRACE_INTERRUPT stops
// the thread alone; the rest of the process runs on). Stopped only where it waits for events,
// holding no lock; released by Release or when the stopper goes.
class ThreadStopper {
 public:
  // Empty when stopped; else why not.
  std::string Stop(pid_t tid) {
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC) != 0) return "pipe";
    if (pipe2(down, O_CLOEXEC) != 0) {
      close(up[0]);
      close(up[1]);
      return "pipe";
    }
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY);  // where Yama asks a tracer to be named
    pid_ = fork();
    if (pid_ < 0) {
      for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
      prctl(PR_SET_PTRACER, 0);
      return "fork";
    }
    if (pid_ == 0) {
      alarm(30);
      close(up[0]);
      close(down[1]);
      char verdict = 'E';
      for (int attempt = 0; attempt < 100; ++attempt) {
        if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) break;
        int st;
        if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0 ||
            waitpid(tid, &st, __WALL) != tid) {
          verdict = 'W';
          break;
        }
        std::ifstream sc("/proc/" + std::to_string(tid) + "/syscall");
        long nr = -1;
        sc >> nr;
        if (IsEventWait(nr)) {
          verdict = 'S';
          break;
        }
        ptrace(PTRACE_DETACH, tid, nullptr, nullptr);  // busy: try again when it waits
        usleep(10000);
        verdict = 'B';
      }
      if (write(up[1], &verdict, 1) != 1 || verdict != 'S') _exit(1);
      char go;
      if (read(down[0], &go, 1) < 0) _exit(2);
      ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
      _exit(0);
    }
    close(up[1]);
    close(down[0]);
    to_child_ = down[1];
    char verdict = 0;
    const bool told = read(up[0], &verdict, 1) == 1;
    close(up[0]);
    if (told && verdict == 'S') return "";
    Release();
    return told && verdict == 'E' ? std::string("ptrace refused here")
                                  : std::string("could not stop the thread (") + verdict + ")";
  }
  void Release() {
    if (to_child_ >= 0) {
      char go = 'r';
      if (write(to_child_, &go, 1) != 1) kill(pid_, SIGKILL);
      close(to_child_);
      to_child_ = -1;
    }
    if (pid_ > 0) {
      int st;
      waitpid(pid_, &st, 0);
      pid_ = -1;
      prctl(PR_SET_PTRACER, 0);
    }
  }
  ~ThreadStopper() { Release(); }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
};

}  // namespace semantics
