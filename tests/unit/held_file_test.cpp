// Files that say a process is alive (core/held_file.h): held by a lock, removed by anyone once
// nobody holds them, and made again by a creator whose new file was removed before it locked it.
#include "core/held_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include "core/host_identity.h"
#include "support/scratch_directory.h"

namespace {

using softrdma::core::NamesFile;
using softrdma::core::OpenHeldFile;
using softrdma::core::RemoveIfAbandoned;

class HeldFile : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    path_ = dir_.path() + "/claim";
  }
  bool Exists() const { return std::filesystem::exists(path_); }

  support::ScratchDirectory dir_{"held-file"};
  std::string path_;
};

TEST_F(HeldFile, AHeldFileStaysAndAnAbandonedOneGoes) {
  int fd = OpenHeldFile(path_, 0, /*nonblock=*/false);
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(RemoveIfAbandoned(path_));  // flock conflicts across open files, even in-process
  EXPECT_TRUE(Exists());
  close(fd);  // as a killed holder's lock goes
  EXPECT_TRUE(RemoveIfAbandoned(path_));
  EXPECT_FALSE(Exists());
}

TEST_F(HeldFile, ANonblockingOpenOfAHeldFileFails) {
  int fd = OpenHeldFile(path_, 0, /*nonblock=*/false);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(OpenHeldFile(path_, 0, /*nonblock=*/true), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);
  close(fd);
}

// A remover took the lock of the file the creator had just opened, and removed it: the creator,
// once it gets the lock, holds a file nobody can find. It must make the file again.
TEST_F(HeldFile, ACreatorWhoseFileWasRemovedBeforeItsLockMakesItAgain) {
  int remover = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(remover, 0);
  ASSERT_EQ(flock(remover, LOCK_EX), 0);
  auto created = std::async(std::launch::async, [&] { return OpenHeldFile(path_, 0, false); });
  // The creator has opened the file and waits for its lock (bounded: it cannot finish meanwhile).
  ASSERT_EQ(created.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_EQ(unlink(path_.c_str()), 0);
  close(remover);
  int fd = created.get();
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(Exists()) << "the creator holds a file that is no longer in the directory";
  EXPECT_TRUE(NamesFile(fd, path_));
  EXPECT_FALSE(RemoveIfAbandoned(path_));
  close(fd);
}

TEST_F(HeldFile, ARemoverLeavesANewerFileUnderTheSameName) {
  int old_fd = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(old_fd, 0);
  ASSERT_EQ(flock(old_fd, LOCK_EX), 0);  // a remover, about to remove the file it locked
  ASSERT_EQ(unlink(path_.c_str()), 0);   // ...which another remover removed meanwhile
  int fresh = OpenHeldFile(path_, 0, /*nonblock=*/true);
  ASSERT_GE(fresh, 0);
  EXPECT_FALSE(softrdma::core::RemoveLockedAbandoned(old_fd, path_));
  EXPECT_TRUE(Exists());
  close(old_fd);
  close(fresh);
}

}  // namespace
