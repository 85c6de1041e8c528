#include "engine/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <map>

#include "engine/tokenizer/component_json.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

using nlohmann::json;

// Rust regex's \w for single_word: alphabetic, marks, decimal digits,
// connector punctuation, join controls.
const Regex& WordCharRegex() {
  static const std::unique_ptr<Regex> regex =
      std::move(Regex::Compile(R"(^[\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200c}\x{200d}]$)")).value();
  return *regex;
}

bool IsWordChar(std::string_view one_char) {
  std::vector<std::pair<size_t, size_t>> matches;
  return WordCharRegex().FindAll(one_char, &matches).ok() && !matches.empty();
}

bool EndsWithWordChar(std::string_view text) {
  if (text.empty()) return false;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return IsWordChar(text.substr(start));
}

bool StartsWithWordChar(std::string_view text) {
  if (text.empty()) return false;
  return IsWordChar(text.substr(0, Utf8Length(static_cast<unsigned char>(text[0]))));
}

// Start of the run of white space that ends `text`.
size_t TrailingSpaceStart(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t length;
    if (!IsUnicodeWhiteSpace(DecodeUtf8At(text, start, &length))) break;
    end = start;
  }
  return end;
}

// Length of the run of white space that starts `text`.
size_t LeadingSpaceLength(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length;
    if (!IsUnicodeWhiteSpace(DecodeUtf8At(text, pos, &length))) break;
    pos += length;
  }
  return pos;
}

}  // namespace

StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const json& added_tokens, const BpeModel& model,
                                                    const Normalizer* normalizer) {
  AddedVocabulary vocabulary;
  vocabulary.id_end_ = model.id_end();
  if (added_tokens.is_null()) return vocabulary;
  if (!added_tokens.is_array()) return Status::Error("\"added_tokens\" must be an array");
  int32_t next_id = static_cast<int32_t>(model.vocab_size());
  size_t index = 0;
  for (const auto& entry : added_tokens) {
    const std::string where = "added_tokens[" + std::to_string(index++) + "]";
    if (!entry.is_object()) return Status::Error(where + " must be an object");
    AddedToken token;
    TRAINERD_RETURN_IF_ERROR(ReadString(entry, "content", where, true, &token.content));
    TRAINERD_RETURN_IF_ERROR(ReadBool(entry, "special", where, &token.special));
    TRAINERD_RETURN_IF_ERROR(ReadBool(entry, "single_word", where, &token.single_word));
    TRAINERD_RETURN_IF_ERROR(ReadBool(entry, "lstrip", where, &token.lstrip));
    TRAINERD_RETURN_IF_ERROR(ReadBool(entry, "rstrip", where, &token.rstrip));
    token.normalized = !token.special;  // HF's default when the key is absent
    TRAINERD_RETURN_IF_ERROR(ReadBool(entry, "normalized", where, &token.normalized));
    if (token.content.empty()) continue;
    int32_t id;
    if (auto it = vocabulary.by_content_.find(token.content); it != vocabulary.by_content_.end()) {
      id = it->second;
    } else if (auto model_id = model.TokenToId(token.content)) {
      id = *model_id;
    } else {
      id = next_id++;
    }
    vocabulary.by_content_[token.content] = id;
    vocabulary.decoded_form_.erase(id);
    if (token.normalized && normalizer != nullptr) {
      std::string normalized = token.content;
      TRAINERD_RETURN_IF_ERROR(normalizer->Normalize(&normalized).WithContext(where));
      if (normalized != token.content) vocabulary.decoded_form_[id] = normalized;
    }
    vocabulary.by_id_[id] = token;
    vocabulary.id_end_ = std::max(vocabulary.id_end_, id + 1);
  }
  // The patterns: one per id, in its matched form.
  for (const auto& [id, token] : vocabulary.by_id_) {
    const int set = token.normalized ? 1 : 0;
    auto form = vocabulary.decoded_form_.find(id);
    std::string text = form != vocabulary.decoded_form_.end() ? form->second : token.content;
    if (text.empty()) continue;
    vocabulary.buckets_[set][static_cast<unsigned char>(text[0])].push_back({std::move(text), id});
    vocabulary.has_patterns_[set] = true;
  }
  for (auto& sets : vocabulary.buckets_) {
    for (auto& bucket : sets) {
      std::sort(bucket.begin(), bucket.end(), [](const Pattern& a, const Pattern& b) {
        return a.text.size() != b.text.size() ? a.text.size() > b.text.size() : a.text < b.text;
      });
    }
  }
  return vocabulary;
}

void AddedVocabulary::Segment(std::string_view text, bool normalized_tokens,
                              std::vector<TextSegment>* segments) const {
  segments->clear();
  if (text.empty()) {
    segments->push_back({0, 0, -1});
    return;
  }
  const int set = normalized_tokens ? 1 : 0;
  if (!has_patterns_[set]) {
    segments->push_back({0, text.size(), -1});
    return;
  }
  const auto& buckets = buckets_[set];
  size_t start_offset = 0;  // end of the last emitted segment
  size_t search = 0;        // where the next leftmost-longest search starts
  while (search < text.size()) {
    // The leftmost position where a pattern matches; the longest one there.
    const Pattern* found = nullptr;
    size_t at = search;
    for (; at < text.size() && found == nullptr; ++at) {
      for (const Pattern& p : buckets[static_cast<unsigned char>(text[at])]) {
        if (text.compare(at, p.text.size(), p.text) == 0) {
          found = &p;
          break;
        }
      }
    }
    if (found == nullptr) break;
    size_t start = at - 1;
    size_t stop = start + found->text.size();
    search = stop;
    const AddedToken& token = by_id_.at(found->id);
    if (token.single_word) {
      const bool space_before = start == 0 || !EndsWithWordChar(text.substr(0, start));
      const bool space_after = stop == text.size() || !StartsWithWordChar(text.substr(stop));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (start_offset < start) segments->push_back({start_offset, start, -1});
    segments->push_back({start, stop, found->id});
    start_offset = stop;
  }
  if (start_offset < text.size()) segments->push_back({start_offset, text.size(), -1});
}

std::optional<int32_t> AddedVocabulary::TokenToId(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::Find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

const std::string* AddedVocabulary::DecodedForm(int32_t id) const {
  if (auto it = decoded_form_.find(id); it != decoded_form_.end()) return &it->second;
  if (auto it = by_id_.find(id); it != by_id_.end()) return &it->second.content;
  return nullptr;
}

}  // namespace trainerd::engine::tokenizer
