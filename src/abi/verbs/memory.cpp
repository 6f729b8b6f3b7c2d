// Protection domains and memory regions.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "abi/export.h"
#include "abi/verbs/objects.h"
#include "link/process_maps.h"

// verbs.h turns these into inline dispatchers; here we define the exported functions themselves.
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace softrdma;
using namespace softrdma::abi;

namespace {

// Bits 20..29 are "optional": a provider that does not know one ignores it (verbs.h).
constexpr unsigned kOptionalAccessRange = 0x3ff00000u;
constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                  IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;

int CheckAccess(unsigned access) {
  if (access & ~(kKnownAccess | kOptionalAccessRange)) return EINVAL;
  // Remote writes and atomics modify memory, which needs local write permission (ibv_reg_mr(3)).
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}

// An implicit on-demand region: the whole address space, by the one (addr, length) pair that
// names it (ibv_reg_mr(3)).
bool IsImplicitOnDemand(const void* addr, size_t length, unsigned access) {
  return !addr && length == SIZE_MAX && (access & IBV_ACCESS_ON_DEMAND);
}

// Whether the pages of an ordinary region exist with the protection its access needs: the kernel
// pins them, for writing when the region may be written (ib_access_writable), and says EFAULT
// otherwise; unchecked, a peer's WRITE into a read-only page crashed the responder.
bool PagesUsable(const void* addr, size_t length, unsigned access) {
  constexpr unsigned kWritable = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
  return (access & IBV_ACCESS_ON_DEMAND) || link::CanAccess(addr, length, access & kWritable);
}

}  // namespace

SOFTRDMA_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (!context) return Fail<ibv_pd>(EINVAL);
  auto* pd = new VerbsPd{};
  pd->ibv.context = context;
  pd->core.handle = CoreOf(context).hca().NewPdHandle();
  pd->ibv.handle = pd->core.handle;
  return &pd->ibv;
}

SOFTRDMA_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return EINVAL;
  VerbsPd* p = VerbsPd::From(pd);
  if (p->users.load() > 0) return EBUSY;
  delete p;
  return 0;
}

SOFTRDMA_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                         unsigned int access) {
  if (!pd || length == 0 || (!addr && !IsImplicitOnDemand(addr, length, access)))
    return Fail<ibv_mr>(EINVAL);
  // A range that wraps the address space does not exist (the kernel's ib_umem_get says EINVAL);
  // accepted, an in-bounds remote offset would land below `addr`.
  if (length > UINTPTR_MAX - reinterpret_cast<uintptr_t>(addr)) return Fail<ibv_mr>(EINVAL);
  if (int r = CheckAccess(access)) return Fail<ibv_mr>(r);
  // On-demand pages need not exist until used.
  if (!PagesUsable(addr, length, access)) return Fail<ibv_mr>(EFAULT);
  VerbsPd* p = VerbsPd::From(pd);
  core::Hca& hca = CoreOf(pd->context).hca();
  core::Mr m{};
  m.pd = &p->core;
  m.addr = static_cast<uint8_t*>(addr);
  m.length = length;
  m.iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : iova;
  m.access = static_cast<int>(access & kKnownAccess);
  return VerbsMr::Make(pd, hca.mrs().Insert(m), addr, length);
}

namespace softrdma::abi {

// Pages of an on-demand region are faulted in by the first access anyway; a prefetch does it
// ahead (MADV_POPULATE_*, Linux 5.14; best effort, as ibv_advise_mr(3) says).
int AdviseMr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
             uint32_t num_sge) {
  if (!pd || (flags & ~uint32_t{IBV_ADVISE_MR_FLAG_FLUSH}) || (num_sge > 0 && !sg_list))
    return EINVAL;
  int populate;
  // By number: a C caller may pass any (C++ code cannot form an advice outside the enum's range).
  switch (static_cast<uint32_t>(advice)) {
    case IBV_ADVISE_MR_ADVICE_PREFETCH:
      populate = link::kMadvPopulateRead;
      break;
    case IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE:
      populate = link::kMadvPopulateWrite;
      break;
    case IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT:
      populate = 0;  // what is present is present to us already
      break;
    default:
      return ENOTSUP;
  }
  core::Hca& hca = CoreOf(pd->context).hca();
  const int access = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0;
  for (uint32_t i = 0; i < num_sge; ++i) {
    const ibv_sge& g = sg_list[i];
    core::Mr m;
    if (!hca.mrs().Get(g.lkey, &m)) return EFAULT;
    if (!(m.access & IBV_ACCESS_ON_DEMAND)) return EINVAL;  // prefetch is for on-demand regions
    if (g.length == 0) continue;
    core::KeyCheck why;
    if (!hca.mrs().Resolve(g.lkey, &VerbsPd::From(pd)->core, g.addr, g.length, access, true, &why))
      return why == core::KeyCheck::kBadAccess ? EPERM : EFAULT;
  }
  if (populate == 0) return 0;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (uint32_t i = 0; i < num_sge; ++i) {
    const uintptr_t start = sg_list[i].addr & ~(page - 1);
    const uintptr_t end = sg_list[i].addr + sg_list[i].length;
    if (sg_list[i].length > 0)
      madvise(reinterpret_cast<void*>(start), end - start, populate);  // best effort
  }
  return 0;
}

}  // namespace softrdma::abi

