#include "core/addressing.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/held_file.h"
#include "core/limits.h"
#include "core/run_directory.h"
#include "core/xrc_targets.h"

namespace softrdma::core {

ibv_gid MakeGid(const GidFields& f) {
  ibv_gid g{};
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  g.raw[8] = static_cast<uint8_t>(f.ip >> 24);
  g.raw[9] = static_cast<uint8_t>(f.ip >> 16);
  g.raw[10] = static_cast<uint8_t>(f.ip >> 8);
  g.raw[11] = static_cast<uint8_t>(f.ip);
  g.raw[12] = static_cast<uint8_t>(f.port >> 8);
  g.raw[13] = static_cast<uint8_t>(f.port);
  g.raw[14] = static_cast<uint8_t>(f.slot >> 8);
  g.raw[15] = static_cast<uint8_t>(f.slot);
  return g;
}

std::optional<GidFields> ParseGid(const ibv_gid& g) {
  static const uint8_t kPrefix[8] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(g.raw, kPrefix, 8) != 0) return std::nullopt;
  link::NodeId id;
  std::memcpy(id.bytes, g.raw, sizeof id.bytes);
  const link::PeerAddr a = link::NodeAddress(id);
  GidFields f;
  f.ip = a.ip;
  f.port = a.port;
  f.slot = static_cast<uint16_t>(g.raw[14] << 8 | g.raw[15]);
  if (f.ip == 0 || f.port == 0) return std::nullopt;
  return f;
}

std::vector<uint32_t> LocalIpv4Addresses() {
  std::vector<uint32_t> out;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) == 0) {
    for (ifaddrs* i = ifa; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
      out.push_back(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr));
    }
    freeifaddrs(ifa);
  }
  if (const char* want = getenv("SOFTRDMA_IP")) {
    in_addr a;
    if (inet_pton(AF_INET, want, &a) == 1) {
      uint32_t ip = ntohl(a.s_addr);
      std::erase(out, ip);
      out.insert(out.begin(), ip);
    }
  }
  if (out.empty()) out.push_back(INADDR_LOOPBACK);
  if (out.size() > kGidTableLen) out.resize(kGidTableLen);
  return out;
}

uint16_t DestinationSlot(const ibv_ah_attr& attr, uint32_t qpn) {
  if (attr.is_global)
    if (auto f = ParseGid(attr.grh.dgid)) return f->slot;
  return static_cast<uint16_t>(attr.dlid ? attr.dlid : qpn >> kQpIndexBits);
}

bool SlotRegistry::Claim(uint16_t port, const std::vector<uint32_t>& ips, std::string* err) {
  dir_ = RunDirectory();
  MakeSharedDirectory(dir_);
  uint32_t start = static_cast<uint32_t>(getpid()) % kMaxSlot;
  int vanished = 0;  // times the directory went under us (an exiting process removed it)
  for (uint32_t i = 0; i < kMaxSlot; ++i) {
    uint16_t s = static_cast<uint16_t>((start + i) % kMaxSlot + 1);
    std::string path = dir_ + "/slot-" + std::to_string(s);
    int fd = OpenHeldFile(path, 0, /*nonblock=*/true);
    while (fd < 0 && errno == ENOENT && vanished++ < kRunDirectoryTries) {
      MakeSharedDirectory(dir_);
      fd = OpenHeldFile(path, 0, /*nonblock=*/true);
    }
    if (fd < 0) continue;  // taken, or another user's stale slot
    if (HeldElsewhere(s)) {
      close(fd);  // its creator is gone, but its shared XRC targets live on elsewhere
      continue;
    }
    std::ostringstream info;
    info << "softrdma-slot 1\nnetns " << NetnsId() << "\nport " << port << "\npid " << getpid()
         << "\nips";
    for (uint32_t ip : ips) info << ' ' << ip;
    info << '\n';
    std::string text = info.str();
    if (ftruncate(fd, 0) != 0 ||
        pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      close(fd);
      continue;
    }
    fd_ = fd;
    slot_ = s;
    SweepStaleSlots();
    return true;
  }
  *err = "no free slot in " + dir_;
  return false;
}

