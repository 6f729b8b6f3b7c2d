// A full memory barrier on every running thread of every process that asked to take part: this
// process's, and its same-host peers' (membarrier global expedited). It lets a hot path order a
// store before its loads with no fence of its own (a sender taking a receive WQE, DirectRecvQueue
// in shared_windows.h), while the rare side that needs the order pays a system call instead.
#pragma once

namespace softrdma::link {

// Registers this process on a thread of its own (registering waits for an RCU grace period, some
// milliseconds), once per process and again in a fork() child, whose registration is gone.
void PrepareGlobalBarrierInBackground();
// Whether this process is registered: only then do the others' GlobalBarrier() reach its threads.
bool GlobalBarrierReady();
// The barrier; false if the kernel refused it.
bool GlobalBarrier();

}  // namespace softrdma::link
