#include "engine/tokenizer/pre_tokenizer.h"

#include <utility>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/component_json.h"
#include "engine/tokenizer/split_pattern.h"

namespace trainerd::engine::tokenizer {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenization regex, which ByteLevel uses with use_regex.
constexpr char kGpt2Regex[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Appends the non-empty ranges of `piece` to *out.
void AppendRanges(PreToken&& piece, const std::vector<std::pair<size_t, size_t>>& ranges,
                  std::vector<PreToken>* out) {
  if (ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == piece.text.size()) {
    if (!piece.text.empty()) out->push_back(std::move(piece));
    return;
  }
  for (const auto& [start, end] : ranges) {
    if (start == end) continue;
    out->push_back({piece.text.substr(start, end - start), piece.at_text_start && start == 0});
  }
}

// Splits every piece on `pattern` with `behavior`.
Status SplitAll(const SplitPattern& pattern, bool invert, SplitBehavior behavior, std::vector<PreToken>* pieces) {
  std::vector<PreToken> out;
  out.reserve(pieces->size() * 2);
  std::vector<PatternPiece> found;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto& piece : *pieces) {
    TRAINERD_RETURN_IF_ERROR(pattern.FindPieces(piece.text, invert, &found));
    ApplySplitBehavior(found, behavior, &ranges);
    AppendRanges(std::move(piece), ranges, &out);
  }
  *pieces = std::move(out);
  return Status::Ok();
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) TRAINERD_RETURN_IF_ERROR(step->PreTokenize(pieces));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(SplitPattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitAll(pattern_, invert_, behavior_, pieces);
  }

 private:
  SplitPattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Optionally prefixes a space and splits with the GPT-2 regex, then maps every
// byte to its byte-level character. trim_offsets only affects offsets.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<SplitPattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (auto& piece : *pieces)
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(0, " ");
    }
    if (regex_) TRAINERD_RETURN_IF_ERROR(SplitAll(*regex_, false, SplitBehavior::kIsolated, pieces));
    std::string mapped;
    for (auto& piece : *pieces) {
      mapped.clear();
      AppendByteLevel(piece.text, &mapped);
      piece.text.swap(mapped);
    }
    return Status::Ok();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPattern> regex_;  // null without use_regex
};

enum class PrependScheme { kAlways, kFirst, kNever };

// Replaces spaces by the replacement character, prepends one as the scheme
// says and optionally splits before each replacement character.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        split_pattern_(SplitPattern::Literal(replacement_)) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (auto& piece : *pieces) {
      std::string& text = piece.text;
      std::string replaced;
      replaced.reserve(text.size() + 8);
      for (char c : text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      text.swap(replaced);
      const bool starts_with_replacement = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts_with_replacement &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_text_start))) {
        text.insert(0, replacement_);
      }
    }
    if (split_) return SplitAll(split_pattern_, false, SplitBehavior::kMergedWithNext, pieces);
    std::vector<PreToken> kept;
    for (auto& piece : *pieces)
      if (!piece.text.empty()) kept.push_back(std::move(piece));
    *pieces = std::move(kept);
    return Status::Ok();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  SplitPattern split_pattern_;
};

template <typename T>
StatusOr<std::unique_ptr<PreTokenizer>> Made(StatusOr<SplitPattern> pattern, SplitBehavior behavior) {
  if (!pattern.ok()) return pattern.status();
  return std::unique_ptr<PreTokenizer>(new T(std::move(pattern).value(), behavior, false));
}

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& config) {
  if (config.is_null()) return std::unique_ptr<PreTokenizer>();
  std::string type;
  TRAINERD_RETURN_IF_ERROR(ReadType(config, "pre_tokenizer", &type));
  const std::string where = "pre_tokenizer " + type;
  if (type == "Sequence") {
    auto it = config.find("pretokenizers");
    if (it == config.end() || !it->is_array())
      return Status::Error(where + ": \"pretokenizers\" must be an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step_config : *it) {
      TRAINERD_ASSIGN_OR_RETURN(auto step, ParsePreTokenizer(step_config));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "ByteLevel") {
    bool add_prefix_space = true, trim_offsets = true, use_regex = true;
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "add_prefix_space", where, &add_prefix_space));
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "trim_offsets", where, &trim_offsets));
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "use_regex", where, &use_regex));
    std::unique_ptr<SplitPattern> regex;
    if (use_regex) {
      TRAINERD_ASSIGN_OR_RETURN(SplitPattern pattern, SplitPattern::FromRegex(kGpt2Regex));
      regex = std::make_unique<SplitPattern>(std::move(pattern));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
  }
  if (type == "Split") {
    TRAINERD_ASSIGN_OR_RETURN(SplitPattern pattern, ReadPattern(config, where));
    std::string behavior_name;
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "behavior", where, true, &behavior_name));
    SplitBehavior behavior;
    if (!ParseSplitBehavior(behavior_name, &behavior))
      return Status::Error(where + ": unknown behavior \"" + behavior_name + "\"");
    bool invert = false;
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "invert", where, &invert));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "Metaspace") {
    std::string replacement;
    TRAINERD_RETURN_IF_ERROR(ReadChar(config, "replacement", where, &replacement));
    std::string scheme_name = "always";
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "prepend_scheme", where, false, &scheme_name));
    PrependScheme scheme;
    if (scheme_name == "always") scheme = PrependScheme::kAlways;
    else if (scheme_name == "first") scheme = PrependScheme::kFirst;
    else if (scheme_name == "never") scheme = PrependScheme::kNever;
    else return Status::Error(where + ": unknown prepend_scheme \"" + scheme_name + "\"");
    // Older files say add_prefix_space instead; false means never.
    if (config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean() &&
        !config["add_prefix_space"].get<bool>()) {
      if (scheme != PrependScheme::kNever && config.contains("prepend_scheme"))
        return Status::Error(where + ": add_prefix_space does not match declared prepend_scheme");
      scheme = PrependScheme::kNever;
    }
    bool split = true;
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "split", where, &split));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(replacement, scheme, split));
  }
  if (type == "Digits") {
    bool individual = false;
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "individual_digits", where, &individual));
    // Each numeric character is one match (Rust's char::is_numeric is \p{N}).
    return Made<SplitPreTokenizer>(SplitPattern::FromRegex(R"(\p{N})"),
                                   individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "Punctuation") {
    std::string behavior_name = "Isolated";
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "behavior", where, false, &behavior_name));
    SplitBehavior behavior;
    if (!ParseSplitBehavior(behavior_name, &behavior))
      return Status::Error(where + ": unknown behavior \"" + behavior_name + "\"");
    // ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~) or
    // Unicode punctuation, one character per match.
    return Made<SplitPreTokenizer>(SplitPattern::FromRegex(R"([\p{P}\x{21}-\x{2f}\x{3a}-\x{40}\x{5b}-\x{60}\x{7b}-\x{7e}])"),
                                   behavior);
  }
  if (type == "WhitespaceSplit") {
    return Made<SplitPreTokenizer>(SplitPattern::FromRegex(R"(\s)"), SplitBehavior::kRemoved);
  }
  return UnsupportedType("pre_tokenizer", type);
}

}  // namespace trainerd::engine::tokenizer
