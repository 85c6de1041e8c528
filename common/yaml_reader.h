// Reading hand-written YAML files (job specs, the daemon's config) into structs,
// with errors a user can act on: each names the source, the line and the dotted
// key ("job.yaml:7: training.learning_rate: expected a number, got 'fast'"), and
// an unknown key comes with the known key it most likely meant.
//
// Internal to trainerd_common: this header includes yaml-cpp, which that library
// links PRIVATE. Other targets include the parsers' yaml-free headers
// (common/job_spec.h, common/daemon_config.h), never this one.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace trainerd::yaml {

std::string Join(const std::vector<std::string>& items, const char* separator);

// Optimal string alignment distance: edits, with a swap of neighbours counting once.
size_t EditDistance(const std::string& a, const std::string& b);

// How many edits still count as a typo of a word of this length.
size_t TypoBudget(size_t length);

// The part after the last '.' of a dotted key.
std::string LastPart(const std::string& dotted);

// The candidate closest to `word` within the typo budget, or "".
std::string Closest(const std::string& word, const std::vector<std::string>& candidates);

// "source:line: ", or "source: " where yaml-cpp has no position.
std::string Where(const std::string& source, const YAML::Mark& mark);
// The same for a 1-based line (MapReader::LineOf's), 0 for none.
std::string Where(const std::string& source, int line);

// How a node looks, for "got ..." in messages: 'text' (cut at 60 characters),
// "a list", "a map" or "nothing".
std::string Describe(const YAML::Node& node);

// The documents in `text`. A syntax error reads "source:line: YAML syntax error: ...".
StatusOr<std::vector<YAML::Node>> LoadDocuments(const std::string& text, const std::string& source);

// One value of a document: its node, dotted key and position, and typed readers
// whose errors read "source:line: key: what".
class Value {
 public:
  // `mark` is where errors point: the key's position for a key's value (yaml-cpp
  // places an empty value on the next line), the entry's own for list entries.
  Value(YAML::Node node, std::string key, std::string source, const YAML::Mark& mark)
      : node_(std::move(node)), key_(std::move(key)), source_(std::move(source)), mark_(mark) {}

  const YAML::Node& node() const { return node_; }
  const std::string& key() const { return key_; }
  const std::string& source() const { return source_; }
  const YAML::Mark& mark() const { return mark_; }
  // The scalar's text as written, so range errors quote the file. Scalars only.
  const std::string& text() const { return node_.Scalar(); }

  Status Error(const std::string& what) const;
  // "expected <what>, got <Describe(node)><hint>".
  Status Expected(const std::string& what, const std::string& hint = "") const;

  StatusOr<std::string> String() const;  // a non-empty scalar
  StatusOr<int64_t> Int() const;         // decimal digits with an optional sign
  StatusOr<uint64_t> Uint() const;
  StatusOr<double> Number() const;  // decimal or exponent notation; no .inf/.nan/hex
  StatusOr<bool> Bool() const;      // YAML 1.1's true/false/yes/no/on/off spellings
  // A string that is one of `allowed`, with a "did you mean" for a near miss.
  StatusOr<std::string> OneOf(const std::vector<std::string>& allowed) const;

 private:
  YAML::Node node_;
  std::string key_;
  std::string source_;
  YAML::Mark mark_;
};

// base_dir/text for a relative `text`, lexically normal, without a trailing separator.
std::string ResolvePath(const std::string& base_dir, const std::string& text);

// Readers that store into a field. On error `*out` is left as it was.
Status SetPath(const Value& v, const std::string& base_dir, std::string* out);
Status SetString(const Value& v, const std::vector<std::string>& allowed, std::string* out);
Status SetBool(const Value& v, bool* out);
Status SetInt(const Value& v, int64_t min, int64_t* out);  // value >= min

enum class Range {
  kPositive,     // > 0
  kNonNegative,  // >= 0
  kFraction,     // [0, 1)
};
Status SetNumber(const Value& v, Range range, double* out);

// The keys a kind of document takes, for finding unknown keys and suggesting others.
struct Schema {
  std::vector<std::string> keys;      // dotted leaf keys, in documentation order
  std::vector<std::string> sections;  // top-level maps of keys ("training"); none in a flat file
  // Other programs' names for our keys, matched on the last part of an unknown
  // key wherever it is written: {"lr", "training.learning_rate"}.
  std::map<std::string, std::string> foreign_names;

  bool IsKey(const std::string& dotted) const;
  bool IsSection(const std::string& name) const;
  // The names a map takes: under "" the top-level keys and sections, under a
  // section its keys.
  std::vector<std::string> KeysUnder(const std::string& prefix) const;
  // The known key an unknown one most likely meant, or "": another program's
  // name for it, a typo of the dotted key, or a known key in the wrong section.
  std::string Suggest(const std::string& unknown) const;
};

// Walks the maps of one document, checking every key against a Schema: keys are
// plain names, not dotted; none is given twice; an unknown key is an error with a
// suggestion (or the list of keys the map takes); a key without a value is an error.
// Remembers the line of every key it saw, for later errors about missing or
// conflicting keys.
class MapReader {
 public:
  using Handler = std::function<Status(const Value& value)>;

  // `schema` must outlive the reader.
  MapReader(std::string source, const Schema* schema) : source_(std::move(source)), schema_(schema) {}

  // Reads the entries of `map`: the root (prefix "") or a section ("training").
  // A section at the root goes to on_section with its name as key (its node may
  // be null: "adapter:" alone); a known key goes to on_key with its dotted name
  // and a non-null node. An entry's error does not stop the others: the result
  // holds every error, the handlers' as they are, one a line in the document's
  // order.
  Status Read(const YAML::Node& map, const std::string& prefix, const Handler& on_section,
              const Handler& on_key);

  // The 1-based line a dotted key or section was set on, or 0 when it was not.
  int LineOf(const std::string& key) const;

 private:
  std::string source_;
  const Schema* schema_;
  std::map<std::string, int> lines_;  // dotted key -> 1-based line it was set on
};

}  // namespace trainerd::yaml
