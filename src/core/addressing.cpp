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

#include "core/limits.h"

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
  GidFields f;
  f.ip = uint32_t{g.raw[8]} << 24 | uint32_t{g.raw[9]} << 16 | uint32_t{g.raw[10]} << 8 | g.raw[11];
  f.port = static_cast<uint16_t>(g.raw[12] << 8 | g.raw[13]);
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
  // World-writable and sticky, like /tmp: every user's processes share one LID/QPN space.
  if (mkdir(dir_.c_str(), 01777) == 0) chmod(dir_.c_str(), 01777);
  uint32_t start = static_cast<uint32_t>(getpid()) % kMaxSlot;
  for (uint32_t i = 0; i < kMaxSlot; ++i) {
    uint16_t s = static_cast<uint16_t>((start + i) % kMaxSlot + 1);
    std::string path = dir_ + "/slot-" + std::to_string(s);
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) continue;  // another user's stale slot
    struct stat mine {
    }, now{};
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &mine) != 0 ||
        stat(path.c_str(), &now) != 0 || mine.st_ino != now.st_ino) {
      close(fd);  // taken, or swept as stale between our open and our lock
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
// holds their lock. A claimer that opened such a file just before sees that its path went away.
void SlotRegistry::SweepStaleSlots() {
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "slot-", 5) != 0) continue;
    std::string path = dir_ + "/" + e->d_name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (fstat(fd, &st) == 0 && st.st_uid == getuid() && flock(fd, LOCK_EX | LOCK_NB) == 0)
      unlink(path.c_str());
    close(fd);
  }
  closedir(d);
}

SlotRegistry::~SlotRegistry() {
  if (fd_ >= 0) {
    std::string path = dir_ + "/slot-" + std::to_string(slot_);
    if (!handed_over_) unlink(path.c_str());
    close(fd_);
  }
  std::lock_guard<std::mutex> g(adopted_mu_);
  for (auto& [slot, fd] : adopted_) {
    if (fd < 0) continue;
    unlink((dir_ + "/slot-" + std::to_string(slot)).c_str());
    close(fd);
  }
}

bool SlotRegistry::HandOver(uint16_t slot, uint16_t to) {
  std::string text;
  {
    std::ifstream in(dir_ + "/slot-" + std::to_string(to));
    if (!in) return false;
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  std::lock_guard<std::mutex> g(adopted_mu_);
  int fd = slot == slot_ ? fd_ : -1;
  auto it = adopted_.find(slot);
  if (it != adopted_.end()) fd = it->second;
  if (fd < 0 || text.empty()) return false;
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    return false;
  // Shared from now on, so the successor can take it before we are gone (flock conversion is
  // not atomic: a starting process could claim the slot in between, as after a crash).
  flock(fd, LOCK_SH);
  if (slot == slot_) {
    handed_over_ = true;
  } else {
    // Our shared lock goes with the process; the file stays for the successor.
    it->second = -1;
  }
  return true;
}

void SlotRegistry::Adopt(uint16_t slot) {
  if (slot == slot_) return;
  std::lock_guard<std::mutex> g(adopted_mu_);
  if (adopted_.count(slot) && adopted_[slot] >= 0) return;
  std::string path = dir_ + "/slot-" + std::to_string(slot);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
    close(fd);  // claimed meanwhile by a starting process: it serves the slot now
    return;
  }
  adopted_[slot] = fd;
}

void SlotRegistry::ForgetAfterFork() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
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
