#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

namespace trainerd::engine {
namespace {

// The reference implementation refuses larger headers too (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kSupportedDTypes = "F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL";

// Closes a file descriptor when it goes out of scope (unless released).
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string ErrnoText(int err) { return std::strerror(err); }

Status FileError(const std::string& path, const std::string& what) {
  return Status::Error("safetensors file " + path + ": " + what);
}

Status TensorError(const std::string& path, const std::string& name, const std::string& what) {
  return Status::Error("safetensors file " + path + ": tensor '" + name + "': " + what);
}

const char kCorruptHint[] =
    "; the file is corrupt or not a safetensors file: export or download it again";
const char kTruncatedHint[] =
    "; the file is truncated (an interrupted download or copy?): download or export it again";

// Reads a JSON integer that must be >= 0 and fit in uint64_t.
std::optional<uint64_t> NonNegativeInt(const nlohmann::ordered_json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  return std::nullopt;
}

// Parsed header entry of one tensor, before the views are built.
struct HeaderEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
  size_t header_position;
};

Status ParseTensorEntry(const std::string& path, const std::string& name,
                        const nlohmann::ordered_json& info, uint64_t buffer_size,
                        HeaderEntry* out) {
  if (!info.is_object()) {
    return TensorError(path, name,
                       "header entry is " + std::string(info.type_name()) +
                           ", expected an object with dtype, shape and data_offsets" +
                           kCorruptHint);
  }
  out->name = name;

  auto dtype_it = info.find("dtype");
  if (dtype_it == info.end() || !dtype_it->is_string()) {
    return TensorError(path, name,
                       std::string("\"dtype\" is missing or not a string") + kCorruptHint);
  }
  const std::string& dtype_str = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_name(dtype_str);
  if (!dtype) {
    return TensorError(path, name,
                       "unsupported dtype \"" + dtype_str + "\" (supported: " + kSupportedDTypes +
                           "); convert the checkpoint to one of these");
  }
  out->dtype = *dtype;

  auto shape_it = info.find("shape");
  if (shape_it == info.end() || !shape_it->is_array()) {
    return TensorError(
        path, name,
        std::string("\"shape\" is missing or not a list of non-negative integers") + kCorruptHint);
  }
  uint64_t numel = 1;
  bool numel_overflow = false;
  out->shape.clear();
  for (size_t d = 0; d < shape_it->size(); ++d) {
    std::optional<uint64_t> dim = NonNegativeInt((*shape_it)[d]);
    if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return TensorError(path, name,
                         "\"shape\" " + shape_it->dump() +
                             " is not a list of non-negative integers" + " (dimension " +
                             std::to_string(d) + ")" + kCorruptHint);
    }
    out->shape.push_back(static_cast<int64_t>(*dim));
    if (__builtin_mul_overflow(numel, *dim, &numel)) numel_overflow = true;
  }
  uint64_t nbytes = 0;
  if (numel_overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(*dtype)), &nbytes)) {
    return TensorError(path, name,
                       "\"shape\" " + shape_it->dump() + " is too large" + kCorruptHint);
  }

  auto offsets_it = info.find("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets_it != info.end() && offsets_it->is_array() && offsets_it->size() == 2) {
    begin = NonNegativeInt((*offsets_it)[0]);
    end = NonNegativeInt((*offsets_it)[1]);
  }
  if (!begin || !end) {
    return TensorError(path, name,
                       "\"data_offsets\" " +
                           (offsets_it == info.end() ? std::string("is missing; expected")
                                                     : offsets_it->dump() + " is not") +
                           " two non-negative integers [begin, end]" + kCorruptHint);
  }
  if (*begin > *end) {
    return TensorError(
        path, name, "\"data_offsets\" " + offsets_it->dump() + " has begin > end" + kCorruptHint);
  }
  if (*end > buffer_size) {
    return TensorError(path, name,
                       "data_offsets " + offsets_it->dump() +
                           " end past the data buffer, which holds " + std::to_string(buffer_size) +
                           " bytes" + kTruncatedHint);
  }
  if (*end - *begin != nbytes) {
    return TensorError(path, name,
                       "data_offsets " + offsets_it->dump() + " span " +
                           std::to_string(*end - *begin) + " bytes but shape " + shape_it->dump() +
                           " of " + dtype_str + " needs " + std::to_string(nbytes) + kCorruptHint);
  }
  out->begin = *begin;
  out->end = *end;
  return Status::Ok();
}

