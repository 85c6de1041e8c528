#include "engine/token_dataset.h"

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/jsonl.h"

namespace trainerd::engine {

int64_t TokenExample::target_tokens() const {
  int64_t n = 0;
  for (size_t i = 1; i < labels.size(); ++i) n += labels[i] != kIgnoreIndex;
  return n;
}

TokenDataset::TokenCounts TokenDataset::CountTokens() const {
  TokenCounts counts;
  for (const TokenExample& ex : examples) {
    counts.tokens += static_cast<int64_t>(ex.input_ids.size());
    counts.trained += ex.target_tokens();
  }
  return counts;
}

const TokenExample* TokenDataset::Longest() const {
  const TokenExample* longest = nullptr;
  for (const TokenExample& ex : examples) {
    if (!longest || ex.input_ids.size() > longest->input_ids.size()) longest = &ex;
  }
  return longest;
}

void TokenDataset::Add(TokenExample ex, int64_t max_seq_len) {
  if (static_cast<int64_t>(ex.input_ids.size()) > max_seq_len) {
    ex.input_ids.resize(max_seq_len);
    ex.labels.resize(max_seq_len);
    ++truncated;
  }
  if (ex.target_tokens() == 0) {
    ++dropped;
    return;
  }
  examples.push_back(std::move(ex));
}

namespace {

Status ReadIds(const nlohmann::json& value, const std::string& where, const char* field, int64_t vocab_size,
               bool allow_ignore, std::vector<int64_t>& out) {
  if (!value.is_array()) return Status::Error(where + ": \"" + field + "\" must be a list of integers");
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const auto& v = value[i];
    if (!v.is_number_integer()) {
      return Status::Error(where + ": " + field + "[" + std::to_string(i) + "] is not an integer");
    }
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Status::Error(where + ": " + field + "[" + std::to_string(i) + "] = " + v.dump() +
                           " is outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
    const int64_t id = v.get<int64_t>();
    if ((id < 0 || id >= vocab_size) && !(allow_ignore && id == kIgnoreIndex)) {
      return Status::Error(where + ": " + field + "[" + std::to_string(i) + "] = " + std::to_string(id) +
                           " is outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")" +
                           (allow_ignore ? " and is not -100" : "") +
                           "; were these ids made with this model's tokenizer?");
    }
    out.push_back(id);
  }
  return Status::Ok();
}

// One tokens line → one example added to `data`.
Status AddLine(const JsonlLine& line, const std::string& path, int64_t vocab_size, int64_t max_seq_len,
               TokenDataset* data) {
  ++data->lines;
  const std::string where = Where(path, line.number);
  TRAINERD_ASSIGN_OR_RETURN(nlohmann::json j, ParseObjectLine(line.text, where));
  if (!j.contains("input_ids")) {
    return Status::Error(where + ": missing \"input_ids\" (data.format tokens wants {\"input_ids\": [...]})");
  }
  for (const auto& [key, _] : j.items()) {
    if (key != "input_ids" && key != "labels") {
      return Status::Error(where + ": unknown field \"" + key + "\" (tokens lines hold input_ids and labels)");
    }
  }
  TokenExample ex;
  TRAINERD_RETURN_IF_ERROR(ReadIds(j["input_ids"], where, "input_ids", vocab_size, false, ex.input_ids));
  if (ex.input_ids.empty()) return Status::Error(where + ": input_ids is empty");
  if (j.contains("labels")) {
    TRAINERD_RETURN_IF_ERROR(ReadIds(j["labels"], where, "labels", vocab_size, true, ex.labels));
    if (ex.labels.size() != ex.input_ids.size()) {
      return Status::Error(where + ": labels has " + std::to_string(ex.labels.size()) +
                           " entries but input_ids has " + std::to_string(ex.input_ids.size()));
    }
  } else {
    ex.labels = ex.input_ids;
  }
  data->Add(std::move(ex), max_seq_len);
  return Status::Ok();
}

}  // namespace

StatusOr<TokenDataset> LoadTokenDataset(const std::string& path, int64_t vocab_size, int64_t max_seq_len) {
  JsonlReader reader(path);
  TRAINERD_RETURN_IF_ERROR(reader.Open());
  TokenDataset data;
  for (;;) {
    TRAINERD_ASSIGN_OR_RETURN(std::vector<JsonlLine> block, reader.NextBlock(kJsonlBlockBytes));
    if (block.empty()) break;
    for (const JsonlLine& line : block) {
      TRAINERD_RETURN_IF_ERROR(AddLine(line, path, vocab_size, max_seq_len, &data));
    }
  }
  if (data.lines == 0) return Status::Error(path + ": the data file is empty");
  if (data.examples.empty()) {
    return Status::Error(path + ": all " + std::to_string(data.dropped) +
                         " examples have nothing to train (every label after the first is -100, or the "
                         "example has a single token)");
  }
  return data;
}

}  // namespace trainerd::engine
