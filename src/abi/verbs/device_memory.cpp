// Device memory (ibv_alloc_dm(3), ibv_reg_dm_mr(3)): on an HCA, memory on the adapter that work
// requests reach without crossing PCIe. Here it is memory of the library's own, which the
// application reaches only through ibv_memcpy_to_dm / ibv_memcpy_from_dm and regions registered
// zero-based over it (local pieces name offsets into it, as on mlx5).
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "abi/verbs/objects.h"

namespace softrdma::abi {
namespace {

bool InBounds(const VerbsDm* dm, uint64_t offset, size_t length) {
  return offset <= dm->length && length <= dm->length - offset;
}

// The errors of mlx5's copies, the device memory programs are written for: a range outside the
// allocation is EFAULT, then an offset or length that is not a multiple of 4 bytes EINVAL (its
// hardware moves 4-byte words; pyverbs' test_dm_write_bad_flow expects the refusal).
int CopyError(const VerbsDm* dm, uint64_t offset, size_t length) {
  if (!InBounds(dm, offset, length)) return EFAULT;
  return ((offset | length) & 3) ? EINVAL : 0;
}

int MemcpyToDm(ibv_dm* dm, uint64_t offset, const void* host, size_t length) {
  VerbsDm* d = VerbsDm::From(dm);
  if (int e = CopyError(d, offset, length)) return e;
  std::memcpy(d->mem + offset, host, length);
  return 0;
}

int MemcpyFromDm(void* host, ibv_dm* dm, uint64_t offset, size_t length) {
  VerbsDm* d = VerbsDm::From(dm);
  if (int e = CopyError(d, offset, length)) return e;
  std::memcpy(host, d->mem + offset, length);
  return 0;
}

}  // namespace

ibv_dm* AllocDm(ibv_context* ctx, ibv_alloc_dm_attr* attr) {
  if (!ctx || !attr || attr->comp_mask || attr->length == 0) return Fail<ibv_dm>(EINVAL);
  // Page-aligned: any log_align_req up to a page holds.
  if (attr->length > kMaxDeviceMemory || attr->log_align_req > 12) return Fail<ibv_dm>(ENOMEM);
  void* mem =
      mmap(nullptr, attr->length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return Fail<ibv_dm>(ENOMEM);
  auto* dm = new VerbsDm{};
  dm->ibv.context = ctx;
  dm->ibv.memcpy_to_dm = MemcpyToDm;
  dm->ibv.memcpy_from_dm = MemcpyFromDm;
  dm->mem = static_cast<uint8_t*>(mem);
  dm->length = attr->length;
  return &dm->ibv;
}

int FreeDm(ibv_dm* dm) {
  if (!dm) return EINVAL;
  VerbsDm* d = VerbsDm::From(dm);
  if (d->users.load() > 0) return EBUSY;  // regions are registered over it
  munmap(d->mem, d->length);
  delete d;
  return 0;
}

ibv_mr* RegDmMr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access) {
  constexpr unsigned kAllowed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                IBV_ACCESS_ZERO_BASED;
  // Zero-based only, as ibv_reg_dm_mr(3) requires. An empty region is one (mlx5 registers it, and
  // pyverbs' test_create_dm_mr makes one): no access but an empty one reaches through it.
  if (!pd || !dm || !(access & IBV_ACCESS_ZERO_BASED) || (access & ~kAllowed))
    return Fail<ibv_mr>(EINVAL);
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE))
    return Fail<ibv_mr>(EINVAL);
  VerbsDm* d = VerbsDm::From(dm);
  if (!InBounds(d, offset, length)) return Fail<ibv_mr>(EINVAL);
  VerbsPd* p = VerbsPd::From(pd);
  core::Mr m{};
  m.pd = &p->core;
  m.addr = d->mem + offset;
  m.length = length;
  m.iova = 0;
  m.access = static_cast<int>(access);
  m.device_memory = true;
  const uint32_t key = CoreOf(pd->context).hca().mrs().Insert(m);
  return VerbsMr::Make(pd, key, nullptr, length, d);  // addr 0: zero-based
}

}  // namespace softrdma::abi
