#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/component_json.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {

using nlohmann::json;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "tokenizer.json").string();
    if (!std::filesystem::exists(file, ec))
      return Status::Error(path + ": the folder has no tokenizer.json (only tokenizer.json tokenizers are supported)");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::Error(file + ": cannot open for reading");
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) return Status::Error(file + ": read failed");
  return FromJsonText(content.str(), file);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonText(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return Status::Error(source + ": not valid JSON: " + e.what());
  }
  auto fail = [&source](const Status& status) { return status.WithContext(source); };
  if (!root.is_object()) return Status::Error(source + ": the top level must be a JSON object");
  if (auto it = root.find("version"); it != root.end() && !(it->is_string() && it->get<std::string>() == "1.0"))
    return Status::Error(source + ": tokenizer.json version " + it->dump() + " is not supported (want \"1.0\")");
  for (const char* key : {"truncation", "padding"}) {
    auto it = root.find(key);
    if (it != root.end() && !it->is_null())
      return Status::Error(source + ": \"" + key + "\" is set; it is not supported (set it to null)");
  }
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  const json kNull;
  auto section = [&](const char* key) -> const json& {
    auto it = root.find(key);
    return it == root.end() ? kNull : *it;
  };
  auto normalizer = ParseNormalizer(section("normalizer"));
  if (!normalizer.ok()) return fail(normalizer.status());
  tokenizer->normalizer_ = std::move(normalizer).value();
  auto pre_tokenizer = ParsePreTokenizer(section("pre_tokenizer"));
  if (!pre_tokenizer.ok()) return fail(pre_tokenizer.status());
  tokenizer->pre_tokenizer_ = std::move(pre_tokenizer).value();

  const json& model_config = section("model");
  if (!model_config.is_object()) return Status::Error(source + ": \"model\" must be an object");
  std::string model_type = "BPE";
  if (model_config.contains("type")) {
    Status status = ReadType(model_config, "model", &model_type);
    if (!status.ok()) return fail(status);
  }
  if (model_type != "BPE") return fail(UnsupportedType("model", model_type));
  auto model = BpeModel::FromJson(model_config);
  if (!model.ok()) return fail(model.status());
  tokenizer->model_ = std::move(model).value();

  auto post_processor = ParsePostProcessor(section("post_processor"));
  if (!post_processor.ok()) return fail(post_processor.status());
  tokenizer->post_processor_ = std::move(post_processor).value();
  auto decoder = ParseDecoder(section("decoder"));
  if (!decoder.ok()) return fail(decoder.status());
  tokenizer->decoder_ = std::move(decoder).value();

  auto added = AddedVocabulary::FromJson(section("added_tokens"), *tokenizer->model_, tokenizer->normalizer_.get());
  if (!added.ok()) return fail(added.status());
  tokenizer->added_ = std::move(added).value();
  return tokenizer;
}

Status Tokenizer::EncodePiece(std::string text, bool at_text_start, std::vector<int32_t>* ids) const {
  std::vector<PreToken> words;
  words.push_back({std::move(text), at_text_start});
  if (pre_tokenizer_) TRAINERD_RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&words));
  for (const PreToken& word : words) TRAINERD_RETURN_IF_ERROR(model_->Tokenize(word.text, ids));
  return Status::Ok();
}

Status Tokenizer::EncodeRun(std::string_view run, bool at_text_start, std::vector<int32_t>* ids) const {
  std::string piece(run);
  if (normalizer_) TRAINERD_RETURN_IF_ERROR(normalizer_->Normalize(&piece));
  std::vector<TextSegment> segments;
  added_.Segment(piece, /*normalized_tokens=*/true, &segments);
  for (const TextSegment& segment : segments) {
    if (segment.start == segment.end) continue;
    if (segment.id >= 0) {
      ids->push_back(segment.id);
      continue;
    }
    TRAINERD_RETURN_IF_ERROR(EncodePiece(piece.substr(segment.start, segment.end - segment.start),
                                         at_text_start && segment.start == 0, ids));
  }
  return Status::Ok();
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<size_t> no_cuts;
  TRAINERD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeWithCuts(text, {}, &no_cuts));
  if (post_processor_) post_processor_->Process(&ids, add_special_tokens);
  return ids;
}

