#include "common/spec_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

namespace trainerd {
namespace {

namespace fs = std::filesystem;

// Opens `path` for reading as a regular file; "" or why not.
std::string CheckReadableFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  struct stat st {};
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    why = "it is a folder, not a file";
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  }
  close(fd);
  return why;
}

}  // namespace

Status CheckSpecFiles(const JobSpec& spec) {
  const std::string& src = spec.source;
  std::vector<std::string> errors;
  std::error_code ec;
  if (!fs::is_directory(spec.model.path, ec)) {
    const std::string why = ec ? ec.message()
                               : (fs::exists(spec.model.path, ec) ? "not a folder" : "no such folder");
    errors.push_back(src + ": model.path: " + spec.model.path + ": " + why +
                     "; point it at a Hugging Face model folder (one with config.json) that trainerd can read");
  } else {
    const std::string config = (fs::path(spec.model.path) / "config.json").string();
    const std::string why = CheckReadableFile(config);
    if (!why.empty()) {
      errors.push_back(src + ": model.path: " + config + ": " + why +
                       "; a Hugging Face model folder holds config.json, readable by trainerd");
    }
  }
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"data.train", spec.data.train},
                                  std::pair<const char*, const std::string&>{"data.eval", spec.data.eval}}) {
    if (path.empty()) continue;
    const std::string why = CheckReadableFile(path);
    if (!why.empty()) {
      errors.push_back(src + ": " + key + ": " + path + ": " + why +
                       "; give a data file that exists and that trainerd can read");
    }
  }
  return Status::Errors(errors);
}

StatusOr<JobSpec> ValidateSubmittedSpec(const std::string& yaml, const std::string& source,
                                        const std::string& base_dir, int64_t checkpoint_every) {
  if (base_dir.empty() || base_dir[0] != '/') {
    return Status::Error("spec base_dir must be an absolute folder, got '" + base_dir + "'");
  }
  JobSpecDefaults defaults;
  defaults.output_dir_required = false;
  defaults.checkpoint_every = checkpoint_every;
  TRAINERD_ASSIGN_OR_RETURN(JobSpec parsed,
                            ParseJobSpecText(yaml, source.empty() ? "job.yaml" : source, base_dir, defaults));
  TRAINERD_RETURN_IF_ERROR(CheckSpecFiles(parsed));
  return parsed;
}

}  // namespace trainerd
