#include "common/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <system_error>
#include <utility>

namespace trainerd {
namespace {

namespace fs = std::filesystem;

std::string Join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

// Optimal string alignment distance: edits, with a swap of neighbours counting once.
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

// How many edits still count as a typo of a word of this length.
size_t TypoBudget(size_t length) { return length <= 3 ? 1 : length <= 6 ? 2 : 3; }

std::string LastPart(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

// The candidate closest to `word` within the typo budget, or "".
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

// "source:line: ", or "source: " where yaml-cpp has no position.
std::string Where(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return source + ": ";
  return source + ":" + std::to_string(mark.line + 1) + ": ";
}

// How a node looks, for "got ..." in messages.
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

// One value of the spec: its node, dotted key and position, and typed readers
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
  // The scalar's text as written, so range errors quote the spec.
  const std::string& text() const { return node_.Scalar(); }

  Status Error(const std::string& what) const {
    return Status::Error(Where(source_, mark_) + key_ + ": " + what);
  }
  Status Expected(const std::string& what, const std::string& hint = "") const {
    return Error("expected " + what + ", got " + Describe(node_) + hint);
  }

  StatusOr<std::string> String() const {
    if (!node_.IsScalar()) return Expected("a string");
    if (node_.Scalar().empty()) return Error("must not be empty");
    return node_.Scalar();
  }

  StatusOr<int64_t> Int() const {
    if (!node_.IsScalar() || !IsIntegerText(node_.Scalar())) return Expected("an integer");
    const std::string& s = node_.Scalar();
    int64_t value = 0;
    const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
    const auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size()) return Error(s + " is out of range");
    return value;
  }

