#include "core/recv_staging.h"

#include <infiniband/verbs.h>
#include <sys/mman.h>

namespace softrdma::core {

std::unique_ptr<RecvStaging> RecvStaging::Make(MrTable& mrs, const Pd* pd) {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::unique_ptr<RecvStaging> s(new RecvStaging(mrs, static_cast<uint8_t*>(p)));
  Mr m{};
  m.pd = pd;
  m.addr = s->base_;
  m.length = kBytes;
  m.iova = reinterpret_cast<uint64_t>(p);
  m.access = IBV_ACCESS_LOCAL_WRITE;  // no remote rights: peers reach it only through a slot
  s->key_ = mrs.Insert(m);
  if (!mrs.Reachable(s->key_, m.iova, kBytes, nullptr)) return nullptr;  // no arena: frames
  return s;
}

RecvStaging::~RecvStaging() {
  if (key_) mrs_.Remove(key_);  // withdraws the window: no peer is inside it once this returns
  munmap(base_, kBytes);
}

}  // namespace softrdma::core
