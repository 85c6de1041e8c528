#include "engine/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

namespace trainerd::engine {
namespace {

using nlohmann::json;

constexpr const char* kSupportedModelTypes = "llama, mistral, qwen2";
constexpr const char* kSupportedRopeTypes = "default, linear, llama3";
constexpr const char* kFixHint = "; correct config.json or download the model folder again";

// Reads keys of one JSON object, producing errors that name the file and the
// key path ("rope_scaling.factor").
class KeyReader {
 public:
  KeyReader(const json& object, std::string origin, std::string prefix = "")
      : object_(object), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  // nullptr when the key is absent; a pointer to the value (maybe null) otherwise.
  const json* Find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }
  // Absent or null.
  bool IsUnset(const char* key) const {
    const json* v = Find(key);
    return v == nullptr || v->is_null();
  }

  Status Error(const char* key, const std::string& what) const {
    return Status::Error(origin_ + ": key \"" + prefix_ + key + "\": " + what);
  }
  Status WrongType(const char* key, const json& v, const char* expected) const {
    return Error(key, std::string("expected ") + expected + ", got " + Shown(v) + kFixHint);
  }
  Status Missing(const char* key, const std::string& why = "") const {
    return Status::Error(origin_ + ": missing required key \"" + prefix_ + key + "\"" + why +
                         kFixHint);
  }

  // A value that must be an integer > 0.
  StatusOr<int64_t> PositiveInt(const char* key, const json& v) const {
    if (!v.is_number_integer()) return WrongType(key, v, "a positive integer");
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(key, Shown(v) + " is too large" + kFixHint);
    }
    int64_t i = v.get<int64_t>();
    if (i <= 0) return Error(key, "must be > 0, got " + std::to_string(i) + kFixHint);
    return i;
  }
  // A value that must be an integer >= 0.
  StatusOr<int64_t> NonNegativeInt(const char* key, const json& v) const {
    if (!v.is_number_integer()) return WrongType(key, v, "a non-negative integer");
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(key, Shown(v) + " is too large" + kFixHint);
    }
    int64_t i = v.get<int64_t>();
    if (i < 0) return Error(key, "must be >= 0, got " + std::to_string(i) + kFixHint);
    return i;
  }
  // A value that must be a number (integer or not) > 0.
  StatusOr<double> PositiveNumber(const char* key, const json& v) const {
    if (!v.is_number()) return WrongType(key, v, "a positive number");
    double d = v.get<double>();
    if (!(d > 0)) return Error(key, "must be > 0, got " + v.dump() + kFixHint);
    return d;
  }

  // Required key (present and not null), integer > 0.
  StatusOr<int64_t> RequiredPositiveInt(const char* key) const {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) return Missing(key);
    return PositiveInt(key, *v);
  }
  // Required key, number > 0.
  StatusOr<double> RequiredPositiveNumber(const char* key) const {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) return Missing(key);
    return PositiveNumber(key, *v);
  }
  // Optional key: `fallback` when absent; null is a type error (transformers
  // would pass None on and fail later).
  StatusOr<int64_t> PositiveIntOr(const char* key, int64_t fallback) const {
    const json* v = Find(key);
    return v == nullptr ? StatusOr<int64_t>(fallback) : PositiveInt(key, *v);
  }
  StatusOr<double> PositiveNumberOr(const char* key, double fallback) const {
    const json* v = Find(key);
    return v == nullptr ? StatusOr<double>(fallback) : PositiveNumber(key, *v);
  }
  StatusOr<bool> BoolOr(const char* key, bool fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return WrongType(key, *v, "true or false");
    return v->get<bool>();
  }

  static std::string Shown(const json& v) {
    std::string text = v.dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    return text + " (" + v.type_name() + ")";
  }

 private:
  const json& object_;
  std::string origin_;
  std::string prefix_;
};

struct ModelTypeDefaults {
  const char* name;
  int64_t max_position_embeddings;
};
constexpr ModelTypeDefaults kModelTypes[] = {
    {"llama", 2048},
    {"mistral", 4096 * 32},
    {"qwen2", 32768},
};