StatusOr<size_t> Tokenizer::TokenAt(std::string_view text, size_t run_start, size_t run_end, size_t cut,
                                    const std::vector<int32_t>& ids, size_t first_id) const {
  const size_t run_ids = ids.size() - first_id;
  std::vector<int32_t> prefix;
  // Whether text[run_start, end) encodes to a prefix of the run's ids (then
  // `end` is a token boundary of the run); its id count goes to *count.
  auto clean = [&](size_t end, size_t* count) -> StatusOr<bool> {
    prefix.clear();
    TRAINERD_RETURN_IF_ERROR(EncodeRun(text.substr(run_start, end - run_start), run_start == 0, &prefix));
    *count = prefix.size();
    return prefix.size() <= run_ids && std::equal(prefix.begin(), prefix.end(), ids.begin() + first_id);
  };
  size_t count = 0;
  TRAINERD_ASSIGN_OR_RETURN(bool at_boundary, clean(cut, &count));
  if (at_boundary) return count;
  // The first id where the run and the cut run differ: no token before it
  // reaches the cut. A lower bound, exact when that token holds the cut.
  size_t same = 0;
  while (same < run_ids && same < prefix.size() && ids[first_id + same] == prefix[same]) ++same;
  // The nearest token boundaries below and above the cut: when exactly one
  // token lies between them, it holds the cut. (BPE can merge across the cut
  // differently in the cut run, e.g. "]▁" at its end where the run has "]",
  // "▁t": then the first differing id, "]", ends before the cut.)
  constexpr int kMaxSteps = 32;
  auto boundary = [&](int direction, size_t* found) -> StatusOr<bool> {
    size_t pos = cut;
    for (int step = 0; step < kMaxSteps; ++step) {
      do {
        pos += direction;
      } while (pos > run_start && pos < run_end && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
      if (pos <= run_start) return *found = 0, true;
      if (pos >= run_end) return *found = run_ids, true;
      TRAINERD_ASSIGN_OR_RETURN(bool ok, clean(pos, found));
      if (ok) return true;
    }
    return false;
  };
  size_t below = 0, above = 0;
  TRAINERD_ASSIGN_OR_RETURN(bool has_below, boundary(-1, &below));
  TRAINERD_ASSIGN_OR_RETURN(bool has_above, boundary(+1, &above));
  if (has_below && has_above && above == below + 1) return below;
  return same;
}

StatusOr<std::vector<int32_t>> Tokenizer::EncodeWithCuts(std::string_view text, const std::vector<size_t>& cuts,
                                                         std::vector<size_t>* cut_tokens) const {
  if (size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos)
    return Status::Error("text is not valid UTF-8 at byte offset " + std::to_string(bad));
  std::vector<int32_t> ids;
  std::vector<TextSegment> raw_segments;
  added_.Segment(text, /*normalized_tokens=*/false, &raw_segments);
  cut_tokens->assign(cuts.size(), 0);
  size_t next_cut = 0;
  for (const TextSegment& raw : raw_segments) {
    if (raw.start == raw.end) continue;
    const size_t first_id = ids.size();
    if (raw.id >= 0) {
      ids.push_back(raw.id);
    } else {
      TRAINERD_RETURN_IF_ERROR(EncodeRun(text.substr(raw.start, raw.end - raw.start), raw.start == 0, &ids));
    }
    for (; next_cut < cuts.size() && cuts[next_cut] < raw.end; ++next_cut) {
      size_t index = first_id;
      if (cuts[next_cut] > raw.start && raw.id < 0) {
        TRAINERD_ASSIGN_OR_RETURN(size_t in_run, TokenAt(text, raw.start, raw.end, cuts[next_cut], ids, first_id));
        index = first_id + in_run;
      }
      (*cut_tokens)[next_cut] = index;
    }
  }
  for (; next_cut < cuts.size(); ++next_cut) (*cut_tokens)[next_cut] = ids.size();
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* added = added_.Find(id)) {
      if (skip_special_tokens && added->special) continue;
      tokens.push_back(*added_.DecodedForm(id));
    } else if (const std::string* token = model_->IdToToken(id)) {
      // HF's is_special_token looks the token's text up among the added tokens.
      if (skip_special_tokens) {
        if (auto added_id = added_.TokenToId(*token); added_id && added_.Find(*added_id)->special) continue;
      }
      tokens.push_back(*token);
    }
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  decoder_->DecodeChain(&tokens);
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_.TokenToId(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* added = added_.Find(id)) return added->content;
  if (const std::string* token = model_->IdToToken(id)) return *token;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return std::max(model_->id_end(), added_.id_end()); }

}  // namespace trainerd::engine::tokenizer
