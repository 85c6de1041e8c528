#include "engine/tokenizer/split_pattern.h"

#include <algorithm>

namespace trainerd::engine::tokenizer {

SplitPattern SplitPattern::Literal(std::string literal) {
  SplitPattern pattern;
  pattern.literal_ = std::move(literal);
  return pattern;
}

StatusOr<SplitPattern> SplitPattern::FromRegex(std::string_view regex) {
  TRAINERD_ASSIGN_OR_RETURN(std::unique_ptr<Regex> compiled, Regex::Compile(regex));
  SplitPattern pattern;
  pattern.regex_ = std::move(compiled);
  return pattern;
}

Status SplitPattern::FindPieces(std::string_view text, bool invert, std::vector<PatternPiece>* pieces) const {
  pieces->clear();
  if (text.empty()) {
    pieces->push_back({0, 0, invert});
    return Status::Ok();
  }
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  if (regex_) {
    TRAINERD_RETURN_IF_ERROR(regex_->FindAll(text, &matches));
  } else {
    // Non-empty literal (checked when parsed): non-overlapping, left to right.
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      matches.emplace_back(pos, pos + literal_.size());
      pos += literal_.size();
    }
  }
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (prev != start) pieces->push_back({prev, start, invert});
    pieces->push_back({start, end, !invert});
    prev = end;
  }
  if (prev != text.size()) pieces->push_back({prev, text.size(), invert});
  return Status::Ok();
}

bool ParseSplitBehavior(std::string_view name, SplitBehavior* behavior) {
  if (name == "Removed") *behavior = SplitBehavior::kRemoved;
  else if (name == "Isolated") *behavior = SplitBehavior::kIsolated;
  else if (name == "MergedWithPrevious") *behavior = SplitBehavior::kMergedWithPrevious;
  else if (name == "MergedWithNext") *behavior = SplitBehavior::kMergedWithNext;
  else if (name == "Contiguous") *behavior = SplitBehavior::kContiguous;
  else return false;
  return true;
}

void ApplySplitBehavior(const std::vector<PatternPiece>& pieces, SplitBehavior behavior,
                        std::vector<std::pair<size_t, size_t>>* kept) {
  kept->clear();
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& p : pieces) kept->emplace_back(p.start, p.end);
      return;
    case SplitBehavior::kRemoved:
      for (const auto& p : pieces)
        if (!p.is_match) kept->emplace_back(p.start, p.end);
      return;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& p : pieces) {
        if (p.is_match == previous_match && !kept->empty()) {
          kept->back().second = p.end;
        } else {
          kept->emplace_back(p.start, p.end);
        }
        previous_match = p.is_match;
      }
      return;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& p : pieces) {
        if (p.is_match && !previous_match && !kept->empty()) {
          kept->back().second = p.end;
        } else {
          kept->emplace_back(p.start, p.end);
        }
        previous_match = p.is_match;
      }
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      // Walks backwards: a match joins the piece that follows it.
      bool previous_match = false;
      for (size_t i = pieces.size(); i-- > 0;) {
        const auto& p = pieces[i];
        if (p.is_match && !previous_match && !kept->empty()) {
          kept->back().first = p.start;
        } else {
          kept->emplace_back(p.start, p.end);
        }
        previous_match = p.is_match;
      }
      std::reverse(kept->begin(), kept->end());
      return;
    }
  }
}

}  // namespace trainerd::engine::tokenizer
