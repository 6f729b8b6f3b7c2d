// The pause of a thread that spins on memory another thread will write. When the other thread
// runs on the sibling hyperthread of the same core (a VM's two vCPUs may be placed so), a
// spinning loop without it takes issue slots from the very thread it waits for.
#pragma once

namespace softrdma::link {

inline void SpinPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace softrdma::link
