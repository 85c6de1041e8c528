// Writes that survive a crash: a folder or file becomes visible under its
// final name only once complete and on disk. Torch-free.
#pragma once

#include <string>

#include "common/status.h"

namespace trainerd::engine {

// Writes `contents` to `path` through a temporary file in the same folder,
// fsynced and renamed into place.
Status WriteFileAtomically(const std::string& path, const std::string& contents);

// Removes a file or a folder with everything in it; absent is not an error.
// Use this rather than std::filesystem::remove_all in code linked with
// LibTorch: PyTorch's wheels export their own copies of the
// recursive_directory_iterator that remove_all is built on
// (pytorch/pytorch#133437), and calls bound to those crash.
Status RemoveTree(const std::string& path);

// fsyncs one file or folder.
Status FsyncPath(const std::string& path);

// Creates a fresh temporary folder "<parent>/.<stem>.tmp-XXXXXX" (creating
// `parent` if needed) to be filled and then committed with CommitDirectory.
StatusOr<std::string> MakeStagingDirectory(const std::string& parent, const std::string& stem);

// fsyncs every file in `staging` and the folder itself, then puts it in place
// of `final_path`: a rename, after moving an existing `final_path` aside
// (removed once the new one is in place), and fsyncs the parent.
Status CommitDirectory(const std::string& staging, const std::string& final_path);

}  // namespace trainerd::engine
