// softrdma: the command-line face of the project.
//   softrdma run -- CMD ARGS...   run CMD with softrdma's libibverbs/librdmacm
//   softrdma version
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

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
               "       softrdma version\n");
  return out == stderr ? 2 : 0;
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
