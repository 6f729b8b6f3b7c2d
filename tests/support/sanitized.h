// Whether this test binary was built with AddressSanitizer or ThreadSanitizer: several times
// slower, so limits measured in time (and behaviour that timing starts) do not hold there.
#pragma once

#include "link/sanitizers.h"

inline constexpr bool kSanitized = softrdma::kAddressSanitizer || softrdma::kThreadSanitizer;
