#include "cm/registry.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <sstream>

#include "cm/ip_address.h"
#include "core/held_file.h"
#include "core/host_identity.h"
#include "core/run_directory.h"

namespace softrdma::cm {

namespace {

std::string Dir() {
  return core::RunDirectory() + "/cm";
}

struct Entry {
  uint64_t netns = 0;
  uint16_t ps = 0, port = 0, service_port = 0;
  Addr addr;
  bool reuse = false;
  std::vector<Addr> ips;
};

bool ParseAddr(const std::string& text, Addr* a) {
  sockaddr_storage ss{};
  if (inet_pton(AF_INET, text.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    ss.ss_family = AF_INET;
  } else if (inet_pton(AF_INET6, text.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) ==
             1) {
    ss.ss_family = AF_INET6;
  } else {
    return false;
  }
  return FromSockaddr(reinterpret_cast<sockaddr*>(&ss), a);
}

std::optional<Entry> Parse(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  Entry e;
  bool magic = false;
  while (in >> word) {
    if (word == "softrdma-cm") {
      magic = true;
      in >> word;
    } else if (word == "netns") {
      in >> e.netns;
    } else if (word == "ps") {
      in >> e.ps;
    } else if (word == "port") {
      in >> e.port;
    } else if (word == "listen") {
      in >> e.service_port;
    } else if (word == "reuse") {
      int r = 0;
      in >> r;
      e.reuse = r != 0;
    } else if (word == "addr") {
      in >> word;
      if (!ParseAddr(word, &e.addr)) return std::nullopt;
    } else if (word == "ips") {
      std::string rest;
      std::getline(in, rest);
      std::istringstream is(rest);
      while (is >> word) {
        Addr a;
        if (ParseAddr(word, &a)) e.ips.push_back(a);
      }
    }
  }
  if (!magic) return std::nullopt;
  return e;
}

// Reads every live claim. With `prune` (only under DirLock, so no claim is half made) it also
// removes claims whose holder is gone.
template <typename Fn>
void ForEachLive(Fn fn, bool prune = false) {
  std::string d = Dir();
  DIR* dir = opendir(d.c_str());
  if (!dir) return;
  while (dirent* de = readdir(dir)) {
    if (de->d_name[0] == '.') continue;
    std::string path = d + "/" + de->d_name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
      if (prune) core::RemoveLockedAbandoned(fd, path);  // nobody holds it: its process is gone
      close(fd);
      continue;
    }
    char buf[4096];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    if (n <= 0) continue;
    buf[n] = 0;
    if (auto e = Parse(buf)) fn(*e);
  }
  closedir(dir);
}

bool FamilyMatches(const Entry& e, const Addr& dst) {
  if (IsAnyIp(e.addr)) return e.addr.family == 6 || dst.family == 4;
  return SameIp(e.addr, dst) ||
         (IsLoopbackIp(e.addr) && IsLoopbackIp(dst) && e.addr.family == dst.family);
}

bool Owns(const Entry& e, const Addr& ip) {
  for (const Addr& a : e.ips) {
    if (SameIp(a, ip)) return true;
  }
  return false;
}

// The directory's own lock (core::LockDirectory): claims are made and pruned under it, so that no
// claim is pruned half made, and the directory is removed only under it (core/run_directory.h).
// Makes the directory when missing. `wait` false: only when nobody holds it (a thread of this
// process may, and flock would wait for it for good).
class DirLock {
 public:
  explicit DirLock(bool wait = true) {
    // Again when the directory was removed as we locked it.
    for (int i = 0; i < core::kRunDirectoryTries && fd_ < 0; ++i) {
      const std::string d = core::MakeRunSubdirectory("cm");
      if (d.empty()) return;
      fd_ = core::LockDirectory(d, wait);
      if (fd_ < 0 && errno != ENOENT) return;
    }
  }
  ~DirLock() {
    if (fd_ >= 0) close(fd_);
  }
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The claim files this process holds, removed when it exits. The connection manager is never
// destroyed (Cm::Get), nor are the ids a program still has at exit, so their claims' destructors
// do not run: every rping left its presence file behind. A process that dies without exiting
// leaves its files to the next claimant's pruning, or to the exit of a process still running.
class HeldFiles {
 public:
  static HeldFiles& Get() {
    static HeldFiles* held = [] {
      auto* h = new HeldFiles;  // never destroyed: claims may be made and released during exit
      atexit([] { Get().RemoveAllAtExit(); });
      return h;
    }();
    return *held;
  }
  void Add(const std::string& path) {
    std::lock_guard g(mu_);
    paths_.push_back(path);
  }
  void Remove(const std::string& path) {
    std::lock_guard g(mu_);
    std::erase(paths_, path);
  }
  // In a fork()ed child (one thread; Cm's atfork handler): the files are the parent's, and the
  // lock may have been held by one of its threads at the fork.
  void ForgetAfterFork() {
    new (&mu_) std::mutex;
    paths_.clear();
  }

