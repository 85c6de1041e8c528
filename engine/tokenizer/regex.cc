#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

// Oniguruma's Unicode \s, without brackets, to splice into a character class.
constexpr char kWhiteSpaceItems[] =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}"
    "\\x{3000}";

std::string TranslateOnigPattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceItems;
        } else {
          out += '[';
          out += kWhiteSpaceItems;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceItems;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' or '^]' right after '[' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string translated = TranslateOnigPattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return Status::Error("regex \"" + std::string(pattern) + "\" does not compile: " +
                         reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
  std::unique_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  return regex;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Status Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  // One pair of offsets is all we read; a per-thread block avoids an allocation per call.
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // As the onig crate's find_iter: an empty match ending where the previous
  // match ended is skipped by moving the search on one character.
  size_t pos = 0;
  size_t last_match_end = std::string_view::npos;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return Status::Error("regex \"" + pattern_ + "\" failed on a text of " + std::to_string(text.size()) +
                           " bytes: " + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t start = ovector[0], end = ovector[1];
    if (start == end && end == last_match_end) {
      pos += pos < text.size() ? Utf8Length(static_cast<unsigned char>(text[pos])) : 1;
      continue;
    }
    matches->emplace_back(start, end);
    pos = end;
    last_match_end = end;
  }
  return Status::Ok();
}

}  // namespace trainerd::engine::tokenizer
