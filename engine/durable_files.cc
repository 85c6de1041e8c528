#include "engine/durable_files.h"

#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>
#include <filesystem>
#include <fstream>
#include <vector>

namespace trainerd::engine {
namespace fs = std::filesystem;

namespace {
std::string Errno() { return std::strerror(errno); }

// The folder holding `p`: "." for a bare file name.
std::string ParentOf(const fs::path& p) {
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}
}  // namespace

namespace {
int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  return (type == FTW_DP ? ::rmdir(path) : ::unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}
}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? Status::Ok() : Status::Error("removing " + path + ": " + Errno());
  }
  if (::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    return Status::Error("removing " + path + ": " + Errno());
  }
  return Status::Ok();
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error("opening " + path + " to fsync it: " + Errno());
  const int rc = ::fsync(fd);
  const std::string err = rc != 0 ? Errno() : "";
  ::close(fd);
  if (rc != 0) return Status::Error("fsync of " + path + ": " + err);
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  fs::path target(path);
  std::string tmpl = (fs::path(ParentOf(target)) / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = ::mkstemp(name.data());
  if (fd < 0) return Status::Error("creating a temporary file beside " + path + ": " + Errno());
  const std::string tmp(name.data());
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = Errno();
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::Error("writing " + path + ": " + err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return Status::Error("flushing " + path + ": " + Errno());
  }
  ::chmod(tmp.c_str(), 0644);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = Errno();
    ::unlink(tmp.c_str());
    return Status::Error("renaming into place " + path + ": " + err);
  }
  return FsyncPath(ParentOf(target));
}

StatusOr<std::string> MakeStagingDirectory(const std::string& parent, const std::string& stem) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return Status::Error("creating folder " + parent + ": " + ec.message());
  std::string tmpl = (fs::path(parent) / ("." + stem + ".tmp-XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr) {
    return Status::Error("creating a temporary folder in " + parent + ": " + Errno());
  }
  ::chmod(name.data(), 0755);
  return std::string(name.data());
}

Status CommitDirectory(const std::string& staging, const std::string& final_path) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(staging, ec)) {
    if (entry.is_regular_file()) TRAINERD_RETURN_IF_ERROR(FsyncPath(entry.path().string()));
  }
  if (ec) return Status::Error("listing " + staging + ": " + ec.message());
  TRAINERD_RETURN_IF_ERROR(FsyncPath(staging));
  fs::path final_p(final_path);
  std::string old;
  if (fs::exists(final_p, ec)) {
    old = staging + ".old";
    if (::rename(final_path.c_str(), old.c_str()) != 0) {
      return Status::Error("moving aside the previous " + final_path + ": " + Errno());
    }
  }
  if (::rename(staging.c_str(), final_path.c_str()) != 0) {
    const std::string err = Errno();
    if (!old.empty()) ::rename(old.c_str(), final_path.c_str());
    return Status::Error("renaming " + staging + " to " + final_path + ": " + err);
  }
  TRAINERD_RETURN_IF_ERROR(FsyncPath(ParentOf(final_p)));
  if (!old.empty()) (void)RemoveTree(old);  // the new folder is in place; a leftover is harmless
  return Status::Ok();
}

}  // namespace trainerd::engine
