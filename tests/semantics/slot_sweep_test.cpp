// A process killed before its exit handler leaves its slot file in the run directory; the next
// process that starts removes it (nobody holds its lock), so killed programs leave nothing behind
// in /dev/shm for long.
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "core/host_identity.h"
#include "support/semantics_harness.h"

#include <string>

namespace {

TEST(SlotSweep, AStaleSlotFileIsRemovedByTheNextProcess) {
  std::string path = softrdma::core::RunDirectory() + "/slot-2046";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "softrdma-slot 1\nport 1\n", 23), 23);
  close(fd);  // unlocked: its process is gone
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ibv_context* ctx = semantics::OpenFirstDevice();  // a fresh device: claims a slot, sweeps
    _exit(ctx ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_NE(access(path.c_str(), F_OK), 0) << path << " is still there";
}

}  // namespace
