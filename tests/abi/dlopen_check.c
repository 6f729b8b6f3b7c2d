// Programs load libibverbs after they start, with dlopen: UCX's uct_ib module, MPI and
// middleware plugins. Each library named on the command line must load so. A thread_local of
// the initial-exec model asks for static TLS, which dlopen has little of: ucx_info then reported
// "cannot allocate memory in static TLS block" and no softrdma0 device.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  int failed = 0;
  for (int i = 1; i < argc; ++i) {
    if (!dlopen(argv[i], RTLD_NOW | RTLD_LOCAL)) {
      fprintf(stderr, "dlopen %s: %s\n", argv[i], dlerror());
      ++failed;
    }
  }
  printf("%d passed, %d failed\n", argc - 1 - failed, failed);
  return failed != 0;
}
