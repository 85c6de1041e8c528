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
#include <system_error>
#include <utility>

#include "common/yaml_reader.h"

namespace trainerd {
namespace {

namespace fs = std::filesystem;

using yaml::Closest;
using yaml::Join;
using yaml::Range;
using yaml::SetBool;
using yaml::SetInt;
using yaml::SetNumber;
using yaml::SetPath;
using yaml::SetString;
using yaml::Value;
using yaml::Where;

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
       [](const Value& v, JobSpec* s) {
         s->training.micro_batch_size_auto = v.node().IsScalar() && v.text() == "auto";
         if (s->training.micro_batch_size_auto) return Status::Ok();
         if (!v.node().IsScalar() || v.Int().ok() == false) return v.Expected("an integer >= 1 or auto");
         return SetInt(v, 1, &s->training.micro_batch_size);
       }},
      {"training.gradient_checkpointing",
       [](const Value& v, JobSpec* s) { return SetBool(v, &s->training.gradient_checkpointing); }},
      {"training.gradient_checkpointing_layers",
       [](const Value& v, JobSpec* s) { return SetInt(v, 1, &s->training.gradient_checkpointing_layers); }},
      {"training.cuda_graphs", [](const Value& v, JobSpec* s) { return SetBool(v, &s->training.cuda_graphs); }},
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

// Names other trainers use (Hugging Face TrainingArguments, PEFT's LoraConfig),
// matched on the last part of the key wherever it is written.
const std::map<std::string, std::string>& ForeignNames() {
  static const std::map<std::string, std::string> kNames = {
      {"lr", "training.learning_rate"},
      {"batch_size", "training.micro_batch_size"},
      {"per_device_train_batch_size", "training.micro_batch_size"},
      {"auto_find_batch_size", "training.micro_batch_size"},
      {"activation_checkpointing", "training.gradient_checkpointing"},
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

// The keys a job spec takes, in the order of Fields().
const yaml::Schema& SpecSchema() {
  static const yaml::Schema kSchema = [] {
    yaml::Schema schema;
    for (const Field& field : Fields()) schema.keys.push_back(field.key);
    schema.sections = kSections;
    schema.foreign_names = ForeignNames();
    return schema;
  }();
  return kSchema;
}

const Field* FindField(const std::string& key) {
  for (const Field& field : Fields()) {
    if (key == field.key) return &field;
  }
  return nullptr;
}

class SpecParser {
 public:
  SpecParser(std::string source, std::string base_dir, const JobSpecDefaults& defaults)
      : reader_(source, &SpecSchema()), defaults_(defaults) {
    spec_.source = std::move(source);
    spec_.base_dir = std::move(base_dir);
    spec_.training.checkpoint_every = defaults.checkpoint_every;
  }

  StatusOr<JobSpec> Parse(const std::string& text) {
    TRAINERD_ASSIGN_OR_RETURN(const std::vector<YAML::Node> documents,
                              yaml::LoadDocuments(text, spec_.source));
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
                           yaml::Describe(root));
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
    return reader_.Read(
        map, prefix, [this](const Value& section) { return ReadSection(section); },
        [this](const Value& v) { return FindField(v.key())->read(v, &spec_); });
  }

  // An empty section ("adapter:" alone) counts as present with every default:
  // for `adapter`, that is LoRA with default settings.
  Status ReadSection(const Value& section) {
    const YAML::Node& value = section.node();
    const std::string& name = section.key();
    if (!value.IsMap() && !value.IsNull()) {
      std::string message = Where(spec_.source, section.mark()) + name +
                            ": expected a section (a map of indented keys), got " +
                            yaml::Describe(value);
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
  std::string Missing(const std::string& key, const std::string& why) const {
    return Where(spec_.source, reader_.LineOf(key.substr(0, key.find('.')))) + "missing required key '" + key +
           "' (" + why + ")";
  }

  // Every missing key and conflict, one a line (run once the keys read without error: a key whose value was
  // refused would otherwise count as missing too).
  Status CheckRequired() const {
    std::vector<std::string> errors;
    if (spec_.model.path.empty()) {
      errors.push_back(Missing("model.path", "the folder of the Hugging Face model to start from"));
    }
    if (spec_.task == "finetune" && spec_.data.train.empty()) {
      errors.push_back(Missing("data.train", "task finetune needs training data"));
    }
    if (spec_.task == "eval" && spec_.data.eval.empty()) {
      errors.push_back(Missing("data.eval", "task eval needs evaluation data"));
    }
    if (spec_.output.dir.empty() && defaults_.output_dir_required) {
      errors.push_back(Missing("output.dir", "the folder the job writes its results to"));
    }
    if (spec_.task == "finetune" && spec_.training.eval_every > 0 && spec_.data.eval.empty()) {
      errors.push_back(Conflict("training.eval_every", "asks for evaluations but data.eval is not set; add "
                                "data.eval or remove training.eval_every"));
    }
    if (spec_.data.train_on_prompt && spec_.data.format == "tokens") {
      errors.push_back(Conflict("data.train_on_prompt", "has no effect on data.format tokens, whose labels say "
                                "what is trained; remove it, or set data.format to completion, chat or auto"));
    }
    if (spec_.data.chat_template != "auto" && spec_.data.format != "chat" && spec_.data.format != "auto") {
      errors.push_back(Conflict("data.chat_template", "only applies to chat data; set data.format to chat or "
                                "auto, or remove data.chat_template"));
    }
    if (spec_.training.gradient_checkpointing_layers > 0 && !spec_.training.gradient_checkpointing) {
      errors.push_back(Conflict("training.gradient_checkpointing_layers", "says how many layers to recompute, "
                                "but training.gradient_checkpointing is off; set it to true, or remove "
                                "training.gradient_checkpointing_layers"));
    }
    if (spec_.output.merge && !spec_.adapter) {
      errors.push_back(Conflict("output.merge", "merges an adapter into the model, but the job has no adapter "
                                "(full fine-tuning writes output.dir/model already); remove output.merge"));
    }
    return Status::Errors(errors);
  }

  // Two keys that cannot go together, reported at the first one's line.
  std::string Conflict(const std::string& key, const std::string& why) const {
    return Where(spec_.source, reader_.LineOf(key)) + key + ": " + why;
  }

  JobSpec spec_;
  yaml::MapReader reader_;  // remembers the line each key was set on
  JobSpecDefaults defaults_;
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
                                   const std::string& base_dir, const JobSpecDefaults& defaults) {
  return SpecParser(source, base_dir, defaults).Parse(text);
}

StatusOr<JobSpec> ParseJobSpecFile(const std::string& path, const JobSpecDefaults& defaults) {
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
  return ParseJobSpecText(text, path, absolute.parent_path().lexically_normal().string(), defaults);
}

}  // namespace trainerd
