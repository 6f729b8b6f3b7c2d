// The run directory's own directories (core/run_directory.h): removed at exit when nothing in them
// is held, kept while anything is, and the CM's only under its lock.
#include "core/run_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include "core/held_file.h"
#include "support/scratch_directory.h"

namespace {

using softrdma::core::LockDirectory;
using softrdma::core::MakeSharedDirectory;
using softrdma::core::OpenHeldFile;
using softrdma::core::TidyRunDirectory;

class RunDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(scratch_.path().empty());
    run_ = scratch_.path() + "/run";
    ASSERT_TRUE(MakeSharedDirectory(run_));
    ASSERT_TRUE(MakeSharedDirectory(run_ + "/cm"));
    ASSERT_TRUE(MakeSharedDirectory(run_ + "/mcast"));
  }
  static bool Exists(const std::string& path) { return std::filesystem::exists(path); }

  support::ScratchDirectory scratch_{"run-directory"};
  std::string run_;
};

TEST_F(RunDirectory, EmptyDirectoriesAndAnEarlierVersionsLockFileGo) {
  const int old_lock = OpenHeldFile(run_ + "/cm/.lock", 0, /*nonblock=*/true);
  ASSERT_GE(old_lock, 0);
  close(old_lock);
  TidyRunDirectory(run_, /*itself=*/true);
  EXPECT_FALSE(Exists(run_ + "/cm"));
  EXPECT_FALSE(Exists(run_ + "/mcast"));
  EXPECT_FALSE(Exists(run_));
}

TEST_F(RunDirectory, ARunDirectoryNotOursToRemoveStays) {
  TidyRunDirectory(run_, /*itself=*/false);
  EXPECT_FALSE(Exists(run_ + "/cm"));
  EXPECT_FALSE(Exists(run_ + "/mcast"));
  EXPECT_TRUE(Exists(run_));
}

TEST_F(RunDirectory, WhatALiveProcessHoldsKeepsItsDirectories) {
  const int claim = OpenHeldFile(run_ + "/cm/claim", 0, /*nonblock=*/true);
  ASSERT_GE(claim, 0);
  TidyRunDirectory(run_, /*itself=*/true);
  EXPECT_TRUE(Exists(run_ + "/cm/claim"));
  EXPECT_FALSE(Exists(run_ + "/mcast"));  // empty: goes
  EXPECT_TRUE(Exists(run_));
  close(claim);
}

// A claimant holds the lock from its check for conflicts until its claim file exists: the
// directory, empty meanwhile, must stay.
TEST_F(RunDirectory, TheCmDirectoryStaysWhileItsLockIsHeld) {
  const int lock = LockDirectory(run_ + "/cm", /*wait=*/false);
  ASSERT_GE(lock, 0);
  TidyRunDirectory(run_, /*itself=*/true);
  EXPECT_TRUE(Exists(run_ + "/cm"));
  close(lock);
  TidyRunDirectory(run_, /*itself=*/true);
  EXPECT_FALSE(Exists(run_));
}

TEST_F(RunDirectory, ALockOnADirectoryThatIsGoneFailsWithEnoent) {
  const int lock = LockDirectory(run_ + "/cm", /*wait=*/false);
  ASSERT_GE(lock, 0);
  errno = 0;
  EXPECT_EQ(LockDirectory(run_ + "/cm", /*wait=*/false), -1);  // held: a claimant must wait
  EXPECT_EQ(errno, EWOULDBLOCK);
  close(lock);
  ASSERT_EQ(rmdir((run_ + "/cm").c_str()), 0);
  errno = 0;
  EXPECT_EQ(LockDirectory(run_ + "/cm", /*wait=*/true), -1);
  EXPECT_EQ(errno, ENOENT);
}

// A claimant waiting for the lock while the holder removes the directory gets a lock on nothing:
// it must learn so (and make the directory again), not create its claim in a directory that is
// gone or in a successor it never checked.
TEST_F(RunDirectory, AWaiterWhoseDirectoryWasRemovedMeanwhileIsTold) {
  const std::string cm = run_ + "/cm";
  const int held = LockDirectory(cm, /*wait=*/false);
  ASSERT_GE(held, 0);
  auto waiter = std::async(std::launch::async, [&] {
    const int fd = LockDirectory(cm, /*wait=*/true);
    const int e = errno;
    if (fd >= 0) close(fd);
    return fd < 0 ? e : 0;
  });
  // Long enough for the waiter to be in flock (bounded: the result is the same if it is not).
  EXPECT_EQ(waiter.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_EQ(rmdir(cm.c_str()), 0);
  close(held);
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(waiter.get(), ENOENT);
}

}  // namespace
