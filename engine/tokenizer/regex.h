// A compiled Unicode regular expression (PCRE2, UTF + UCP, JIT when available)
// for the patterns in tokenizer.json, which Hugging Face tokenizers runs with
// Oniguruma.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainerd::engine::tokenizer {

class Regex {
 public:
  // Compiles an Oniguruma-syntax `pattern`. `\s` and `\S` are rewritten to
  // Unicode White_Space as Oniguruma defines them (PCRE2's UCP \s leaves out
  // U+0085); \p{L}, \p{N}, (?i:...) and lookahead mean the same in both.
  static StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [start, end) byte ranges of the successive non-overlapping
  // leftmost matches in valid UTF-8 `text`; after an empty match the search
  // resumes one character later. Thread-safe.
  Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*, owned
};

}  // namespace trainerd::engine::tokenizer
