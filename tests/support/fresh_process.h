// Runs one test of this binary in fresh processes: a process that never had a thread before, which
// is what a hazard of start-up (a library's first thread still starting when the program forks)
// needs. The test's own expectations decide each run.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <initializer_list>
#include <string>
#include <thread>

#include "link/sanitizers.h"

namespace semantics {

// ThreadSanitizer guards its own allocator across fork(), and a fresh process of this binary
// takes it about a second to start: the fresh-process tests skip under it.
constexpr bool kFreshRunsSkipped = softrdma::kThreadSanitizer;

// How many of `rounds` runs of `test` (a full GoogleTest name) failed or outlived `bound`.
// `env` ("NAME=value" each) is set in the fresh processes only; `prepare`, when given, runs in
// each of them before the test binary starts (what it sets up must survive execve), and a run
// counts as failed when it returns false.
inline int FailedFreshRuns(const std::string& test, int rounds, std::chrono::seconds bound,
                           std::initializer_list<const char*> env = {},
                           bool (*prepare)() = nullptr) {
  int failed = 0;
  std::string filter = "--gtest_filter=" + test;
  for (int i = 0; i < rounds; ++i) {
    pid_t pid = fork();
    if (pid < 0) return rounds;
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      for (const char* e : env) putenv(const_cast<char*>(e));
      if (prepare && !prepare()) _exit(126);
      execl("/proc/self/exe", "softrdma_tests", filter.c_str(), nullptr);
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + bound;
    int st = 0;
    pid_t r;
    while ((r = waitpid(pid, &st, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (r != pid) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      ++failed;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ++failed;
    }
  }
  return failed;
}

}  // namespace semantics