 private:
  void RemoveAllAtExit() {
    // A thread in the middle of a claim keeps its files: pruning removes them later.
    std::unique_lock g(mu_, std::try_to_lock);
    if (!g.owns_lock()) return;
    for (const std::string& p : paths_) unlink(p.c_str());
    paths_.clear();
    // And those of killed processes: a peer's kill followed by our exit left its files for good.
    {
      DirLock lock(/*wait=*/false);
      if (lock.held()) ForEachLive([](const Entry&) {}, /*prune=*/true);
    }
    core::TidyRunDirectory();
  }
  std::mutex mu_;
  std::vector<std::string> paths_;
};

}  // namespace

PortClaim::~PortClaim() {
  if (fd_ >= 0) {
    HeldFiles::Get().Remove(path_);
    unlink(path_.c_str());
    close(fd_);
  }
}

void PortClaim::ForgetAfterFork() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void PortClaim::ForgetHeldFilesAfterFork() {
  HeldFiles::Get().ForgetAfterFork();
}

int PortClaim::ClaimPresence() {
  path_ = Dir() + "/host-" + std::to_string(core::NetnsId()) + "-" + std::to_string(getpid());
  int fd = -1;
  for (int i = 0; i < core::kRunDirectoryTries && fd < 0; ++i) {
    DirLock lock;
    // Blocking: a reader may hold a shared lock on the new file for a moment. ENOENT: the
    // directory went as we made it (the lock could not be had): again.
    fd = core::OpenHeldFile(path_, O_TRUNC, /*nonblock=*/false);
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0) return EACCES;
  fd_ = fd;
  HeldFiles::Get().Add(path_);
  port_space_ = 0;
  addr_ = Addr{};
  addr_.family = 4;
  std::memcpy(addr_.ip + 10, "\xff\xff", 2);
  Publish(0);
  return 0;
}

int PortClaim::Claim(uint16_t port_space, const Addr& addr, bool reuse) {
  const uint64_t netns = core::NetnsId();
  static std::atomic<uint32_t> counter{0};
  path_ = Dir() + "/" + std::to_string(netns) + "-" + std::to_string(port_space) + "-" +
          std::to_string(addr.port) + "-" + std::to_string(getpid()) + "-" +
          std::to_string(counter++);
  int fd = -1;
  for (int i = 0; i < core::kRunDirectoryTries && fd < 0; ++i) {
    DirLock lock;
    bool conflict = false;
    ForEachLive(
        [&](const Entry& e) {
          if (e.netns != netns || e.ps != port_space || e.port != addr.port) return;
          bool overlap = IsAnyIp(e.addr) || IsAnyIp(addr) || SameIp(e.addr, addr);
          if (overlap && !(reuse && e.reuse && !e.service_port)) conflict = true;
        },
        /*prune=*/true);
    if (conflict) return EADDRINUSE;
    fd = core::OpenHeldFile(path_, O_TRUNC, /*nonblock=*/false);  // blocking, as above
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0) return EACCES;
  fd_ = fd;
  HeldFiles::Get().Add(path_);
  port_space_ = port_space;
  addr_ = addr;
  reuse_ = reuse;
  Publish(0);
  return 0;
}

bool PortClaim::Publish(uint16_t service_port) {
  if (fd_ < 0) return false;
  std::ostringstream out;
  out << "softrdma-cm 1\nnetns " << core::NetnsId() << "\nps " << port_space_ << "\nport "
      << addr_.port << "\naddr " << IpText(addr_) << "\nreuse " << (reuse_ ? 1 : 0) << "\nlisten "
      << service_port << "\npid " << getpid() << "\nips";
  for (const Addr& a : LocalIps()) out << ' ' << IpText(a);
  out << '\n';
  std::string text = out.str();
  return ftruncate(fd_, 0) == 0 &&
         pwrite(fd_, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
}

std::optional<ServiceAddr> FindListener(uint16_t port_space, const Addr& dst) {
  uint64_t netns = core::NetnsId();
  bool local = IsLocalIp(dst);
  std::optional<ServiceAddr> found;
  ForEachLive([&](const Entry& e) {
    if (found || !e.service_port || e.ps != port_space || e.port != dst.port) return;
    if (!FamilyMatches(e, dst)) return;
    if (local ? e.netns != netns : (e.netns == netns || !Owns(e, dst))) return;
    ServiceAddr s;
    s.port = e.service_port;
    s.netns = e.netns;
    if (local) {
      ParseAddr("127.0.0.1", &s.ip);
    } else {
      s.ip = dst;
    }
    found = s;
  });
  return found;
}

bool KnownHost(const Addr& ip) {
  if (IsLocalIp(ip)) return true;
  uint64_t netns = core::NetnsId();
  bool known = false;
  ForEachLive([&](const Entry& e) {
    if (e.netns != netns && Owns(e, ip)) known = true;
  });
  return known;
}

uint16_t EphemeralPort() {
  // The kernel's default ephemeral range; ids bound this way claim nothing, so the port only has
  // to be unlikely to repeat within the process.
  static std::atomic<uint32_t> next{static_cast<uint32_t>(std::random_device{}())};
  return static_cast<uint16_t>(32768 + next++ % 28232);
}

}  // namespace softrdma::cm
