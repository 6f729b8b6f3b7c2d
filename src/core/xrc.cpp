#include "core/xrc.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

#include "core/addressing.h"
#include "core/limits.h"
#include "core/recv_queue.h"

namespace softrdma::core {

std::shared_ptr<Xrcd> XrcRegistry::Open(int fd, int oflags, int* err) {
  if (oflags & ~(O_CREAT | O_EXCL)) {
    *err = EINVAL;
    return nullptr;
  }
  std::lock_guard<std::mutex> g(mu_);
  if (fd == -1) return std::make_shared<Xrcd>(Xrcd{next_id_++});
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) {
    *err = EBADF;
    return nullptr;
  }
  auto key = std::make_pair(st.st_dev, st.st_ino);
  auto it = by_inode_.find(key);
  std::shared_ptr<Xrcd> found = it == by_inode_.end() ? nullptr : it->second.lock();
  if (found) {
    if (oflags & O_EXCL) {
      *err = EINVAL;
      return nullptr;
    }
    return found;
  }
  if (!(oflags & O_CREAT)) {
    *err = EINVAL;
    return nullptr;
  }
  auto made = std::make_shared<Xrcd>(Xrcd{next_id_++, st.st_dev, st.st_ino});
  by_inode_[key] = made;
  return made;
}

uint32_t XrcRegistry::AddSrq(uint16_t slot, Srq* srq, std::shared_ptr<Xrcd> xrcd, Cq* cq) {
  std::lock_guard<std::mutex> g(mu_);
  if (srqs_.size() >= kMaxQp) return 0;
  uint32_t srqn =
      NextFreeNumber(slot, &next_srq_index_, [this](uint32_t n) { return srqs_.count(n) != 0; });
  // Complete before it is visible: the progress thread looks numbers up under mu_.
  srq->MakeXrc(std::move(xrcd), cq, srqn);
  srqs_.emplace(srqn, srq);
  return srqn;
}

void XrcRegistry::RemoveSrq(uint32_t srqn) {
  std::lock_guard<std::mutex> g(mu_);
  srqs_.erase(srqn);
}

Srq* XrcRegistry::FindSrqLocked(uint32_t srqn, const Xrcd* xrcd) {
  auto it = srqs_.find(srqn);
  if (it == srqs_.end() || it->second->xrcd() != xrcd) return nullptr;
  return it->second;
}

Srq* XrcRegistry::FindSrqLocked(uint32_t srqn, uint64_t dev, uint64_t ino) {
  auto it = srqs_.find(srqn);
  if (it == srqs_.end()) return nullptr;
  const Xrcd* x = it->second->xrcd();
  return x && x->shared() && x->dev == dev && x->ino == ino ? it->second : nullptr;
}

}  // namespace softrdma::core
