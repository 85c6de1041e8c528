#include "engine/token_dataset.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace trainerd::engine {

int64_t TokenExample::target_tokens() const {
  int64_t n = 0;
  for (size_t i = 1; i < labels.size(); ++i) n += labels[i] != kIgnoreIndex;
  return n;
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

}  // namespace

StatusOr<TokenDataset> LoadTokenDataset(const std::string& path, int64_t vocab_size, int64_t max_seq_len) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open the data file");
  TokenDataset data;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++data.lines;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      return Status::Error(where + ": not valid JSON (" + std::string(e.what()) + ")");
    }
    if (!j.is_object()) return Status::Error(where + ": expected a JSON object with \"input_ids\"");
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
    data.Add(std::move(ex), max_seq_len);
  }
  if (in.bad()) return Status::Error(path + ": read error");
  if (data.lines == 0) return Status::Error(path + ": the data file is empty");
  if (data.examples.empty()) {
    return Status::Error(path + ": all " + std::to_string(data.dropped) +
                         " examples have nothing to train (every label after the first is -100, or the "
                         "example has a single token)");
  }
  return data;
}

}  // namespace trainerd::engine
