// A process killed before its exit handler leaves its slot file in the run directory; the next
// process that starts removes it (nobody holds its lock), so killed programs leave nothing behind
// in /dev/shm for long.
#include <infiniband/verbs.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "core/limits.h"
#include "core/xrc_targets.h"
#include "support/scratch_directory.h"
#include "support/semantics_harness.h"

#include <string>

namespace {

TEST(SlotSweep, AStaleSlotFileIsRemovedByTheNextProcess) {
  // Its own run directory: in the suite's, a process running beside it (ctest -j) may claim the
  // stale slot as its own or be sweeping it at the same moment.
  support::ScratchDirectory dir("slot-sweep");
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

// A pid that is nobody's: a child that has exited and been reaped.
pid_t GonePid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int st = 0;
  waitpid(pid, &st, 0);
  return pid;
}

// An XRC target table file (core/xrc_targets.h) with one target held by `holder`.
bool WriteTargetTable(const std::string& path, int32_t holder) {
  using softrdma::core::TargetRecord;
  using softrdma::core::TargetTable;
  constexpr size_t kBytes = sizeof(TargetRecord) * TargetTable::kRecords;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, kBytes) != 0) return false;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return false;
  auto* records = static_cast<TargetRecord*>(p);
  records[3].qpn.store(0x1234);
  records[3].holders[5] = TargetRecord::Holder{holder, 7, 1};
  munmap(p, kBytes);
  return true;
}

// Killed holders leave the XRC target table of their domain behind (only the last holder's exit
// handler removes it); the next process removes it as it does stale slots, and leaves alone a
// table a live process holds.
TEST(SlotSweep, AnXrcTableOnlyKilledProcessesHeldIsRemovedByTheNextProcess) {
  support::ScratchDirectory dir("xrc-sweep");
  ASSERT_FALSE(dir.path().empty());
  const std::string uid = std::to_string(getuid());
  const std::string abandoned = dir.path() + "/xrcd-" + uid + "-1-2";
  const std::string held = dir.path() + "/xrcd-" + uid + "-1-3";
  ASSERT_TRUE(WriteTargetTable(abandoned, GonePid()));
  ASSERT_TRUE(WriteTargetTable(held, getpid()));
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("SOFTRDMA_RUNDIR", dir.path().c_str(), 1);
    _exit(semantics::OpenFirstDevice() ? 0 : 1);  // claims a slot, sweeps
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_NE(access(abandoned.c_str(), F_OK), 0) << abandoned << " is still there";
  EXPECT_EQ(access(held.c_str(), F_OK), 0) << "a table a live process holds was removed";
}

}  // namespace