  StatusOr<uint64_t> Uint() const {
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

  StatusOr<double> Number() const {
    if (!node_.IsScalar()) return Expected("a number");
    const std::optional<double> value = ParseFiniteNumber(node_.Scalar());
    if (!value) return Expected("a number");
    return *value;
  }

  StatusOr<bool> Bool() const {
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

  StatusOr<std::string> OneOf(const std::vector<std::string>& allowed) const {
    TRAINERD_ASSIGN_OR_RETURN(std::string value, String());
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return value;
    std::string message = "unknown value '" + value + "'; allowed: " + Join(allowed, ", ");
    const std::string close = Closest(value, allowed);
    if (!close.empty()) message += " (did you mean '" + close + "'?)";
    return Error(message);
  }

 private:
  YAML::Node node_;
  std::string key_;
  std::string source_;
  YAML::Mark mark_;
};

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

enum class Range {
  kPositive,     // > 0
  kNonNegative,  // >= 0
  kFraction,     // [0, 1)
};

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

Status SetDataFormat(const Value& v, std::string* out) {
  return SetString(v, {"auto", "tokens", "text", "completion", "chat"}, out);
}

Status SetChatTemplate(const Value& v, std::string* out) {
  std::vector<std::string> allowed = {"auto"};
  for (const std::string& name : BuiltinChatTemplateNames()) allowed.push_back(name);
  return SetString(v, allowed, out);
}

Status SetDevice(const Value& v, std::string* out) {
  TRAINERD_ASSIGN_OR_RETURN(std::string device, v.String());
  if (device == "auto" || device == "cpu" || device == "cuda") {
    *out = device;
    return Status::Ok();
  }
  const std::string prefix = "cuda:";
  if (device.compare(0, prefix.size(), prefix) == 0) {
    const std::string index = device.substr(prefix.size());
    int value = 0;
    const bool digits = !index.empty() && std::all_of(index.begin(), index.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    if (digits &&
        std::from_chars(index.data(), index.data() + index.size(), value).ec == std::errc()) {
      *out = device;
      return Status::Ok();
    }
  }
  return v.Error("unknown value '" + device +
                 "'; allowed: auto, cpu, cuda, cuda:N (N = GPU index, e.g. cuda:0)");
}

Status SetTargetModules(const Value& v, std::vector<std::string>* out) {
  const std::vector<std::string>& all = AllLinearModules();
  const std::string allowed = "allowed: " + Join(all, ", ") + ", or the string 'all-linear'";
  const YAML::Node& node = v.node();
  const std::string expected = "a list of module names or 'all-linear'";
  if (node.IsScalar()) {
    if (node.Scalar() == "all-linear") {
      *out = all;
      return Status::Ok();
    }
    const bool one_module = std::find(all.begin(), all.end(), node.Scalar()) != all.end();
    return v.Expected(expected,
                      one_module ? " (write a list: [" + node.Scalar() + "])" : "; " + allowed);
  }
  if (!node.IsSequence()) return v.Expected(expected);
  if (node.size() == 0) return v.Error("must name at least one module; " + allowed);
  std::vector<std::string> modules;
  for (const YAML::Node& item : node) {
    // Each entry reports at its own line: lists often span several.
    const Value entry(item, v.key(), v.source(), item.Mark());
    if (!item.IsScalar()) return entry.Expected("a module name");
    const std::string& name = item.Scalar();
    if (name == "all-linear") {
      return entry.Error("'all-linear' replaces the list: write 'target_modules: all-linear'");
    }
    if (std::find(all.begin(), all.end(), name) == all.end()) {
      std::string message = "unknown module '" + name + "'; " + allowed;
      const std::string close = Closest(name, all);
      if (!close.empty()) message += " (did you mean '" + close + "'?)";
      return entry.Error(message);
    }
    if (std::find(modules.begin(), modules.end(), name) != modules.end()) {
      return entry.Error("'" + name + "' is listed twice");
    }
    modules.push_back(name);
  }
  *out = std::move(modules);
  return Status::Ok();
}

// A leaf key of the spec and how to read it into a JobSpec. Keys under
// `adapter.` run only after the `adapter:` section has created spec->adapter.
struct Field {
  const char* key;  // dotted: "training.learning_rate"
  Status (*read)(const Value& v, JobSpec* spec);
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> kFields = {
      {"task",
       [](const Value& v, JobSpec* s) {
         return SetString(v, {"finetune", "eval"}, &s->task);
       }},
      {"model.path",
       [](const Value& v, JobSpec* s) { return SetPath(v, s->base_dir, &s->model.path); }},
      {"model.dtype",
       [](const Value& v, JobSpec* s) {
         return SetString(v, {"auto", "float32", "bfloat16", "float16"}, &s->model.dtype);
       }},
      {"adapter.type",
       [](const Value& v, JobSpec* s) { return SetString(v, {"lora"}, &s->adapter->type); }},
      {"adapter.r",
       [](const Value& v, JobSpec* s) {
         s->adapter->r_set = true;
         return SetInt(v, 1, &s->adapter->r);
       }},
      {"adapter.alpha",
       [](const Value& v, JobSpec* s) {
         s->adapter->alpha_set = true;
         return SetNumber(v, Range::kPositive, &s->adapter->alpha);
       }},
      {"adapter.dropout",
       [](const Value& v, JobSpec* s) {
         s->adapter->dropout_set = true;
         return SetNumber(v, Range::kFraction, &s->adapter->dropout);
       }},
      {"adapter.target_modules",
       [](const Value& v, JobSpec* s) {
         s->adapter->target_modules_set = true;
         return SetTargetModules(v, &s->adapter->target_modules);
       }},
      {"adapter.use_rslora",
       [](const Value& v, JobSpec* s) {
         s->adapter->use_rslora_set = true;
         return SetBool(v, &s->adapter->use_rslora);
       }},
      {"adapter.init",
       [](const Value& v, JobSpec* s) { return SetPath(v, s->base_dir, &s->adapter->init); }},
      {"data.train",
       [](const Value& v, JobSpec* s) { return SetPath(v, s->base_dir, &s->data.train); }},
      {"data.eval",
       [](const Value& v, JobSpec* s) { return SetPath(v, s->base_dir, &s->data.eval); }},
      {"data.format", [](const Value& v, JobSpec* s) { return SetDataFormat(v, &s->data.format); }},
      {"data.max_seq_len",
       [](const Value& v, JobSpec* s) { return SetInt(v, 2, &s->data.max_seq_len); }},
      {"data.shuffle", [](const Value& v, JobSpec* s) { return SetBool(v, &s->data.shuffle); }},
      {"data.packing", [](const Value& v, JobSpec* s) { return SetBool(v, &s->data.packing); }},
      {"data.train_on_prompt",
       [](const Value& v, JobSpec* s) { return SetBool(v, &s->data.train_on_prompt); }},
      {"data.chat_template", [](const Value& v, JobSpec* s) { return SetChatTemplate(v, &s->data.chat_template); }},
      {"data.cache", [](const Value& v, JobSpec* s) { return SetBool(v, &s->data.cache); }},
      {"data.cache_dir", [](const Value& v, JobSpec* s) { return SetPath(v, s->base_dir, &s->data.cache_dir); }},
      {"training.epochs",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kPositive, &s->training.epochs);
       }},
      {"training.max_steps",
       [](const Value& v, JobSpec* s) { return SetInt(v, 0, &s->training.max_steps); }},
      {"training.micro_batch_size",
       [](const Value& v, JobSpec* s) { return SetInt(v, 1, &s->training.micro_batch_size); }},
      {"training.gradient_accumulation_steps",
       [](const Value& v, JobSpec* s) {
         return SetInt(v, 1, &s->training.gradient_accumulation_steps);
       }},
      {"training.learning_rate",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kPositive, &s->training.learning_rate);
       }},
      {"training.lr_scheduler",
       [](const Value& v, JobSpec* s) {
         return SetString(v, {"constant", "linear", "cosine"}, &s->training.lr_scheduler);
       }},
      {"training.warmup_steps",
       [](const Value& v, JobSpec* s) { return SetInt(v, 0, &s->training.warmup_steps); }},
      {"training.weight_decay",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kNonNegative, &s->training.weight_decay);
       }},
      {"training.adam_beta1",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kFraction, &s->training.adam_beta1);
       }},
      {"training.adam_beta2",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kFraction, &s->training.adam_beta2);
       }},
      {"training.adam_epsilon",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kPositive, &s->training.adam_epsilon);
       }},
      {"training.max_grad_norm",
       [](const Value& v, JobSpec* s) {
         return SetNumber(v, Range::kNonNegative, &s->training.max_grad_norm);
       }},
      {"training.seed",
       [](const Value& v, JobSpec* s) {
         TRAINERD_ASSIGN_OR_RETURN(s->training.seed, v.Uint());
         return Status::Ok();
       }},
      {"training.eval_every",
       [](const Value& v, JobSpec* s) { return SetInt(v, 0, &s->training.eval_every); }},
      {"training.checkpoint_every",
       [](const Value& v, JobSpec* s) { return SetInt(v, 0, &s->training.checkpoint_every); }},
      {"training.checkpoint_keep",
       [](const Value& v, JobSpec* s) { return SetInt(v, 1, &s->training.checkpoint_keep); }},
      {"training.log_every",
       [](const Value& v, JobSpec* s) { return SetInt(v, 1, &s->training.log_every); }},
      {"output.dir",
       [](const Value& v, JobSpec* s) { return SetPath(v, s->base_dir, &s->output.dir); }},
      {"output.merge", [](const Value& v, JobSpec* s) { return SetBool(v, &s->output.merge); }},
      {"device", [](const Value& v, JobSpec* s) { return SetDevice(v, &s->device); }},
  };
  return kFields;
}

