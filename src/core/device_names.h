// The names softrdma0 goes by (DESIGN.md §3): the verbs surface reports them, the CM opens the
// device by them, and `softrdma devnode` makes the node UCX looks for under the second.
#pragma once

#include <cstddef>

namespace softrdma::core {

inline constexpr char kDeviceName[] = "softrdma0";           // ibv_get_device_name
inline constexpr char kUverbsName[] = "uverbs_softrdma0";    // ibv_device.dev_name
inline constexpr char kUverbsNodeDir[] = "/dev/infiniband";  // where a kernel's node would be
inline constexpr char kUverbsNode[] = "/dev/infiniband/uverbs_softrdma0";
constexpr bool IsUverbsNodePath() {
  constexpr std::size_t kDir = sizeof kUverbsNodeDir - 1;
  if (sizeof kUverbsNode != kDir + 1 + sizeof kUverbsName || kUverbsNode[kDir] != '/') return false;
  for (std::size_t i = 0; i < kDir; ++i)
    if (kUverbsNode[i] != kUverbsNodeDir[i]) return false;
  for (std::size_t i = 0; i < sizeof kUverbsName; ++i)
    if (kUverbsNode[kDir + 1 + i] != kUverbsName[i]) return false;
  return true;
}
static_assert(IsUverbsNodePath(), "kUverbsNode is kUverbsNodeDir/kUverbsName");

}  // namespace softrdma::core
