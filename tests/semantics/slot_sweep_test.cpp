// A process killed before its exit handler leaves its slot file in the run directory; the next
// process that starts removes it (nobody holds its lock), so killed programs leave nothing behind
// in /dev/shm for long.
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "core/limits.h"
#include "support/semantics_harness.h"

#include <filesystem>
#include <string>

namespace {

// A run directory of this test's own: in the suite's shared one, a process running beside it
// (ctest -j) may claim the stale slot as its own or be sweeping it at the same moment.
class PrivateRunDirectory {
 public:
  PrivateRunDirectory() {
    char templ[] = "/tmp/softrdma-slot-sweep-XXXXXX";
    if (mkdtemp(templ)) path_ = templ;
  }
  ~PrivateRunDirectory() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(SlotSweep, AStaleSlotFileIsRemovedByTheNextProcess) {
  PrivateRunDirectory dir;
  ASSERT_FALSE(dir.path().empty());
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("SOFTRDMA_RUNDIR", dir.path().c_str(), 1);
    // Not the slot this process claims first (its pid picks that one), which would be taken
    // over rather than swept.
    uint32_t own = static_cast<uint32_t>(getpid()) % softrdma::core::kMaxSlot + 1;
    uint32_t stale = own % softrdma::core::kMaxSlot + 1;
    std::string path = dir.path() + "/slot-" + std::to_string(stale);
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, "softrdma-slot 1\nport 1\n", 23) != 23) _exit(2);
    close(fd);  // unlocked: its process is gone
    if (write(pipefd[1], &stale, sizeof stale) != sizeof stale) _exit(3);
    ibv_context* ctx = semantics::OpenFirstDevice();  // a fresh device: claims a slot, sweeps
    _exit(ctx ? 0 : 1);
  }
  close(pipefd[1]);
  uint32_t stale = 0;
  ASSERT_EQ(read(pipefd[0], &stale, sizeof stale), static_cast<ssize_t>(sizeof stale));
  close(pipefd[0]);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  std::string path = dir.path() + "/slot-" + std::to_string(stale);
  EXPECT_NE(access(path.c_str(), F_OK), 0) << path << " is still there";
}

}  // namespace