// Slot files of processes that died without their exit handler (killed) are unlinked: nobody
// holds their lock (core/held_file.h). Done by every process that claims a slot and again when it
// exits, so that a killed peer's slot is gone once its survivors are. XRC target tables that only
// killed processes held go the same way.
void SlotRegistry::SweepStaleSlots() {
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "xrcd-", 5) == 0) {
      TargetTable::RemoveIfAbandoned(dir_ + "/" + e->d_name);
      continue;
    }
    if (std::strncmp(e->d_name, "slot-", 5) != 0) continue;
    std::string path = dir_ + "/" + e->d_name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (fstat(fd, &st) == 0 && st.st_uid == getuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        !HeldElsewhere(static_cast<uint16_t>(std::atoi(e->d_name + 5))))
      RemoveLockedAbandoned(fd, path);
    close(fd);
  }
  closedir(d);
}

SlotRegistry::~SlotRegistry() {
  if (fd_ >= 0) {
    if (!handed_over_) unlink(PathOf(slot_).c_str());
    close(fd_);
  }
  std::vector<uint16_t> held;
  {
    std::lock_guard<std::mutex> g(held_mu_);
    for (auto& [slot, h] : held_) held.push_back(slot);
  }
  for (uint16_t slot : held) {
    {
      std::lock_guard<std::mutex> g(held_mu_);
      held_[slot].count = 1;
    }
    Release(slot);
  }
  if (!dir_.empty()) SweepStaleSlots();
}

bool SlotRegistry::HeldElsewhere(uint16_t slot) const {
  int fd = open((PathOf(slot) + ".held").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool held = flock(fd, LOCK_EX | LOCK_NB) != 0;
  close(fd);
  return held;
}

void SlotRegistry::Hold(uint16_t slot) {
  if (slot == slot_) return;
  std::lock_guard<std::mutex> g(held_mu_);
  HeldSlot& h = held_[slot];
  if (h.count++ > 0) return;
  // A few tries: the last holder may remove the file between our open and our lock.
  std::string path = PathOf(slot) + ".held";
  for (int i = 0; i < 8 && h.fd < 0; ++i) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    struct stat st {};
    if (flock(fd, LOCK_SH) == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0)
      h.fd = fd;
    else
      close(fd);
  }
}

void SlotRegistry::Release(uint16_t slot) {
  std::lock_guard<std::mutex> g(held_mu_);
  auto it = held_.find(slot);
  if (it == held_.end() || --it->second.count > 0) return;
  int fd = it->second.fd;
  held_.erase(it);
  if (fd < 0) return;
  // Last holder here; the last anywhere when the lock turns exclusive. Then the slot's file goes
  // too unless its creator still holds it (the creator removes it at its own exit).
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
    int owner = open(PathOf(slot).c_str(), O_RDONLY | O_CLOEXEC);
    if (owner >= 0 && flock(owner, LOCK_EX | LOCK_NB) == 0)
      RemoveLockedAbandoned(owner, PathOf(slot));
    if (owner >= 0) close(owner);
    unlink((PathOf(slot) + ".held").c_str());
  }
  close(fd);
}

bool SlotRegistry::HandOver(uint16_t slot, uint16_t to) {
  std::string text;
  {
    std::ifstream in(PathOf(to));
    if (!in) return false;
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  if (text.empty()) return false;
  int fd = slot == slot_ ? fd_ : open(PathOf(slot).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ftruncate(fd, 0) == 0 &&
            pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
  if (slot == slot_)
    handed_over_ = ok;
  else
    close(fd);
  return ok;
}

void SlotRegistry::ForgetAfterFork() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  std::lock_guard<std::mutex> g(held_mu_);
  for (auto& [slot, h] : held_)
    if (h.fd >= 0) close(h.fd);  // the parent's holds stay the parent's
  held_.clear();
}

std::optional<SlotRegistry::Peer> SlotRegistry::Lookup(uint16_t slot) const {
  if (slot == 0 || slot > kMaxSlot) return std::nullopt;
  std::ifstream in(RunDirectory() + "/slot-" + std::to_string(slot));
  if (!in) return std::nullopt;
  std::string word;
  uint64_t netns = 0;
  uint32_t port = 0;
  std::vector<uint32_t> ips;
  while (in >> word) {
    if (word == "netns") {
      in >> netns;
    } else if (word == "port") {
      in >> port;
    } else if (word == "ips") {
      std::string rest;
      std::getline(in, rest);
      std::istringstream is(rest);
      uint32_t ip;
      while (is >> ip) ips.push_back(ip);
    }
  }
  if (port == 0 || port > 65535 || ips.empty()) return std::nullopt;
  Peer p;
  p.same_netns = netns == NetnsId();
  p.addr.port = static_cast<uint16_t>(port);
  p.addr.ip = p.same_netns ? INADDR_LOOPBACK : ips.front();
  return p;
}

}  // namespace softrdma::core
