// Marks an extern "C" function as part of the public surface of libibverbs.so.1 or librdmacm.so.1.
// The version node it lands in is decided by the library's version script, not here.
#pragma once

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))
