// JSON Lines data files: reading them in blocks of lines, and the checks every
// data format shares (a line is a UTF-8 JSON object; a field has the right
// type), with errors that name file:line. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace trainerd::engine {

// How much JSON the data loaders read (and tokenize) at a time.
inline constexpr size_t kJsonlBlockBytes = size_t{64} << 20;

struct JsonlLine {
  int64_t number = 0;  // 1-based line number in the file
  std::string text;    // without the newline
};

// Reads the non-blank lines of a file in blocks, so a large file is processed
// a block at a time (in parallel within a block) with bounded memory.
class JsonlReader {
 public:
  explicit JsonlReader(std::string path);
  // Opens the file; an error names it.
  Status Open();
  // The next non-blank lines, about `max_bytes` of them (always at least one
  // line when any is left); empty at the end of the file.
  StatusOr<std::vector<JsonlLine>> NextBlock(size_t max_bytes);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t line_no_ = 0;
};

// "file:line" for errors.
std::string Where(const std::string& path, int64_t line_no);

// "a number", "a list", ... for "got ..." in error messages.
std::string JsonKind(const nlohmann::json& value);

// The keys of an object, comma-separated ("none" when it has none).
std::string KeyList(const nlohmann::json& object);

// A line parsed as a JSON object: invalid UTF-8 (with the byte offset),
// malformed JSON and a non-object are errors naming `where`.
StatusOr<nlohmann::json> ParseObjectLine(const std::string& line, const std::string& where);

// The string field `key` of `object`. Missing: an error naming `where`, the
// `shape` the data format wants and the keys the line has; not a string: an
// error naming what it is. `path` prefixes the key in messages (e.g.
// "messages[2]." for a nested object).
StatusOr<std::string> StringField(const nlohmann::json& object, const std::string& key, const std::string& where,
                                  const std::string& shape, const std::string& path = "");

}  // namespace trainerd::engine
