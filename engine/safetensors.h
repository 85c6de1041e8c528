// Reader and writer of the safetensors format, without torch.
//
// Layout of a file (the reference is huggingface/safetensors):
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian;
//   bytes [8, 8+N)      a JSON object: for each tensor
//                         "name": {"dtype": "F32", "shape": [d0, ...],
//                                  "data_offsets": [begin, end]}
//                       plus an optional "__metadata__": {string: string};
//   bytes [8+N, EOF)    the data buffer. Offsets are relative to its start;
//                       sorted by offset, the tensors tile it exactly (no
//                       gap, no overlap, nothing after the last one).
// Tensor bytes are row-major (C order) and little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainerd::engine {

// The element types this engine reads and writes. The reference format has
// more (U16, U32, U64, F8_E4M3, F8_E5M2, ...); files using them are rejected
// with an error naming the tensor and the dtype.
enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element: 4 for kF32, 1 for kBool, ...
size_t dtype_size(DType dtype);
// The name used in the header: "F32", "F16", "BF16", "F64", "I64", "I32",
// "I16", "I8", "U8", "BOOL".
const char* dtype_name(DType dtype);
// Inverse of dtype_name (exact, case-sensitive); nullopt for any other string.
std::optional<DType> dtype_from_name(std::string_view name);

// One tensor of an open SafetensorsFile. `data` points into the file's
// read-only mapping and stays valid while the SafetensorsFile lives. It is not
// necessarily aligned to dtype_size(dtype) (the format does not align tensors):
// read elements with memcpy or copy the bytes out.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // empty for a scalar (numel 1)
  const void* data;            // nbytes bytes; never dereference when nbytes == 0
  size_t nbytes;               // == numel() * dtype_size(dtype)
  int64_t numel() const;       // product of shape; 1 for a scalar
};

// A safetensors file, memory-mapped read-only (MAP_PRIVATE). Open validates
// the whole header against the file size, so that every view it hands out
// lies inside the mapping. Not copyable or movable: views point into it.
class SafetensorsFile {
 public:
  // Errors (each names `path`, and the tensor where there is one): missing
  // file, a directory, a file shorter than 8 bytes, a header length larger
  // than the file or than 100 MB, a header that is not a JSON object, an
  // unknown dtype, a bad shape or data_offsets, a tensor past the end of the
  // data buffer (a truncated file), a byte range that does not match
  // shape x dtype, tensors that overlap or leave holes or trailing bytes.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // In file order: ascending data offset (header order among empty tensors
  // that share an offset).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr if the file has no tensor of that name.
  const TensorView* Find(const std::string& name) const;
  // The "__metadata__" object; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  explicit SafetensorsFile(std::string path) : path_(std::move(path)) {}

  std::string path_;
  void* mapping_ = nullptr;  // mapping_size_ bytes, or nullptr
  size_t mapping_size_ = 0;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// One tensor to write. `data` (nbytes bytes, row-major, little-endian) is
// only read during the WriteSafetensors call.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // may be nullptr when nbytes == 0
  size_t nbytes;     // must equal product(shape) * dtype_size(dtype)
};

// Writes a safetensors file at `path`, replacing any file there atomically:
// the bytes go to a temporary file in the same folder, which is fsynced,
// renamed over `path`, and the folder fsynced. On failure the temporary file
// is removed and `path` is left as it was.
//
// Tensors are laid out in the order given (not sorted by name); each tensor's
// bytes are streamed from `data`, never gathered into one buffer (merged 8B
// models are 16 GB). The header is padded with spaces to a multiple of 8
// bytes, as the reference implementation does, so the data buffer starts
// 8-aligned. `metadata` becomes "__metadata__" (omitted when empty).
//
// Rejected before anything is written: an empty name, the reserved name
// "__metadata__", duplicate names, a negative dimension, nbytes !=
// numel * dtype_size, and nullptr data with nbytes > 0.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace trainerd::engine