const std::vector<std::string> kSections = {"model", "adapter", "data", "training", "output"};

const Field* FindField(const std::string& key) {
  for (const Field& field : Fields()) {
    if (key == field.key) return &field;
  }
  return nullptr;
}

// The names a map takes: under "" the top-level keys and sections, under a
// section its keys.
std::vector<std::string> KeysUnder(const std::string& prefix) {
  std::vector<std::string> names;
  for (const Field& field : Fields()) {
    const std::string key = field.key;
    if (prefix.empty()) {
      const std::string first = key.substr(0, key.find('.'));
      if (std::find(names.begin(), names.end(), first) == names.end()) names.push_back(first);
    } else if (key.compare(0, prefix.size() + 1, prefix + ".") == 0) {
      names.push_back(key.substr(prefix.size() + 1));
    }
  }
  return names;
}

// Names other trainers use (Hugging Face TrainingArguments, PEFT's LoraConfig),
// matched on the last part of the key wherever it is written.
const std::map<std::string, std::string>& ForeignNames() {
  static const std::map<std::string, std::string> kNames = {
      {"lr", "training.learning_rate"},
      {"batch_size", "training.micro_batch_size"},
      {"per_device_train_batch_size", "training.micro_batch_size"},
      {"num_train_epochs", "training.epochs"},
      {"gradient_accumulation", "training.gradient_accumulation_steps"},
      {"grad_accum", "training.gradient_accumulation_steps"},
      {"scheduler", "training.lr_scheduler"},
      {"lr_scheduler_type", "training.lr_scheduler"},
      {"logging_steps", "training.log_every"},
      {"eval_steps", "training.eval_every"},
      {"save_steps", "training.checkpoint_every"},
      {"save_total_limit", "training.checkpoint_keep"},
      {"lora_r", "adapter.r"},
      {"rank", "adapter.r"},
      {"lora_alpha", "adapter.alpha"},
      {"lora_dropout", "adapter.dropout"},
      {"output_dir", "output.dir"},
      {"model_name_or_path", "model.path"},
      {"max_length", "data.max_seq_len"},
      {"torch_dtype", "model.dtype"},
  };
  return kNames;
}

