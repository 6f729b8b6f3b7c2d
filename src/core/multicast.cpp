#include "core/multicast.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "core/held_file.h"
#include "core/host_identity.h"
#include "core/run_directory.h"

namespace softrdma::core {

namespace {

constexpr int64_t kCacheNs = 20'000'000;  // how stale a sender's member list may be

std::string Dir() {
  return RunDirectory() + "/mcast";
}

std::string Hex(const ibv_gid& g) {
  char out[33];
  for (int i = 0; i < 16; ++i) std::snprintf(out + 2 * i, 3, "%02x", g.raw[i]);
  return std::string(out, 32);
}

std::string PathOf(const std::string& mgid, uint32_t qpn) {
  char q[16];
  std::snprintf(q, sizeof q, "%06x", qpn);
  return Dir() + "/" + mgid + "-" + q;
}

int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

McastRegistry::~McastRegistry() {
  LeaveAllLocked();
}

void McastRegistry::LeaveAllAtExit() {
  std::unique_lock g(mu_, std::try_to_lock);
  if (!g.owns_lock()) return;
  LeaveAllLocked();
  // And the members of killed processes: a peer's kill followed by our exit left them for good.
  if (DIR* dir = opendir(Dir().c_str())) {
    while (dirent* de = readdir(dir))
      if (de->d_name[0] != '.') RemoveIfAbandoned(Dir() + "/" + de->d_name);
    closedir(dir);
  }
}

void McastRegistry::LeaveAllLocked() {
  for (auto& [key, fd] : held_) {
    unlink(PathOf(key.first, key.second).c_str());
    close(fd);
  }
  held_.clear();
  cache_.clear();
}

int McastRegistry::Attach(const ibv_gid& mgid, uint32_t qpn) {
  if (!IsMulticastGid(mgid)) return EINVAL;
  std::lock_guard<std::mutex> g(mu_);
  std::string hex = Hex(mgid);
  if (held_.count({hex, qpn})) return 0;
  int fd = -1;
  for (int i = 0; i < kRunDirectoryTries && fd < 0; ++i) {  // again when the directory went
    if (MakeRunSubdirectory("mcast").empty()) break;
    fd = OpenHeldFile(PathOf(hex, qpn), 0, /*nonblock=*/false);
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0) return ENOMEM;
  held_[{hex, qpn}] = fd;
  cache_.erase(hex);
  return 0;
}

int McastRegistry::Detach(const ibv_gid& mgid, uint32_t qpn) {
  if (!IsMulticastGid(mgid)) return EINVAL;
  std::lock_guard<std::mutex> g(mu_);
  std::string hex = Hex(mgid);
  auto it = held_.find({hex, qpn});
  if (it == held_.end()) return EINVAL;
  unlink(PathOf(hex, qpn).c_str());
  close(it->second);
  held_.erase(it);
  cache_.erase(hex);
  return 0;
}

void McastRegistry::DetachAll(uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->first.second == qpn) {
      unlink(PathOf(it->first.first, qpn).c_str());
      close(it->second);
      cache_.erase(it->first.first);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<uint32_t> McastRegistry::Members(const ibv_gid& mgid) {
  std::string hex = Hex(mgid);
  int64_t now = Now();
  std::lock_guard<std::mutex> g(mu_);
  Cached& c = cache_[hex];
  if (c.expires_ns > now) return c.qpns;
  c.qpns.clear();
  if (DIR* dir = opendir(Dir().c_str())) {
    while (dirent* de = readdir(dir)) {
      std::string name = de->d_name;
      if (name.size() != 32 + 1 + 6 || name.compare(0, 32, hex) != 0) continue;
      uint32_t qpn = static_cast<uint32_t>(std::strtoul(name.c_str() + 33, nullptr, 16));
      if (held_.count({hex, qpn})) {
        c.qpns.push_back(qpn);
        continue;
      }
      // Someone else's: a member while its holder keeps the lock; a killed process's otherwise.
      std::string path = Dir() + "/" + name;
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      if (flock(fd, LOCK_SH | LOCK_NB) != 0)
        c.qpns.push_back(qpn);
      else
        RemoveLockedAbandoned(fd, path);
      close(fd);
    }
    closedir(dir);
  }
  c.expires_ns = now + kCacheNs;
  return c.qpns;
}

void McastRegistry::ForgetAfterFork() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [key, fd] : held_) close(fd);
  held_.clear();
  cache_.clear();
}

}  // namespace softrdma::core
