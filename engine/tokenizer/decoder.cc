#include "engine/tokenizer/decoder.h"

#include <cstdint>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/component_json.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

using nlohmann::json;

std::u32string ToCodePoints(const std::string& text) {
  std::u32string out;
  for (size_t pos = 0; pos < text.size();) {
    size_t length;
    out.push_back(DecodeUtf8At(text, pos, &length));
    pos += length;
  }
  return out;
}

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Byte-level characters back to bytes; a token with any other character keeps
// its own bytes. The result is one lossily decoded string.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size();) {
        size_t length;
        const int b = ByteLevelByte(DecodeUtf8At(token, pos, &length));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
        pos += length;
      }
      if (!all_mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first) : replacement_(replacement), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string& token = (*tokens)[i];
      std::string out;
      for (size_t pos = 0; pos < token.size();) {
        size_t length;
        const char32_t c = DecodeUtf8At(token, pos, &length);
        if (c == replacement_) {
          // HF drops every replacement character of the first token.
          if (!(i == 0 && strip_first_)) out += ' ';
        } else {
          out.append(token, pos, length);
        }
        pos += length;
      }
      (*tokens)[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      if (token.find(pattern_) == std::string::npos) continue;
      std::string out;
      size_t pos = 0, hit;
      while ((hit = token.find(pattern_, pos)) != std::string::npos) {
        out.append(token, pos, hit - pos);
        out += content_;
        pos = hit + pattern_.size();
      }
      out.append(token, pos, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  std::string pattern_, content_;
};

// Runs of "<0xXX>" tokens become the text of their bytes, or one U+FFFD per
// byte when the run is not valid UTF-8.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    auto flush = [&]() {
      if (run.empty()) return;
      if (FindInvalidUtf8(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& token : *tokens) {
      int byte = ByteOf(token);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens->swap(out);
  }

 private:
  // Rust's u8::from_str_radix(&token[3..5], 16) on "<0x??>": two hex digits
  // or '+' and one.
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int ByteOf(const std::string& token) {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
    const int low = HexDigit(token[4]);
    if (low < 0) return -1;
    if (token[3] == '+') return low;
    const int high = HexDigit(token[3]);
    return high < 0 ? -1 : high * 16 + low;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined += token;
    tokens->assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of
// each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      const std::u32string chars = ToCodePoints(token);
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i] == content_; ++i) start_cut = i + 1;
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size() && chars[chars.size() - i - 1] == content_; ++i)
        stop_cut = chars.size() - i - 1;
      std::string out;
      for (size_t i = start_cut; i < stop_cut; ++i) AppendUtf8(chars[i], &out);
      token = std::move(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

char32_t FirstCodePoint(const std::string& one_char) {
  size_t length;
  return DecodeUtf8At(one_char, 0, &length);
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& config) {
  if (config.is_null()) return std::unique_ptr<Decoder>();
  std::string type;
  TRAINERD_RETURN_IF_ERROR(ReadType(config, "decoder", &type));
  const std::string where = "decoder " + type;
  if (type == "Sequence") {
    auto it = config.find("decoders");
    if (it == config.end() || !it->is_array()) return Status::Error(where + ": \"decoders\" must be an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step_config : *it) {
      TRAINERD_ASSIGN_OR_RETURN(auto step, ParseDecoder(step_config));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    std::string replacement;
    TRAINERD_RETURN_IF_ERROR(ReadChar(config, "replacement", where, &replacement));
    std::string scheme = "always";
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "prepend_scheme", where, false, &scheme));
    if (scheme != "always" && scheme != "first" && scheme != "never")
      return Status::Error(where + ": unknown prepend_scheme \"" + scheme + "\"");
    bool add_prefix_space = true;
    TRAINERD_RETURN_IF_ERROR(ReadBool(config, "add_prefix_space", where, &add_prefix_space));
    if (!add_prefix_space) scheme = "never";
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(FirstCodePoint(replacement), scheme != "never"));
  }
  if (type == "Replace") {
    std::string pattern, content;
    TRAINERD_RETURN_IF_ERROR(ReadStringPattern(config, where, &pattern));
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "content", where, true, &content));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    std::string content;
    TRAINERD_RETURN_IF_ERROR(ReadChar(config, "content", where, &content));
    int64_t start = 0, stop = 0;
    TRAINERD_RETURN_IF_ERROR(ReadInt(config, "start", where, true, &start));
    TRAINERD_RETURN_IF_ERROR(ReadInt(config, "stop", where, true, &stop));
    if (start < 0 || stop < 0) return Status::Error(where + ": start and stop must be non-negative");
    return std::unique_ptr<Decoder>(
        new StripDecoder(FirstCodePoint(content), static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  return UnsupportedType("decoder", type);
}

}  // namespace trainerd::engine::tokenizer
