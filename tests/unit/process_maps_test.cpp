// link/process_maps.h: the mappings of a range, asked of the kernel by address (PROCMAP_QUERY) and
// read from the text of /proc/self/maps, must be the same, holes included; so must the answers
// about access to a range, asked of the mappings or by faulting the pages in.
#include "link/process_maps.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

using softrdma::link::CanAccess;
using softrdma::link::ForEachMapping;
using softrdma::link::Mapping;
using softrdma::link::MapsQueryWorks;
using softrdma::link::MapsSource;

struct Seen {
  bool ok = false;
  std::vector<std::string> mappings;
};

// The mappings of [start, end) as one line each; a file's name is left out (the text marks a
// deleted file " (deleted)", the query does not).
Seen Look(uintptr_t start, uintptr_t end, MapsSource source) {
  Seen s;
  s.ok = ForEachMapping(
      start, end,
      [&](const Mapping& m) {
        char line[512];
        std::snprintf(line, sizeof line, "%lx-%lx %s %lx %lu %s",
                      static_cast<unsigned long>(m.start), static_cast<unsigned long>(m.end),
                      m.perms, static_cast<unsigned long>(m.offset),
                      static_cast<unsigned long>(m.inode), m.inode ? "" : m.path);
        s.mappings.push_back(line);
        return true;
      },
      source);
  return s;
}

void ExpectSameBothWays(uintptr_t start, uintptr_t end, const char* what) {
  Seen text = Look(start, end, MapsSource::kText);
  Seen query = Look(start, end, MapsSource::kQuery);
  EXPECT_EQ(query.ok, text.ok) << what;
  EXPECT_EQ(query.mappings, text.mappings) << what;
}

TEST(ProcessMaps, TheQueryAndTheTextAgree) {
  if (!MapsQueryWorks()) GTEST_SKIP() << "this kernel has no PROCMAP_QUERY (Linux 6.11+)";
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Five pages: read-write, read-only, a hole, read-write, shared memory of a file.
  auto* base = static_cast<uint8_t*>(
      mmap(nullptr, 5 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  const auto a = reinterpret_cast<uintptr_t>(base);
  ASSERT_EQ(mprotect(base + page, page, PROT_READ), 0);
  ASSERT_EQ(munmap(base + 2 * page, page), 0);
  int fd = memfd_create("process-maps-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(2 * page)), 0);
  ASSERT_NE(mmap(base + 4 * page, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 static_cast<off_t>(page)),
            MAP_FAILED);
  ExpectSameBothWays(a, a + 2 * page, "two anonymous mappings");
  ExpectSameBothWays(a + page / 2, a + page + 1, "a range starting inside a mapping");
  ExpectSameBothWays(a, a + 4 * page, "across the hole");
  ExpectSameBothWays(a + 3 * page, a + 5 * page, "anonymous, then the file at an offset");
  EXPECT_FALSE(Look(a + 2 * page, a + 3 * page, MapsSource::kQuery).ok) << "the hole itself";
  void* heap = std::malloc(64);
  const auto h = reinterpret_cast<uintptr_t>(heap);
  ExpectSameBothWays(h, h + 1, "the heap");
  std::free(heap);
  munmap(base, 5 * page);
  close(fd);
}

// What an access to application memory may do (the check before a region on demand is touched,
// and at registration): a read needs a readable mapping, a write a writable one, and a hole fails
// both; asked of the mappings and by faulting the pages in, with the same answers.
TEST(ProcessMaps, AccessIsAskedOfEveryMappingTheRangeCovers) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Five pages: read-write, read-only, nothing allowed, a hole, read-write.
  auto* base = static_cast<uint8_t*>(
      mmap(nullptr, 5 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  ASSERT_EQ(mprotect(base + page, page, PROT_READ), 0);
  ASSERT_EQ(mprotect(base + 2 * page, page, PROT_NONE), 0);
  ASSERT_EQ(munmap(base + 3 * page, page), 0);
  std::vector<MapsSource> ways = {MapsSource::kText};
  if (MapsQueryWorks()) ways.push_back(MapsSource::kQuery);
  for (MapsSource way : ways) {
    const char* how = way == MapsSource::kQuery ? "asked of the mappings" : "by faulting in";
    EXPECT_TRUE(CanAccess(base, page, true, way)) << how;
    EXPECT_TRUE(CanAccess(base + 10, page, false, way)) << how << ": read-write, then read-only";
    EXPECT_FALSE(CanAccess(base + 10, page, true, way)) << how;
    EXPECT_TRUE(CanAccess(base + page, page, false, way)) << how;
    EXPECT_FALSE(CanAccess(base + page + 1, 1, true, way)) << how;
    EXPECT_FALSE(CanAccess(base + 2 * page, 1, false, way)) << how << ": PROT_NONE";
    EXPECT_FALSE(CanAccess(base + 3 * page, 1, false, way)) << how << ": the hole";
    EXPECT_FALSE(CanAccess(base, 5 * page, false, way)) << how << ": across all";
    EXPECT_TRUE(CanAccess(base + 4 * page, page, true, way)) << how;
    EXPECT_TRUE(CanAccess(base + 2 * page, 0, true, way)) << how << ": nothing to touch";
  }
  munmap(base, 5 * page);
}

// The descriptor the queries keep open may be closed under them (a daemon closing every descriptor
// it did not open): the next question opens another.
TEST(ProcessMaps, TheQueryOutlivesItsDescriptorBeingClosed) {
  if (!MapsQueryWorks()) GTEST_SKIP() << "this kernel has no PROCMAP_QUERY (Linux 6.11+)";
  int probe = 0;
  const auto at = reinterpret_cast<uintptr_t>(&probe);
  ASSERT_TRUE(Look(at, at + 1, MapsSource::kQuery).ok);  // opens it, if nothing did before
  int closed = 0;
  for (int fd = 3; fd < 1024; ++fd) {
    char link[64];
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    if (n > 0 && std::string(link, static_cast<size_t>(n)).find("/maps") != std::string::npos)
      closed += close(fd) == 0;
  }
  ASSERT_GT(closed, 0) << "no descriptor of the maps file was open";
  EXPECT_TRUE(Look(at, at + 1, MapsSource::kQuery).ok);
}

}  // namespace

// The descriptor is kept per process: a fork child that asked through its parent's would be told
// about the parent's memory (a mapping made after the fork would read as a hole).
TEST(ProcessMaps, AForkChildAsksAboutItsOwnMemory) {
  if (!MapsQueryWorks()) GTEST_SKIP() << "this kernel has no PROCMAP_QUERY (Linux 6.11+)";
  int probe = 0;
  ASSERT_TRUE(CanAccess(&probe, sizeof probe, true, MapsSource::kQuery));  // the parent's is open
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const long page = sysconf(_SC_PAGESIZE);
    void* fresh = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    _exit(fresh != MAP_FAILED && CanAccess(fresh, 1, true, MapsSource::kQuery) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's new mapping read as a hole";
}
