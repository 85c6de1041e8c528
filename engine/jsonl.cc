#include "engine/jsonl.h"

#include <utility>

#include "engine/tokenizer/utf8.h"

namespace trainerd::engine {

using nlohmann::json;

JsonlReader::JsonlReader(std::string path) : path_(std::move(path)) {}

Status JsonlReader::Open() {
  in_.open(path_, std::ios::binary);
  if (!in_) return Status::Error(path_ + ": cannot open the data file");
  return Status::Ok();
}

StatusOr<std::vector<JsonlLine>> JsonlReader::NextBlock(size_t max_bytes) {
  std::vector<JsonlLine> block;
  size_t bytes = 0;
  std::string line;
  while (bytes < max_bytes && std::getline(in_, line)) {
    ++line_no_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    bytes += line.size();
    block.push_back({line_no_, std::move(line)});
    line.clear();
  }
  if (in_.bad()) return Status::Error(path_ + ": read error after line " + std::to_string(line_no_));
  return block;
}

std::string Where(const std::string& path, int64_t line_no) { return path + ":" + std::to_string(line_no); }

std::string JsonKind(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    case json::value_t::string:
      return "a string";
    default:
      return "something else";
  }
}

std::string KeyList(const json& j) {
  std::string out;
  for (const auto& [key, _] : j.items()) out += (out.empty() ? "" : ", ") + key;
  return out.empty() ? "none" : out;
}

StatusOr<json> ParseObjectLine(const std::string& line, const std::string& where) {
  if (size_t bad = tokenizer::FindInvalidUtf8(line); bad != std::string::npos) {
    return Status::Error(where + ": not valid UTF-8 at byte offset " + std::to_string(bad) +
                         " of the line (data files must be UTF-8)");
  }
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    return Status::Error(where + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) return Status::Error(where + ": expected a JSON object, got " + JsonKind(j));
  return j;
}

StatusOr<std::string> StringField(const json& j, const std::string& key, const std::string& where,
                                  const std::string& shape, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end()) {
    return Status::Error(where + ": missing \"" + path + key + "\" (wanted: " + shape + "; found: " + KeyList(j) +
                         ")");
  }
  if (!it->is_string()) {
    return Status::Error(where + ": \"" + path + key + "\" must be a string, got " + JsonKind(*it));
  }
  return it->get<std::string>();
}

}  // namespace trainerd::engine
