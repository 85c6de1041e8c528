#include "engine/tokenizer/normalizer.h"

#include <vector>

#include "engine/tokenizer/component_json.h"
#include "engine/tokenizer/split_pattern.h"
#include "engine/tokenizer/unicode_nfc.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

using nlohmann::json;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) TRAINERD_RETURN_IF_ERROR(step->Normalize(text));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Prepends a string to a non-empty text.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

// Replaces every non-overlapping match, left to right, with `content`.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(SplitPattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status Normalize(std::string* text) const override {
    std::vector<PatternPiece> pieces;
    TRAINERD_RETURN_IF_ERROR(pattern_.FindPieces(*text, false, &pieces));
    std::string out;
    out.reserve(text->size());
    for (const auto& piece : pieces) {
      if (piece.is_match) {
        out += content_;
      } else {
        out.append(*text, piece.start, piece.end - piece.start);
      }
    }
    *text = std::move(out);
    return Status::Ok();
  }

 private:
  SplitPattern pattern_;
  std::string content_;
};

// Removes leading and/or trailing Unicode white space.
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t length;
        if (!IsUnicodeWhiteSpace(DecodeUtf8At(*text, begin, &length))) break;
        begin += length;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t length;
        if (!IsUnicodeWhiteSpace(DecodeUtf8At(*text, start, &length))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_, right_;
};

// Unicode Normalization Form C (unicode_nfc.h).
class NfcNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = NormalizeNfc(*text);
    return Status::Ok();
  }
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& config) {
  if (config.is_null()) return std::unique_ptr<Normalizer>();
  std::string type;
  TRAINERD_RETURN_IF_ERROR(ReadType(config, "normalizer", &type));
  const std::string where = "normalizer " + type;
  if (type == "Sequence") {
    auto it = config.find("normalizers");
    if (it == config.end() || !it->is_array()) return Status::Error(where + ": \"normalizers\" must be an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step_config : *it) {
      if (step_config.is_null()) continue;
      TRAINERD_ASSIGN_OR_RETURN(auto step, ParseNormalizer(step_config));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Prepend") {
    std::string prefix;
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "prepend", where, true, &prefix));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    TRAINERD_ASSIGN_OR_RETURN(SplitPattern pattern, ReadPattern(config, where));
    std::string content;
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "content", where, true, &content));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "Strip") {
    bool left = false, right = false;
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "strip_left", where, &left));
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "strip_right", where, &right));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new NfcNormalizer());
  return UnsupportedType("normalizer", type);
}

}  // namespace trainerd::engine::tokenizer
