// Test helpers shared by every test binary: a temporary folder, an error
// check, and the hidden leftovers of unfinished writes. Torch-free; needs trainerd_engine_io (engine::RemoveTree, which also
// works in torch-linked binaries where std::filesystem::remove_all crashes).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/status.h"
#include "engine/durable_files.h"

namespace trainerd::testing {

// A fresh folder under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "trainerd-test.XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    if (!path_.empty()) (void)engine::RemoveTree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return (std::filesystem::path(path_) / rel).string(); }

 private:
  std::string path_;
};

// Expects an error whose message contains every one of `parts`.
inline void ExpectErrorContains(const Status& status, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(status.ok()) << "expected an error";
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "message lacks \"" << part << "\": " << status.message();
  }
}

// Entries of a folder whose names start with '.': leftovers of an unfinished write.
inline std::vector<std::string> HiddenEntries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  // Plain directory_iterator, recursing by hand: see engine::RemoveTree on why
  // torch-linked code avoids recursive_directory_iterator.
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind('.', 0) == 0) out.push_back(e.path().string());
    for (auto& inner : HiddenEntries(e.path().string())) out.push_back(inner);
  }
  return out;
}

}  // namespace trainerd::testing
