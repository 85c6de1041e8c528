#include "engine/dataset_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <string_view>

#include "engine/durable_files.h"
#include "engine/sha256.h"

namespace trainerd::engine {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'T', 'R', 'D', 'S', 'C', 'A', 'C', 'H'};
constexpr size_t kChecksumSize = Sha256::kDigestSize;
constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Appends int32 values, little-endian, into out[at...] (already sized).
void PutI32s(char* at, const std::vector<int64_t>& values) {
  for (int64_t value : values) {
    const uint32_t v = static_cast<uint32_t>(static_cast<int32_t>(value));
    at[0] = static_cast<char>(v & 0xff);
    at[1] = static_cast<char>((v >> 8) & 0xff);
    at[2] = static_cast<char>((v >> 16) & 0xff);
    at[3] = static_cast<char>(v >> 24);
    at += 4;
  }
}

inline uint32_t LoadU32(const unsigned char* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
inline uint64_t LoadU64(const unsigned char* p) {
  return uint64_t{LoadU32(p)} | (uint64_t{LoadU32(p + 4)} << 32);
}

// Decodes n little-endian int32 at `p` into `out`. Returns false when one is
// negative (and not -100 when `allow_ignore`). A plain loop the compiler
// vectorizes: no per-token calls.
bool LoadI32s(const unsigned char* p, uint64_t n, bool allow_ignore, std::vector<int64_t>& out) {
  out.resize(n);
  int64_t* dst = out.data();
  bool bad = false;
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int32_t>(LoadU32(p + 4 * i));
    dst[i] = v;
    bad |= v < 0 && !(allow_ignore && v == kIgnoreIndex);
  }
  return !bad;
}

// Reads the whole file at `path` into `buf`; on failure sets *why_not.
bool ReadWholeFile(const std::string& path, std::unique_ptr<unsigned char[]>& buf, size_t& size,
                   std::string* why_not) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why_not = errno == ENOENT ? "no cache file" : std::string("cannot open: ") + std::strerror(errno);
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why_not = "not a regular file";
    ::close(fd);
    return false;
  }
  size = static_cast<size_t>(st.st_size);
  buf.reset(new unsigned char[size == 0 ? 1 : size]);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, buf.get() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why_not = n < 0 ? std::string("cannot read: ") + std::strerror(errno) : "damaged: shorter than its size";
      ::close(fd);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return true;
}

std::optional<TokenDataset> Decode(const unsigned char* file, size_t size, const std::string& key,
                                   std::string* why_not) {
  auto fail = [&](std::string reason) -> std::optional<TokenDataset> {
    *why_not = std::move(reason);
    return std::nullopt;
  };
  if (size < 16) return fail("damaged: " + std::to_string(size) + " bytes, too short for a header");
  if (std::memcmp(file, kMagic, sizeof(kMagic)) != 0) return fail("not a dataset cache file");
  const uint32_t version = LoadU32(file + 8);
  if (version != kDatasetCacheVersion) {
    return fail("format version " + std::to_string(version) + ", want " + std::to_string(kDatasetCacheVersion));
  }
  const uint32_t key_size = LoadU32(file + 12);
  if (key_size > kMaxDatasetCacheKey) return fail("damaged: key length " + std::to_string(key_size));
  // Header, key, four counts and the checksum.
  if (size < uint64_t{16} + key_size + 32 + kChecksumSize) return fail("damaged: truncated header");
  if (std::string_view(reinterpret_cast<const char*>(file + 16), key_size) != key) {
    return fail("written for another key");
  }
  const size_t body_size = size - kChecksumSize;
  Sha256 hash;
  hash.Update(std::string_view(reinterpret_cast<const char*>(file), body_size));
  const auto digest = hash.Digest();
  if (std::memcmp(digest.data(), file + body_size, kChecksumSize) != 0) return fail("damaged: checksum mismatch");

  // The checksum matched, but the file may still be hostile: check every length.
  const unsigned char* p = file + 16 + key_size;
  const unsigned char* const end = file + body_size;
  TokenDataset data;
  data.lines = static_cast<int64_t>(LoadU64(p));
  data.truncated = static_cast<int64_t>(LoadU64(p + 8));
  data.dropped = static_cast<int64_t>(LoadU64(p + 16));
  const uint64_t count = LoadU64(p + 24);
  p += 32;
  if (data.lines < 0 || data.truncated < 0 || data.dropped < 0) return fail("damaged: negative line counts");
  // Each example takes at least its 8-byte token count.
  if (count > static_cast<uint64_t>(end - p) / 8) {
    return fail("damaged: " + std::to_string(count) + " examples cannot fit in " + std::to_string(size) + " bytes");
  }
  data.examples.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (end - p < 8) return fail("damaged: example " + std::to_string(i) + " runs past the end");
    const uint64_t n = LoadU64(p);
    p += 8;
    if (n > static_cast<uint64_t>(end - p) / 8) {
      return fail("damaged: example " + std::to_string(i) + " of " + std::to_string(n) +
                  " tokens runs past the end");
    }
    TokenExample& ex = data.examples[i];
    if (!LoadI32s(p, n, false, ex.input_ids)) return fail("damaged: example " + std::to_string(i) + " has an id < 0");
    p += 4 * n;
    if (!LoadI32s(p, n, true, ex.labels)) {
      return fail("damaged: example " + std::to_string(i) + " has a label < 0 other than -100");
    }
    p += 4 * n;
  }
  if (p != end) return fail("damaged: " + std::to_string(end - p) + " bytes after the last example");
  return data;
}

}  // namespace