SOFTRDMA_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                        int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

SOFTRDMA_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

SOFTRDMA_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  return Fail<ibv_mr>(EOPNOTSUPP);  // no device memory to export from
}

SOFTRDMA_EXPORT int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length,
                                 int access) {
  constexpr int kAll =
      IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  if (!mr || flags == 0 || (flags & ~kAll)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  core::Hca& hca = CoreOf(mr->context).hca();
  core::Mr m;
  if (!hca.mrs().Get(mr->lkey, &m) || m.device_memory) {  // device memory: mlx5 refuses it too
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  VerbsPd* old_pd = VerbsPd::From(mr->pd);
  VerbsPd* new_pd = old_pd;
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    if (!pd) {
      errno = EINVAL;
      return IBV_REREG_MR_ERR_INPUT;
    }
    new_pd = VerbsPd::From(pd);
  }
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    if (CheckAccess(static_cast<unsigned>(access))) {
      errno = EINVAL;
      return IBV_REREG_MR_ERR_INPUT;
    }
    m.access = access & static_cast<int>(kKnownAccess);
  }
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    if (!addr || length == 0 || length > UINTPTR_MAX - reinterpret_cast<uintptr_t>(addr)) {
      errno = EINVAL;  // as ibv_reg_mr: no range that wraps the address space
      return IBV_REREG_MR_ERR_INPUT;
    }
    m.addr = static_cast<uint8_t*>(addr);
    m.length = length;
    m.iova = reinterpret_cast<uintptr_t>(addr);
  }
  if (!m.addr && !(m.access & IBV_ACCESS_ON_DEMAND)) {
    errno = EINVAL;  // the whole address space is a region on demand only
    return IBV_REREG_MR_ERR_INPUT;
  }
  if ((flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS)) && m.addr &&
      !PagesUsable(m.addr, m.length, static_cast<unsigned>(m.access))) {
    errno = EFAULT;  // as at registration; the kernel's command fails, the region stays as it was
    return IBV_REREG_MR_ERR_CMD;
  }
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->addr = addr;
    mr->length = length;
  }
  m.pd = &new_pd->core;
  hca.mrs().Update(mr->lkey, m);
  hca.RestageDirectRecvs();
  if (new_pd != old_pd) {
    --old_pd->users;
    ++new_pd->users;
    mr->pd = pd;
  }
  return 0;
}

SOFTRDMA_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return EINVAL;
  core::Hca& hca = CoreOf(mr->context).hca();
  bool busy = false;
  if (!hca.mrs().Remove(mr->lkey, &busy)) return busy ? EBUSY : EINVAL;  // windows still bound
  hca.RestageDirectRecvs();
  // Read responses still queued may point into the region the caller is about to free.
  hca.SecureQueuedPayloads();
  --VerbsPd::From(mr->pd)->users;
  if (VerbsDm* dm = VerbsMr::From(mr)->dm) --dm->users;
  delete VerbsMr::From(mr);
  return 0;
}

// Importing objects needs a kernel to share them through; softrdma has none.
SOFTRDMA_EXPORT ibv_pd* ibv_import_pd(ibv_context*, uint32_t) {
  return Fail<ibv_pd>(EOPNOTSUPP);
}
SOFTRDMA_EXPORT void ibv_unimport_pd(ibv_pd*) {}
SOFTRDMA_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) {
  return Fail<ibv_mr>(EOPNOTSUPP);
}
SOFTRDMA_EXPORT void ibv_unimport_mr(ibv_mr*) {}
SOFTRDMA_EXPORT ibv_dm* ibv_import_dm(ibv_context*, uint32_t) {
  return Fail<ibv_dm>(EOPNOTSUPP);
}
SOFTRDMA_EXPORT void ibv_unimport_dm(ibv_dm*) {}
