// A directory of a test's own, under the suite's run directory, removed with everything in it at
// the end: files a test makes there meet no other test process of a parallel ctest run.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "core/host_identity.h"

namespace support {

class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& prefix) {
    const std::string parent = softrdma::core::RunDirectory();
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    std::string tmpl = parent + "/" + prefix + "-XXXXXX";
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~ScratchDirectory() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  // Empty when it could not be made.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace support
