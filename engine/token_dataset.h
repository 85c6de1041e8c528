// The `tokens` data format: JSONL, one example per line,
//   {"input_ids": [int, ...], "labels": [int, ...]}   ("labels" optional)
// labels default to input_ids; -100 marks a position that is not trained. As in
// Hugging Face causal LMs, label t is predicted from positions < t, so the
// first label never counts. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainerd::engine {

inline constexpr int64_t kIgnoreIndex = -100;

struct TokenExample {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;  // same length as input_ids
  // Empty for one example; for a packed sequence (engine/packing.h) the
  // positions of each packed example, restarting at 0 where it starts.
  std::vector<int64_t> position_ids;

  // Positions 1..n-1 whose label is not kIgnoreIndex.
  int64_t target_tokens() const;
};

struct TokenDataset {
  std::vector<TokenExample> examples;
  int64_t lines = 0;      // non-blank lines read
  int64_t truncated = 0;  // examples cut to max_seq_len
  int64_t dropped = 0;    // examples with no target token left (after truncation)

  // Tokens of all examples, and how many of them are targets of the loss
  // (the sums of input_ids.size() and target_tokens()).
  struct TokenCounts {
    int64_t tokens = 0;
    int64_t trained = 0;
  };
  TokenCounts CountTokens() const;

  // The example with the most input tokens (the first of equals); nullptr
  // when there is none.
  const TokenExample* Longest() const;

  // Adds one example: truncated to max_seq_len (counted), or dropped (counted)
  // when nothing is left to train. Every data format goes through here.
  void Add(TokenExample example, int64_t max_seq_len);
};

// Reads and validates a tokens file. Every id must be in [0, vocab_size) and
// every label in [0, vocab_size) or -100; errors name file:line and the field.
// Examples longer than max_seq_len are truncated; those with nothing to train
// are dropped and counted. An empty file, or one whose examples all drop, is an error.
StatusOr<TokenDataset> LoadTokenDataset(const std::string& path, int64_t vocab_size, int64_t max_seq_len);

}  // namespace trainerd::engine