Status WriteAll(int fd, const void* data, size_t n, const std::string& tmp_path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux writes at most ~2 GiB per call; stay below that.
    size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    ssize_t written = ::write(fd, p, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      return Status::Error("writing " + tmp_path + ": " + ErrnoText(errno) +
                           " (is the disk full?)");
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
  return Status::Ok();
}

Status FsyncFolder(const std::string& folder) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return Status::Error("opening folder " + folder + " to fsync it: " + ErrnoText(errno));
  FdCloser closer(fd);
  if (::fsync(fd) != 0) return Status::Error("fsync of folder " + folder + ": " + ErrnoText(errno));
  return Status::Ok();
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  static constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                   DType::kI64, DType::kI32, DType::kI16,  DType::kI8,
                                   DType::kU8,  DType::kBool};
  for (DType d : kAll) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

int64_t TensorView::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK so that opening a FIFO by mistake does not hang; it has no
  // effect on regular files.
  int raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (raw_fd < 0) {
    int err = errno;
    if (err == ENOENT) return FileError(path, "no such file; check the path");
    return FileError(path, "cannot open: " + ErrnoText(err));
  }
  FdCloser fd(raw_fd);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return FileError(path, "fstat failed: " + ErrnoText(errno));
  if (S_ISDIR(st.st_mode)) {
    return FileError(path, "is a directory, not a file; name a .safetensors file inside it");
  }
  if (!S_ISREG(st.st_mode)) return FileError(path, "is not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return FileError(path, "file is " + std::to_string(file_size) +
                               " bytes, shorter than the 8-byte header length" + kTruncatedHint);
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path));
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (mapping == MAP_FAILED) return FileError(path, "mmap failed: " + ErrnoText(errno));
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;
  const unsigned char* bytes = static_cast<const unsigned char*>(mapping);

  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderBytes) {
    return FileError(path, "header length " + std::to_string(header_size) +
                               " (bytes 0-7) is larger than the 100 MB limit" + kCorruptHint);
  }
  if (header_size > file_size - 8) {
    return FileError(path, "header length " + std::to_string(header_size) +
                               " (bytes 0-7) is larger than the " + std::to_string(file_size - 8) +
                               " bytes that follow it" + kTruncatedHint);
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const uint64_t buffer_offset = 8 + header_size;  // file offset of the data buffer
  const uint64_t buffer_size = file_size - buffer_offset;

  // Duplicate top-level keys would silently shadow each other in the parsed
  // object; the callback sees every key and remembers the first duplicate.
  std::set<std::string> seen_keys;
  std::string duplicate_key;
  auto on_event = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                      nlohmann::ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key &&
        duplicate_key.empty() && !seen_keys.insert(parsed.get<std::string>()).second) {
      duplicate_key = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(header_begin, header_begin + header_size, on_event);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    // e.byte counts from 1 within the header.
    const uint64_t at = 8 + (e.byte > 0 ? e.byte - 1 : 0);
    return FileError(path, "header (bytes [8, " + std::to_string(buffer_offset) +
                               ")) is not valid JSON near byte offset " + std::to_string(at) +
                               ": " + e.what() + kCorruptHint);
  }
  if (!header.is_object()) {
    return FileError(path, std::string("header is JSON ") + header.type_name() +
                               ", expected an object" + kCorruptHint);
  }
  if (!duplicate_key.empty()) {
    return FileError(path, "header names '" + duplicate_key + "' twice" + kCorruptHint);
  }

  std::vector<HeaderEntry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object()) {
        return FileError(path, std::string("\"__metadata__\" is ") + it->type_name() +
                                   ", expected an object of strings" + kCorruptHint);
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return FileError(path, "\"__metadata__\" key '" + m.key() + "' is " + m->type_name() +
                                     ", expected a string" + kCorruptHint);
        }
        file->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    HeaderEntry entry;
    entry.header_position = entries.size();
    TRAINERD_RETURN_IF_ERROR(ParseTensorEntry(path, it.key(), *it, buffer_size, &entry));
    entries.push_back(std::move(entry));
  }

  // The reference accepts only a buffer the tensors tile exactly.
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return std::tie(a.begin, a.end, a.header_position) <
           std::tie(b.begin, b.end, b.header_position);
  });
  uint64_t cursor = 0;
  const HeaderEntry* previous = nullptr;
  for (const HeaderEntry& e : entries) {
    if (e.begin < cursor) {
      return TensorError(path, e.name,
                         "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                             "] overlap tensor '" + previous->name + "' [" +
                             std::to_string(previous->begin) + ", " +
                             std::to_string(previous->end) + "]" + kCorruptHint);
    }
    if (e.begin > cursor) {
      return TensorError(path, e.name,
                         "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                             "] leave a hole: bytes [" + std::to_string(cursor) + ", " +
                             std::to_string(e.begin) + ") of the data buffer (file offset " +
                             std::to_string(buffer_offset + cursor) + ") belong to no tensor" +
                             kCorruptHint);
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != buffer_size) {
    return FileError(path, std::to_string(buffer_size - cursor) +
                               " trailing bytes after the last tensor (file offset " +
                               std::to_string(buffer_offset + cursor) + ") belong to no tensor" +
                               kCorruptHint);
  }

  file->tensors_.reserve(entries.size());
  const unsigned char* buffer = bytes + buffer_offset;
  for (HeaderEntry& e : entries) {
    file->index_.emplace(e.name, file->tensors_.size());
    file->tensors_.push_back(TensorView{std::move(e.name), e.dtype, std::move(e.shape),
                                        buffer + e.begin, static_cast<size_t>(e.end - e.begin)});
  }
  return file;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  auto fail = [&path](const std::string& what) {
    return Status::Error("writing safetensors file " + path + ": " + what);
  };

  // Validate everything and build the header before touching the disk.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) m[key] = value;
    header[kMetadataKey] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty()) return fail("a tensor has an empty name");
    if (t.name == kMetadataKey) {
      return fail("tensor name '__metadata__' is reserved by the format; rename the tensor");
    }
    if (!names.insert(t.name).second) {
      return fail("tensor '" + t.name + "' is given twice; names must be unique");
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return fail("tensor '" + t.name + "' has a negative dimension " + std::to_string(d));
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
        return fail("tensor '" + t.name + "' has a shape too large to address");
      }
    }
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &expected) ||
        expected != t.nbytes) {
      return fail("tensor '" + t.name + "' has nbytes " + std::to_string(t.nbytes) + " but its " +
                  std::to_string(numel) + " elements of " + dtype_name(t.dtype) + " need " +
                  std::to_string(numel * dtype_size(t.dtype)));
    }
    if (t.data == nullptr && t.nbytes > 0) {
      return fail("tensor '" + t.name + "' has no data (nullptr) but " + std::to_string(t.nbytes) +
                  " bytes");
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::ordered_json::type_error& e) {
    return fail(std::string("a tensor name or metadata string is not valid UTF-8: ") + e.what());
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  unsigned char length_prefix[8];
  for (int i = 0; i < 8; ++i) {
    length_prefix[i] =
        static_cast<unsigned char>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  }

  // A name unique within this process; O_EXCL guards against other writers
  // and against leftovers of a crashed run with the same pid.
  static std::atomic<uint64_t> counter{0};
  std::string tmp_path;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    tmp_path = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    raw_fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (raw_fd < 0 && errno != EEXIST) break;
  }
  if (raw_fd < 0) {
    int err = errno;
    return fail("cannot create temporary file " + tmp_path + ": " + ErrnoText(err) +
                (err == ENOENT ? " (does the folder exist?)" : ""));
  }
  FdCloser fd(raw_fd);
  auto write_and_sync = [&]() -> Status {
    TRAINERD_RETURN_IF_ERROR(WriteAll(fd.get(), length_prefix, sizeof(length_prefix), tmp_path));
    TRAINERD_RETURN_IF_ERROR(WriteAll(fd.get(), header_text.data(), header_text.size(), tmp_path));
    for (const TensorToWrite& t : tensors) {
      if (t.nbytes > 0) TRAINERD_RETURN_IF_ERROR(WriteAll(fd.get(), t.data, t.nbytes, tmp_path));
    }
    if (::fsync(fd.get()) != 0)
      return Status::Error("fsync of " + tmp_path + ": " + ErrnoText(errno));
    if (::close(fd.release()) != 0) {
      return Status::Error("closing " + tmp_path + ": " + ErrnoText(errno));
    }
    if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
      return Status::Error("renaming " + tmp_path + " over it: " + ErrnoText(errno));
    }
    return Status::Ok();
  };
  Status written = write_and_sync();
  if (!written.ok()) {
    ::unlink(tmp_path.c_str());
    return written.WithContext("writing safetensors file " + path);
  }
  std::string folder = std::filesystem::path(path).parent_path().string();
  // The new file is in place; only the durability of its folder entry is in doubt.
  return FsyncFolder(folder.empty() ? "." : folder).WithContext("writing safetensors file " + path);
}

}  // namespace trainerd::engine