// The known key an unknown one most likely meant, or "": a typo of the dotted
// key, a known key written in the wrong section, or another trainer's name for it.
std::string SuggestKey(const std::string& unknown) {
  const std::string last = LastPart(unknown);
  const auto foreign = ForeignNames().find(last);
  if (foreign != ForeignNames().end()) return foreign->second;
  std::string best;
  size_t best_distance = TypoBudget(last.size()) + 1;
  std::vector<std::string> known(kSections);
  for (const Field& field : Fields()) known.push_back(field.key);
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

class SpecParser {
 public:
  SpecParser(std::string source, std::string base_dir) {
    spec_.source = std::move(source);
    spec_.base_dir = std::move(base_dir);
  }

  StatusOr<JobSpec> Parse(const std::string& text) {
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAll(text);
    } catch (const YAML::ParserException& e) {
      return Status::Error(Where(spec_.source, e.mark) + "YAML syntax error: " + e.msg);
    } catch (const YAML::Exception& e) {
      return Status::Error(spec_.source + ": cannot read the YAML: " + e.what());
    }
    if (documents.empty() || (documents.size() == 1 && documents[0].IsNull())) {
      return Status::Error(spec_.source +
                           ": the job spec is empty; it needs at least model.path, data.train and "
                           "output.dir (see docs/job-spec.md)");
    }
    if (documents.size() > 1) {
      return Status::Error(Where(spec_.source, documents[1].Mark()) +
                           "a second YAML document ('---'); a job spec file holds one job");
    }
    const YAML::Node& root = documents[0];
    if (!root.IsMap()) {
      return Status::Error(Where(spec_.source, root.Mark()) +
                           "a job spec is a map of keys (task:, model:, data:, ...), got " +
                           Describe(root));
    }
    try {
      TRAINERD_RETURN_IF_ERROR(ReadMap(root, ""));
    } catch (const YAML::Exception& e) {
      return Status::Error(spec_.source + ": cannot read the YAML: " + e.what());
    }
    TRAINERD_RETURN_IF_ERROR(CheckRequired());
    return std::move(spec_);
  }

 private:
  // Reads the entries of `map`, the root (prefix "") or a section ("training").
  Status ReadMap(const YAML::Node& map, const std::string& prefix) {
    // Entries are copied: yaml-cpp's iterator hands out a temporary pair.
    // Duplicate keys stay separate entries, so they can be reported.
    for (const YAML::const_iterator::value_type entry : map) {
      const YAML::Node key_node = entry.first;
      const YAML::Node value = entry.second;
      const std::string where = Where(spec_.source, key_node.Mark());
      if (!key_node.IsScalar() || key_node.Scalar().empty()) {
        return Status::Error(where + "keys are plain names, got " + Describe(key_node));
      }
      const std::string& name = key_node.Scalar();
      const std::string key = prefix.empty() ? name : prefix + "." + name;
      if (name.find('.') != std::string::npos) {
        return Status::Error(where + "key '" + key +
                             "': write keys nested, one level per section, not dotted "
                             "(e.g. 'training:' then an indented 'learning_rate:')");
      }
      const auto [seen, inserted] = lines_.emplace(key, key_node.Mark().line + 1);
      if (!inserted) {
        return Status::Error(where + "duplicate key '" + key + "' (first set on line " +
                             std::to_string(seen->second) + ")");
      }
      if (prefix.empty() &&
          std::find(kSections.begin(), kSections.end(), name) != kSections.end()) {
        TRAINERD_RETURN_IF_ERROR(ReadSection(value, name, key_node.Mark()));
        continue;
      }
      const Field* field = FindField(key);
      if (field == nullptr) {
        std::string message = where + "unknown key '" + key + "'";
        const std::string suggestion = SuggestKey(key);
        if (!suggestion.empty()) {
          message += "; did you mean '" + suggestion + "'?";
        } else {
          message += "; " + (prefix.empty() ? std::string("the top level") : prefix) +
                     " takes: " + Join(KeysUnder(prefix), ", ");
        }
        return Status::Error(message);
      }
      if (value.IsNull()) {
        return Status::Error(where + key + ": has no value; remove the key to use the default");
      }
      TRAINERD_RETURN_IF_ERROR(
          field->read(Value(value, key, spec_.source, key_node.Mark()), &spec_));
    }
    return Status::Ok();
  }

  // An empty section ("adapter:" alone) counts as present with every default:
  // for `adapter`, that is LoRA with default settings.
  Status ReadSection(const YAML::Node& value, const std::string& name, const YAML::Mark& mark) {
    if (!value.IsMap() && !value.IsNull()) {
      std::string message = Where(spec_.source, mark) + name +
                            ": expected a section (a map of indented keys), got " + Describe(value);
      if (name == "model" && value.IsScalar()) {
        message += " (write 'model: {path: " + value.Scalar() + "}')";
      }
      return Status::Error(message);
    }
    if (name == "adapter") spec_.adapter.emplace();
    if (value.IsNull()) return Status::Ok();
    return ReadMap(value, name);
  }

  // A required key is reported at its section's line when the section is there.
  Status Missing(const std::string& key, const std::string& why) const {
    const std::string section = key.substr(0, key.find('.'));
    const auto line = lines_.find(section);
    const std::string where = line == lines_.end()
                                  ? spec_.source + ": "
                                  : spec_.source + ":" + std::to_string(line->second) + ": ";
    return Status::Error(where + "missing required key '" + key + "' (" + why + ")");
  }

  Status CheckRequired() const {
    if (spec_.model.path.empty()) {
      return Missing("model.path", "the folder of the Hugging Face model to start from");
    }
    if (spec_.task == "finetune" && spec_.data.train.empty()) {
      return Missing("data.train", "task finetune needs training data");
    }
    if (spec_.task == "eval" && spec_.data.eval.empty()) {
      return Missing("data.eval", "task eval needs evaluation data");
    }
    if (spec_.output.dir.empty()) {
      return Missing("output.dir", "the folder the job writes its results to");
    }
    if (spec_.task == "finetune" && spec_.training.eval_every > 0 && spec_.data.eval.empty()) {
      return Conflict("training.eval_every", "asks for evaluations but data.eval is not set; add data.eval or remove "
                      "training.eval_every");
    }
    if (spec_.data.train_on_prompt && spec_.data.format == "tokens") {
      return Conflict("data.train_on_prompt", "has no effect on data.format tokens, whose labels say what is "
                      "trained; remove it, or set data.format to completion, chat or auto");
    }
    if (spec_.data.chat_template != "auto" && spec_.data.format != "chat" && spec_.data.format != "auto") {
      return Conflict("data.chat_template", "only applies to chat data; set data.format to chat or auto, or "
                      "remove data.chat_template");
    }
    if (spec_.output.merge && !spec_.adapter) {
      return Conflict("output.merge", "merges an adapter into the model, but the job has no adapter (full "
                      "fine-tuning writes output.dir/model already); remove output.merge");
    }
    return Status::Ok();
  }

  // Two keys that cannot go together, reported at the first one's line.
  Status Conflict(const std::string& key, const std::string& why) const {
    const auto line = lines_.find(key);
    const std::string where =
        line == lines_.end() ? spec_.source + ": " : spec_.source + ":" + std::to_string(line->second) + ": ";
    return Status::Error(where + key + ": " + why);
  }

  JobSpec spec_;
  std::map<std::string, int> lines_;  // dotted key -> 1-based line it was set on
};

}  // namespace

std::string DefaultDataCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg && xdg[0] == '/') {
    return (fs::path(xdg) / "trainerd" / "datasets").string();
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return (fs::path(home) / ".cache" / "trainerd" / "datasets").string();
  }
  return "";
}

StatusOr<JobSpec> ParseJobSpecText(const std::string& text, const std::string& source,
                                   const std::string& base_dir) {
  return SpecParser(source, base_dir).Parse(text);
}

StatusOr<JobSpec> ParseJobSpecFile(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return Status::Error(path + ": is a folder; give the path of a job spec (.yaml) file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::Error("cannot open job spec " + path + ": " + std::strerror(errno));
  }
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) {
    return Status::Error("cannot read job spec " + path + ": " + std::strerror(errno));
  }
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) {
    return Status::Error("cannot resolve the folder of job spec " + path + ": " + ec.message());
  }
  return ParseJobSpecText(text, path, absolute.parent_path().lexically_normal().string());
}

}  // namespace trainerd
