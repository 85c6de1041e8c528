// The on-disk cache of a tokenized dataset, so that a job's JSONL is
// tokenized once. The caller computes the key (a SHA-256 hex digest of
// everything the tokenization depends on, engine/sha256.h); this file only
// stores and checks it. Torch-free.
//
// File layout, version 1 (integers little-endian; no padding, so the int32
// arrays need not be aligned):
//   offset  size  field
//   0       8     magic "TRDSCACH"
//   8       4     uint32 format version (kDatasetCacheVersion)
//   12      4     uint32 key length K (at most kMaxDatasetCacheKey)
//   16      K     key bytes
//   16+K    8     int64 lines
//   24+K    8     int64 truncated
//   32+K    8     int64 dropped
//   40+K    8     uint64 number of examples N
//   48+K          N examples, each:
//                   uint64 token count n
//                   n x int32 input_ids (each >= 0)
//                   n x int32 labels (each >= 0 or -100)
//   size-32 32    SHA-256 of every byte before it (damage detection)
// position_ids are not stored: they are empty until packing, which runs after
// loading.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "engine/token_dataset.h"

namespace trainerd::engine {

inline constexpr uint32_t kDatasetCacheVersion = 1;
inline constexpr uint32_t kMaxDatasetCacheKey = 1024;

// Writes `data` (examples' input_ids and labels; lines, truncated, dropped) to
// `path` atomically (WriteFileAtomically: a reader never sees a half-written
// file), tagged with `key`. Creates the parent folder if needed. Errors name
// the path; an example with position_ids, labels of another length, an id
// outside [0, 2^31) or a label outside it and not -100 is refused.
Status WriteDatasetCache(const std::string& path, const std::string& key, const TokenDataset& data);

// The dataset stored at `path` when it exists, is a complete and undamaged
// cache file of this format version and was written with the same `key`;
// otherwise nullopt, and *why_not (when not null) says why in a few words for
// a log line: "no cache file", "written for another key", "damaged: ...",
// "format version 0, want 1", ... Never throws and never trusts the file:
// every length is checked against the file size before anything is allocated
// for it. Reads the file in one go.
std::optional<TokenDataset> ReadDatasetCache(const std::string& path, const std::string& key,
                                             std::string* why_not);

}  // namespace trainerd::engine