Status WriteDatasetCache(const std::string& path, const std::string& key, const TokenDataset& data) {
  const std::string where = "writing dataset cache " + path;
  if (key.size() > kMaxDatasetCacheKey) {
    return Status::Error(where + ": the key is " + std::to_string(key.size()) + " bytes, more than " +
                         std::to_string(kMaxDatasetCacheKey));
  }
  size_t total = 16 + key.size() + 32 + kChecksumSize;
  for (size_t i = 0; i < data.examples.size(); ++i) {
    const TokenExample& ex = data.examples[i];
    const std::string example = where + ": example " + std::to_string(i);
    if (ex.labels.size() != ex.input_ids.size()) {
      return Status::Error(example + " has " + std::to_string(ex.labels.size()) + " labels for " +
                           std::to_string(ex.input_ids.size()) + " ids");
    }
    if (!ex.position_ids.empty()) return Status::Error(example + " has position_ids, which the cache does not hold");
    for (int64_t id : ex.input_ids) {
      if (id < 0 || id > kMaxId) return Status::Error(example + " has id " + std::to_string(id) + " outside int32");
    }
    for (int64_t label : ex.labels) {
      if ((label < 0 || label > kMaxId) && label != kIgnoreIndex) {
        return Status::Error(example + " has label " + std::to_string(label) + " outside int32 and not -100");
      }
    }
    total += 8 + 8 * ex.input_ids.size();
  }

  std::string out;
  out.reserve(total);
  out.append(kMagic, sizeof(kMagic));
  PutU32(out, kDatasetCacheVersion);
  PutU32(out, static_cast<uint32_t>(key.size()));
  out += key;
  PutU64(out, static_cast<uint64_t>(data.lines));
  PutU64(out, static_cast<uint64_t>(data.truncated));
  PutU64(out, static_cast<uint64_t>(data.dropped));
  PutU64(out, data.examples.size());
  for (const TokenExample& ex : data.examples) {
    PutU64(out, ex.input_ids.size());
    const size_t at = out.size();
    out.resize(at + 8 * ex.input_ids.size());
    PutI32s(out.data() + at, ex.input_ids);
    PutI32s(out.data() + at + 4 * ex.input_ids.size(), ex.labels);
  }
  Sha256 hash;
  hash.Update(out);
  const auto digest = hash.Digest();
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());

  const fs::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) return Status::Error(where + ": creating folder " + target.parent_path().string() + ": " + ec.message());
  }
  return WriteFileAtomically(path, out);
}

std::optional<TokenDataset> ReadDatasetCache(const std::string& path, const std::string& key,
                                             std::string* why_not) {
  std::string ignored;
  if (why_not == nullptr) why_not = &ignored;
  try {
    std::unique_ptr<unsigned char[]> file;
    size_t size = 0;
    if (!ReadWholeFile(path, file, size, why_not)) return std::nullopt;
    return Decode(file.get(), size, key, why_not);
  } catch (const std::exception& e) {  // bad_alloc on a huge file or dataset
    *why_not = std::string("cannot load: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace trainerd::engine