// Fills config->rope_theta and config->rope_scaling, following transformers 5's
// RotaryEmbeddingConfigMixin: the rope dict is "rope_scaling" when it is a
// non-empty object, else "rope_parameters"; its "rope_theta" wins over the
// top-level one; the type is "rope_type", else the legacy "type", else "default".
Status ParseRope(const KeyReader& top, const std::string& origin, ModelConfig* config) {
  const char* dict_key = nullptr;
  const json* dict = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = top.Find(key);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_object()) return top.WrongType(key, *v, "an object or null");
    if (v->empty()) continue;
    dict_key = key;
    dict = v;
    break;
  }

  double theta = 10000.0;
  if (top.Find("rope_theta") != nullptr) {
    TRAINERD_ASSIGN_OR_RETURN(theta, top.PositiveNumber("rope_theta", *top.Find("rope_theta")));
  }
  config->rope_scaling = RopeScaling();
  if (dict == nullptr) {
    config->rope_theta = theta;
    return Status::Ok();
  }

  KeyReader rope(*dict, origin, std::string(dict_key) + ".");
  for (const char* layer_type : {"full_attention", "sliding_attention"}) {
    const json* v = rope.Find(layer_type);
    if (v != nullptr && v->is_object()) {
      return rope.Error(layer_type,
                        "RoPE parameters per layer type are not supported for model_type \"" +
                            config->model_type + "\"; give one set of parameters");
    }
  }
  if (rope.Find("rope_theta") != nullptr) {
    TRAINERD_ASSIGN_OR_RETURN(theta, rope.PositiveNumber("rope_theta", *rope.Find("rope_theta")));
  }
  config->rope_theta = theta;

  const char* type_key = rope.Find("rope_type") != nullptr ? "rope_type" : "type";
  std::string type = "default";
  if (const json* v = rope.Find(type_key)) {
    if (!v->is_string()) return rope.WrongType(type_key, *v, "a string");
    type = v->get<std::string>();
  }
  RopeScaling& s = config->rope_scaling;
  if (type == "default") {
    s.type = RopeScalingType::kNone;
  } else if (type == "linear") {
    s.type = RopeScalingType::kLinear;
    TRAINERD_ASSIGN_OR_RETURN(s.factor, rope.RequiredPositiveNumber("factor"));
  } else if (type == "llama3") {
    s.type = RopeScalingType::kLlama3;
    TRAINERD_ASSIGN_OR_RETURN(s.factor, rope.RequiredPositiveNumber("factor"));
    TRAINERD_ASSIGN_OR_RETURN(s.low_freq_factor, rope.RequiredPositiveNumber("low_freq_factor"));
    TRAINERD_ASSIGN_OR_RETURN(s.high_freq_factor, rope.RequiredPositiveNumber("high_freq_factor"));
    TRAINERD_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                              rope.RequiredPositiveInt("original_max_position_embeddings"));
    // The llama3 interpolation divides by (high_freq_factor - low_freq_factor).
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      return rope.Error("high_freq_factor", "must be greater than low_freq_factor (" +
                                                json(s.low_freq_factor).dump() + "), got " +
                                                json(s.high_freq_factor).dump() + kFixHint);
    }
  } else {
    return rope.Error(type_key, "unsupported rope type \"" + type + "\" (supported: " +
                                    kSupportedRopeTypes + "); this engine cannot train this model");
  }
  return Status::Ok();
}

