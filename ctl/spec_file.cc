#include "ctl/spec_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace trainerd::ctl {

StatusOr<proto::JobSpec> ReadSpecFile(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return Status::Error("the job spec path is empty; give the path of a .yaml file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error("cannot read job spec " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Error("cannot read job spec " + path + ": " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::Error(path + " is a folder; give the path of a job spec (.yaml) file");
  }
  std::string text;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::Error("cannot read job spec " + path + ": " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxSpecFileBytes) {
      ::close(fd);
      return Status::Error("job spec " + path + " is over " + std::to_string(kMaxSpecFileBytes >> 20) +
                           " MiB; a job spec is a short YAML file that names its data files");
    }
  }
  ::close(fd);

  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return Status::Error("cannot find the folder of job spec " + path + ": " + ec.message());
  proto::JobSpec spec;
  spec.set_yaml(std::move(text));
  spec.set_source(path);
  // Normalised before taking the folder, so "./job.yaml" gives "/cwd", not "/cwd/".
  spec.set_base_dir(absolute.lexically_normal().parent_path().string());
  return spec;
}

}  // namespace trainerd::ctl
