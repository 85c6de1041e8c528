#include "common/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <set>
#include <system_error>

namespace trainerd::yaml {
namespace {

namespace fs = std::filesystem;

bool IsIntegerText(const std::string& text) {
  size_t i = (!text.empty() && (text[0] == '+' || text[0] == '-')) ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

// Decimal or exponent notation only: YAML's .inf/.nan, hex and the like are not numbers here.
std::optional<double> ParseFiniteNumber(const std::string& text) {
  bool has_digit = false;
  for (char c : text) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      has_digit = true;
    } else if (c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') {
      return std::nullopt;
    }
  }
  if (!has_digit) return std::nullopt;
  // from_chars takes no leading '+'.
  const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') return std::nullopt;
  double value = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, value, std::chars_format::general);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace

std::string Join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

size_t TypoBudget(size_t length) { return length <= 3 ? 1 : length <= 6 ? 2 : 3; }

std::string LastPart(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

std::string Closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = TypoBudget(word.size()) + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string Where(const std::string& source, const YAML::Mark& mark) {
  return Where(source, mark.is_null() || mark.line < 0 ? 0 : mark.line + 1);
}

std::string Where(const std::string& source, int line) {
  return line <= 0 ? source + ": " : source + ":" + std::to_string(line) + ": ";
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: {
      std::string text = node.Scalar();
      if (text.size() > 60) text = text.substr(0, 57) + "...";
      return "'" + text + "'";
    }
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

StatusOr<std::vector<YAML::Node>> LoadDocuments(const std::string& text, const std::string& source) {
  try {
    return YAML::LoadAll(text);
  } catch (const YAML::ParserException& e) {
    return Status::Error(Where(source, e.mark) + "YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    return Status::Error(source + ": cannot read the YAML: " + e.what());
  }
}

Status Value::Error(const std::string& what) const {
  return Status::Error(Where(source_, mark_) + key_ + ": " + what);
}

Status Value::Expected(const std::string& what, const std::string& hint) const {
  return Error("expected " + what + ", got " + Describe(node_) + hint);
}

StatusOr<std::string> Value::String() const {
  if (!node_.IsScalar()) return Expected("a string");
  if (node_.Scalar().empty()) return Error("must not be empty");
  return node_.Scalar();
}

StatusOr<int64_t> Value::Int() const {
  if (!node_.IsScalar() || !IsIntegerText(node_.Scalar())) return Expected("an integer");
  const std::string& s = node_.Scalar();
  int64_t value = 0;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  const auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size()) return Error(s + " is out of range");
  return value;
}

StatusOr<uint64_t> Value::Uint() const {
  if (!node_.IsScalar() || !IsIntegerText(node_.Scalar()) || node_.Scalar()[0] == '-') {
    return Expected("a non-negative integer");
  }
  const std::string& s = node_.Scalar();
  uint64_t value = 0;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  const auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size()) return Error(s + " is out of range");
  return value;
}

StatusOr<double> Value::Number() const {
  if (!node_.IsScalar()) return Expected("a number");
  const std::optional<double> value = ParseFiniteNumber(node_.Scalar());
  if (!value) return Expected("a number");
  return *value;
}

StatusOr<bool> Value::Bool() const {
  static const std::set<std::string> kTrue = {"true", "True", "TRUE", "yes", "Yes",
                                              "YES",  "on",   "On",   "ON"};
  static const std::set<std::string> kFalse = {"false", "False", "FALSE", "no", "No",
                                               "NO",    "off",   "Off",   "OFF"};
  if (node_.IsScalar()) {
    if (kTrue.count(node_.Scalar())) return true;
    if (kFalse.count(node_.Scalar())) return false;
  }
  return Expected("true or false");
}

StatusOr<std::string> Value::OneOf(const std::vector<std::string>& allowed) const {
  TRAINERD_ASSIGN_OR_RETURN(std::string value, String());
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return value;
  std::string message = "unknown value '" + value + "'; allowed: " + Join(allowed, ", ");
  const std::string close = Closest(value, allowed);
  if (!close.empty()) message += " (did you mean '" + close + "'?)";
  return Error(message);
}

std::string ResolvePath(const std::string& base_dir, const std::string& text) {
  fs::path path(text);
  if (path.is_relative()) path = fs::path(base_dir) / path;
  path = path.lexically_normal();
  // "out/" and "out" name the same folder; keep one spelling.
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
  return path.string();
}

Status SetPath(const Value& v, const std::string& base_dir, std::string* out) {
  TRAINERD_ASSIGN_OR_RETURN(std::string text, v.String());
  *out = ResolvePath(base_dir, text);
  return Status::Ok();
}

Status SetString(const Value& v, const std::vector<std::string>& allowed, std::string* out) {
  TRAINERD_ASSIGN_OR_RETURN(*out, v.OneOf(allowed));
  return Status::Ok();
}

Status SetBool(const Value& v, bool* out) {
  TRAINERD_ASSIGN_OR_RETURN(*out, v.Bool());
  return Status::Ok();
}

Status SetInt(const Value& v, int64_t min, int64_t* out) {
  TRAINERD_ASSIGN_OR_RETURN(int64_t value, v.Int());
  if (value < min) return v.Error("must be >= " + std::to_string(min) + ", got " + v.text());
  *out = value;
  return Status::Ok();
}

Status SetNumber(const Value& v, Range range, double* out) {
  TRAINERD_ASSIGN_OR_RETURN(double value, v.Number());
  switch (range) {
    case Range::kPositive:
      if (!(value > 0)) return v.Error("must be > 0, got " + v.text());
      break;
    case Range::kNonNegative:
      if (!(value >= 0)) return v.Error("must be >= 0, got " + v.text());
      break;
    case Range::kFraction:
      if (!(value >= 0 && value < 1)) return v.Error("must be in [0, 1), got " + v.text());
      break;
  }
  *out = value;
  return Status::Ok();
}

bool Schema::IsKey(const std::string& dotted) const {
  return std::find(keys.begin(), keys.end(), dotted) != keys.end();
}

bool Schema::IsSection(const std::string& name) const {
  return std::find(sections.begin(), sections.end(), name) != sections.end();
}

std::vector<std::string> Schema::KeysUnder(const std::string& prefix) const {
  std::vector<std::string> names;
  for (const std::string& key : keys) {
    if (prefix.empty()) {
      const std::string first = key.substr(0, key.find('.'));
      if (std::find(names.begin(), names.end(), first) == names.end()) names.push_back(first);
    } else if (key.compare(0, prefix.size() + 1, prefix + ".") == 0) {
      names.push_back(key.substr(prefix.size() + 1));
    }
  }
  return names;
}

std::string Schema::Suggest(const std::string& unknown) const {
  const std::string last = LastPart(unknown);
  const auto foreign = foreign_names.find(last);
  if (foreign != foreign_names.end()) return foreign->second;
  std::string best;
  size_t best_distance = TypoBudget(last.size()) + 1;
  std::vector<std::string> known(sections);
  known.insert(known.end(), keys.begin(), keys.end());
  for (const std::string& key : known) {
    // Same name in another section costs one edit on top of any typo in the name.
    const size_t distance =
        std::min(EditDistance(unknown, key), EditDistance(last, LastPart(key)) + 1);
    if (distance < best_distance) {
      best = key;
      best_distance = distance;
    }
  }
  return best;
}

Status MapReader::Read(const YAML::Node& map, const std::string& prefix, const Handler& on_section,
                       const Handler& on_key) {
  // Every entry is read, whatever the ones before it did: the errors come back together, one a line, in the
  // document's order, so that one run names all that is wrong with a file.
  std::vector<std::string> errors;
  auto note = [&errors](const Status& s) {
    if (!s.ok()) errors.push_back(s.message());
  };
  // Entries are copied: yaml-cpp's iterator hands out a temporary pair.
  // Duplicate keys stay separate entries, so they can be reported.
  for (const YAML::const_iterator::value_type entry : map) {
    const YAML::Node key_node = entry.first;
    const YAML::Node value = entry.second;
    const std::string where = Where(source_, key_node.Mark());
    if (!key_node.IsScalar() || key_node.Scalar().empty()) {
      errors.push_back(where + "keys are plain names, got " + Describe(key_node));
      continue;
    }
    const std::string& name = key_node.Scalar();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    // In a flat file (no sections) a dotted name is just an unknown key.
    if (!schema_->sections.empty() && name.find('.') != std::string::npos) {
      errors.push_back(where + "key '" + key +
                       "': write keys nested, one level per section, not dotted "
                       "(e.g. 'training:' then an indented 'learning_rate:')");
      continue;
    }
    const auto [seen, inserted] = lines_.emplace(key, key_node.Mark().line + 1);
    if (!inserted) {
      errors.push_back(where + "duplicate key '" + key + "' (first set on line " + std::to_string(seen->second) +
                       ")");
      continue;
    }
    if (prefix.empty() && schema_->IsSection(name)) {
      note(on_section(Value(value, name, source_, key_node.Mark())));
      continue;
    }
    if (!schema_->IsKey(key)) {
      std::string message = where + "unknown key '" + key + "'";
      const std::string suggestion = schema_->Suggest(key);
      if (!suggestion.empty()) {
        message += "; did you mean '" + suggestion + "'?";
      } else {
        message += "; " + (prefix.empty() ? std::string("the top level") : prefix) +
                   " takes: " + Join(schema_->KeysUnder(prefix), ", ");
      }
      errors.push_back(message);
      continue;
    }
    if (value.IsNull()) {
      errors.push_back(where + key + ": has no value; remove the key to use the default");
      continue;
    }
    note(on_key(Value(value, key, source_, key_node.Mark())));
  }
  return Status::Errors(errors);
}

int MapReader::LineOf(const std::string& key) const {
  const auto line = lines_.find(key);
  return line == lines_.end() ? 0 : line->second;
}

}  // namespace trainerd::yaml