// Qwen2 with use_sliding_window: the window applies from the first layer
// whose layer_types entry is "sliding_attention" (transformers >= 4.53 saves
// layer_types), else from max_window_layers.
Status ParseQwen2SlidingWindow(const KeyReader& top, ModelConfig* config) {
  TRAINERD_ASSIGN_OR_RETURN(bool use_sliding_window, top.BoolOr("use_sliding_window", false));
  if (!use_sliding_window ||
      (top.Find("sliding_window") && top.Find("sliding_window")->is_null())) {
    config->sliding_window = std::nullopt;
    return Status::Ok();
  }
  TRAINERD_ASSIGN_OR_RETURN(int64_t window, top.PositiveIntOr("sliding_window", 4096));
  config->sliding_window = window;
  int64_t first_layer = 28;  // Qwen2Config's max_window_layers default
  if (const json* v = top.Find("max_window_layers")) {
    TRAINERD_ASSIGN_OR_RETURN(first_layer, top.NonNegativeInt("max_window_layers", *v));
  }
  const json* layer_types = top.Find("layer_types");
  if (layer_types != nullptr && !layer_types->is_null()) {
    const char* expected = "a list of \"full_attention\" / \"sliding_attention\", one per layer";
    if (!layer_types->is_array() ||
        static_cast<int64_t>(layer_types->size()) != config->num_hidden_layers) {
      return top.WrongType("layer_types", *layer_types, expected);
    }
    first_layer = config->num_hidden_layers;
    for (size_t i = 0; i < layer_types->size(); ++i) {
      const json& t = (*layer_types)[i];
      bool sliding = t == "sliding_attention";
      if (!sliding && t != "full_attention")
        return top.WrongType("layer_types", *layer_types, expected);
      if (sliding && first_layer == config->num_hidden_layers)
        first_layer = static_cast<int64_t>(i);
      if (!sliding && first_layer < config->num_hidden_layers) {
        return top.Error("layer_types",
                         "full attention after sliding attention (layer " + std::to_string(i) +
                             ") is not supported: sliding layers must be the last ones");
      }
    }
  }
  config->sliding_window_first_layer = first_layer;
  return Status::Ok();
}

}  // namespace

StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) {
    return Status::Error(origin + ": is JSON " + j.type_name() +
                         ", expected an object of model settings" + kFixHint);
  }
  KeyReader top(j, origin);
  ModelConfig config;

  const json* model_type = top.Find("model_type");
  if (model_type == nullptr || model_type->is_null()) {
    return top.Missing("model_type", std::string(" (supported: ") + kSupportedModelTypes + ")");
  }
  if (!model_type->is_string()) return top.WrongType("model_type", *model_type, "a string");
  config.model_type = model_type->get<std::string>();
  const ModelTypeDefaults* defaults = nullptr;
  for (const ModelTypeDefaults& d : kModelTypes) {
    if (config.model_type == d.name) defaults = &d;
  }
  if (defaults == nullptr) {
    return top.Error("model_type", "unsupported model_type \"" + config.model_type +
                                       "\" (supported: " + kSupportedModelTypes +
                                       "); choose a model of a supported architecture");
  }
  const bool llama = config.model_type == "llama";
  const bool mistral = config.model_type == "mistral";
  const bool qwen2 = config.model_type == "qwen2";

  TRAINERD_ASSIGN_OR_RETURN(config.hidden_size, top.RequiredPositiveInt("hidden_size"));
  TRAINERD_ASSIGN_OR_RETURN(config.intermediate_size, top.RequiredPositiveInt("intermediate_size"));
  TRAINERD_ASSIGN_OR_RETURN(config.num_hidden_layers, top.RequiredPositiveInt("num_hidden_layers"));
  TRAINERD_ASSIGN_OR_RETURN(config.num_attention_heads,
                            top.RequiredPositiveInt("num_attention_heads"));
  TRAINERD_ASSIGN_OR_RETURN(config.vocab_size, top.RequiredPositiveInt("vocab_size"));

  // Absent and null differ: absent takes the class default, null means
  // "same as num_attention_heads" (transformers' backward compatibility).
  if (top.Find("num_key_value_heads") == nullptr) {
    config.num_key_value_heads = mistral ? 8 : qwen2 ? 32 : config.num_attention_heads;
  } else if (top.IsUnset("num_key_value_heads")) {
    config.num_key_value_heads = config.num_attention_heads;
  } else {
    TRAINERD_ASSIGN_OR_RETURN(
        config.num_key_value_heads,
        top.PositiveInt("num_key_value_heads", *top.Find("num_key_value_heads")));
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return top.Error(
        "num_key_value_heads",
        std::to_string(config.num_key_value_heads) + " does not divide num_attention_heads (" +
            std::to_string(config.num_attention_heads) +
            "): each key/value head must serve a whole group of query heads" + kFixHint);
  }

  if (top.IsUnset("head_dim")) {
    if (config.hidden_size % config.num_attention_heads != 0) {
      return top.Error("hidden_size", std::to_string(config.hidden_size) +
                                          " is not divisible by num_attention_heads (" +
                                          std::to_string(config.num_attention_heads) +
                                          ") and no head_dim is given" + kFixHint);
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  } else {
    TRAINERD_ASSIGN_OR_RETURN(config.head_dim, top.PositiveInt("head_dim", *top.Find("head_dim")));
  }

  TRAINERD_ASSIGN_OR_RETURN(
      config.max_position_embeddings,
      top.PositiveIntOr("max_position_embeddings", defaults->max_position_embeddings));
  TRAINERD_ASSIGN_OR_RETURN(config.rms_norm_eps, top.PositiveNumberOr("rms_norm_eps", 1e-6));
  TRAINERD_ASSIGN_OR_RETURN(config.tie_word_embeddings, top.BoolOr("tie_word_embeddings", false));

  if (llama) {
    TRAINERD_ASSIGN_OR_RETURN(bool attention_bias, top.BoolOr("attention_bias", false));
    config.qkv_bias = attention_bias;
    config.o_bias = attention_bias;
    TRAINERD_ASSIGN_OR_RETURN(config.mlp_bias, top.BoolOr("mlp_bias", false));
  } else {
    // transformers builds Mistral's projections without bias and Qwen2's q/k/v
    // with bias, whatever config.json says.
    config.qkv_bias = qwen2;
    config.o_bias = false;
    config.mlp_bias = false;
  }

  if (mistral) {
    const json* window = top.Find("sliding_window");
    if (window == nullptr) {
      config.sliding_window = 4096;
    } else if (!window->is_null()) {
      TRAINERD_ASSIGN_OR_RETURN(config.sliding_window, top.PositiveInt("sliding_window", *window));
    }
    config.sliding_window_first_layer = 0;
  } else if (qwen2) {
    TRAINERD_RETURN_IF_ERROR(ParseQwen2SlidingWindow(top, &config));
  }

  TRAINERD_RETURN_IF_ERROR(ParseRope(top, origin, &config));

  for (const char* key : {"dtype", "torch_dtype"}) {
    const json* v = top.Find(key);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_string()) return top.WrongType(key, *v, "a string such as \"bfloat16\"");
    config.torch_dtype = v->get<std::string>();
    break;
  }

  config.raw = j;
  return config;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir(model_dir);
  const std::string path = (dir / "config.json").string();
  if (!fs::exists(dir, ec)) {
    return Status::Error("model folder " + model_dir + " does not exist; check the model path");
  }
  if (!fs::is_directory(dir, ec)) {
    return Status::Error(
        "model path " + model_dir +
        " is not a folder; give the Hugging Face model folder that holds config.json");
  }
  if (!fs::exists(path, ec)) {
    return Status::Error("model folder " + model_dir + " has no config.json (looked for " + path +
                         "); give a Hugging Face model folder, or download the model again");
  }
  if (!fs::is_regular_file(path, ec)) {
    return Status::Error(path + ": is not a regular file; it must be the model's JSON config");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text_stream;
  text_stream << in.rdbuf();
  if (!in || !text_stream) {
    return Status::Error(path + ": cannot be read; check its permissions");
  }
  const std::string text = text_stream.str();

  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte counts from 1; point at the character the parser stopped on.
    size_t offset = e.byte > 0 ? std::min<size_t>(e.byte - 1, text.size()) : 0;
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return Status::Error(path + ": invalid JSON near line " + std::to_string(line) + ", column " +
                         std::to_string(column) + " (byte offset " + std::to_string(offset) +
                         "): " + e.what() + kFixHint);
  }
  return ParseModelConfig(j, path);
}

}  // namespace trainerd::engine
