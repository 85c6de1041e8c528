// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback
// and unknown-token handling, applied to one pre-tokenized word at a time as
// Hugging Face tokenizers' BPE does.
//
// Supported keys: vocab, merges ("a b" strings or ["a", "b"] pairs),
// unk_token, fuse_unk, byte_fallback, ignore_merges. A non-null, non-zero
// dropout, continuing_subword_prefix or end_of_word_suffix is an error.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tokenizer/merge_table.h"

namespace trainerd::engine::tokenizer {

class BpeModel {
 public:
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& config);

  // Appends the ids of non-empty `word`. Thread-safe (the word cache is
  // guarded by a mutex). Fails only when unk_token is needed but not in the
  // vocabulary.
  Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Null for an id outside the vocabulary. The pointer lives as long as *this.
  const std::string* IdToToken(int32_t id) const;
  // Number of vocabulary entries (HF's get_vocab_size for the model).
  size_t vocab_size() const { return vocab_.size(); }
  // One more than the largest id in the vocabulary.
  int32_t id_end() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  BpeModel() = default;
  Status MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  // Token strings are owned by token_storage_; the map's keys view them.
  std::vector<std::unique_ptr<std::string>> token_storage_;
  std::unordered_map<std::string_view, int32_t> vocab_;
  std::vector<const std::string*> id_to_token_;  // null where no token has the id
  MergeTable merges_;                            // (left id, right id) → rank and merged id
  std::optional<std::string> unk_token_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_fallback_ids_;  // id of "<0xXX>" per byte, -1 if absent
  std::vector<int32_t> ascii_ids_;          // id of each one-character ASCII token, -1 if absent

  // Words seen before → ids, up to kCacheCapacity words shorter than
  // kCacheMaxWordBytes (as HF's cache), then no more insertions. Sharded by
  // the word's hash, each shard with its own lock, so tokenizing threads
  // rarely wait for each other.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  static constexpr size_t kCacheShards = 64;
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> words;  // guarded by mutex
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace trainerd::engine::tokenizer
