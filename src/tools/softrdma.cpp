// softrdma: the command-line face of the project.
//   softrdma run -- CMD ARGS...   run CMD with softrdma's libibverbs/librdmacm
//   softrdma devnode [--remove]   the device node UCX looks for (see DevNode)
//   softrdma version
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/device_names.h"

namespace {

using softrdma::core::kUverbsNode;
using softrdma::core::kUverbsNodeDir;

// build/bin/softrdma -> build/lib
std::string LibDir() {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return {};
  self[n] = 0;
  std::string path(self);
  std::string bin = path.substr(0, path.rfind('/'));
  std::string root = bin.substr(0, bin.rfind('/'));
  return root + "/lib";
}

int Usage(FILE* out) {
  std::fprintf(out,
               "usage: softrdma run [--] CMD [ARGS...]   run CMD on softrdma's RDMA libraries\n"
               "       softrdma devnode [--remove]      make (or remove) %s for UCX\n"
               "       softrdma version\n",
               kUverbsNode);
  return out == stderr ? 2 : 0;
}

// UCX lists an IB device only when /dev/infiniband/<dev_name> is a character device the user may
// read and write (it stats the node, never opens it): without one, its rc_verbs and ud_verbs
// transports do not see softrdma0. The node made here has /dev/null's numbers, so that whatever
// does open it gets nothing. Making it takes root (or CAP_MKNOD); softrdma itself never needs it.
int DevNode(bool remove) {
  if (remove) {
    struct stat st;
    if (lstat(kUverbsNode, &st) != 0) return 0;  // nothing to remove
    if (!S_ISCHR(st.st_mode) || st.st_rdev != makedev(1, 3)) {
      std::fprintf(stderr, "softrdma: %s is not the node softrdma makes; left alone\n",
                   kUverbsNode);
      return 1;
    }
    if (unlink(kUverbsNode) != 0) {
      std::fprintf(stderr, "softrdma: cannot remove %s: %s\n", kUverbsNode, std::strerror(errno));
      return 1;
    }
    rmdir(kUverbsNodeDir);  // only when empty
    return 0;
  }
  if (access(kUverbsNode, R_OK | W_OK) == 0) return 0;  // there already
  if ((mkdir(kUverbsNodeDir, 0755) != 0 && errno != EEXIST) ||
      mknod(kUverbsNode, S_IFCHR | 0666, makedev(1, 3)) != 0 || chmod(kUverbsNode, 0666) != 0) {
    std::fprintf(stderr,
                 "softrdma: cannot make %s: %s\n"
                 "  it takes root (or CAP_MKNOD): sudo softrdma devnode\n",
                 kUverbsNode, std::strerror(errno));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(stderr);
  std::string cmd = argv[1];
  if (cmd == "version" || cmd == "--version") {
    std::printf("softrdma %s\n", SOFTRDMA_VERSION);
    return 0;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  if (cmd == "devnode") {
    if (argc > 3 || (argc == 3 && std::strcmp(argv[2], "--remove") != 0)) return Usage(stderr);
    return DevNode(argc == 3);
  }
  if (cmd != "run") return Usage(stderr);
  int first = 2;
  if (first < argc && std::strcmp(argv[first], "--") == 0) ++first;
  if (first >= argc) return Usage(stderr);

  std::string libs = LibDir();
  // Appended piecewise: `":" + std::string(old)` trips GCC 12's -Wrestrict false positive at -O3.
  if (const char* old = getenv("LD_LIBRARY_PATH"); old && *old) {
    libs += ':';
    libs += old;
  }
  setenv("LD_LIBRARY_PATH", libs.c_str(), 1);
  execvp(argv[first], argv + first);
  std::fprintf(stderr, "softrdma: cannot run %s: %s\n", argv[first], std::strerror(errno));
  return 127;
}
