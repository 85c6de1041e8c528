// What a Split-like step cuts on, and how the cut pieces are kept: Hugging
// Face tokenizers' Pattern::find_matches and SplitDelimiterBehavior.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer/regex.h"

namespace trainerd::engine::tokenizer {

// One piece of a text: a match of the pattern or the text between matches.
struct PatternPiece {
  size_t start;
  size_t end;
  bool is_match;
};

// A literal string or a regex. The pieces cover the text in order; an empty
// text yields one empty non-match piece.
class SplitPattern {
 public:
  static SplitPattern Literal(std::string literal);
  static StatusOr<SplitPattern> FromRegex(std::string_view regex);
  Status FindPieces(std::string_view text, bool invert, std::vector<PatternPiece>* pieces) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // null for a literal
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Parses "Removed", "Isolated", ...; false for an unknown name.
bool ParseSplitBehavior(std::string_view name, SplitBehavior* behavior);

// The [start, end) ranges kept from `pieces` under `behavior`, in order; may
// contain empty ranges (callers drop them, as HF does).
void ApplySplitBehavior(const std::vector<PatternPiece>& pieces, SplitBehavior behavior,
                        std::vector<std::pair<size_t, size_t>>* kept);

}  // namespace trainerd::engine::tokenizer
