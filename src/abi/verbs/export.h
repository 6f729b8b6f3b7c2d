// Marks an extern "C" function as part of libibverbs.so.1's public surface.
// The version node it lands in is decided by libibverbs.map, not here.
#pragma once

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))
