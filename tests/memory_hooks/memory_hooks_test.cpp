// Registration under UCX's memory hooks (libucm). ibv_reg_mr moves a large buffer's pages onto
// shared memory in place, and deregistration moves them back (link/shared_memory.h): the same
// addresses and contents, so nothing the application sees. UCM patches mmap, munmap and mremap
// and reports each as an unmapping of its range; UCX's registration cache then dropped the region
// it had just registered, and MPI over UCX registered (and moved) its rendezvous buffer anew for
// every message: Open MPI's 1 MiB ping-pong took 11–18 ms a message one way instead of 0.17 on
// this VM. A binary of its own: the hooks, once set, patch the whole process.
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <ucm/api/ucm.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

namespace {

std::atomic<uintptr_t> g_lo{0}, g_hi{0};
std::atomic<int> g_unmapped{0};

void OnUnmapped(ucm_event_type_t, ucm_event_t* e, void*) {
  const auto a = reinterpret_cast<uintptr_t>(e->vm_unmapped.address);
  if (a < g_hi.load() && a + e->vm_unmapped.size > g_lo.load()) ++g_unmapped;
}

void Watch(const void* p, size_t len) {
  g_unmapped = 0;
  g_lo = reinterpret_cast<uintptr_t>(p);
  g_hi = reinterpret_cast<uintptr_t>(p) + len;
}

// The name of the mapping that holds `p` in /proc/self/maps ("" for anonymous memory).
std::string MappingOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2 || a < lo || a >= hi) continue;
    const size_t slash = line.find('/');
    return slash == std::string::npos ? "" : line.substr(slash);
  }
  return "?";
}

TEST(MemoryHooks, RegisteringABufferUnmapsNothingForUcm) {
  ASSERT_EQ(ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, OnUnmapped, nullptr), UCS_OK);
  constexpr size_t kLen = size_t{1} << 20;

  // The hook is live: an application's munmap is seen.
  void* probe = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(probe, MAP_FAILED);
  Watch(probe, kLen);
  ASSERT_EQ(munmap(probe, kLen), 0);
  ASSERT_GE(g_unmapped.load(), 1) << "UCM's hooks saw no munmap: the test would prove nothing";

  auto* buf = static_cast<uint8_t*>(
      mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(buf, MAP_FAILED);
  std::memset(buf, 0x5a, kLen);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_GT(n, 0);
  ibv_context* ctx = ibv_open_device(list[0]);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);

  Watch(buf, kLen);
  ibv_mr* mr = ibv_reg_mr(
      pd, buf, kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr, nullptr);
  EXPECT_NE(MappingOf(buf).find("softrdma-mem"), std::string::npos)
      << "the pages were not moved onto shared memory: nothing was tested";
  EXPECT_EQ(g_unmapped.load(), 0) << "ibv_reg_mr looked like an munmap of the buffer to UCM";

  Watch(buf, kLen);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(g_unmapped.load(), 0) << "ibv_dereg_mr looked like an munmap of the buffer to UCM";
  EXPECT_EQ(MappingOf(buf).find("softrdma-mem"), std::string::npos);
  EXPECT_EQ(buf[0], 0x5a);
  EXPECT_EQ(buf[kLen - 1], 0x5a);

  g_lo = g_hi = 0;
  ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, OnUnmapped, nullptr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  munmap(buf, kLen);
}

}  // namespace
