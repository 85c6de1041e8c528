#include "engine/tokenizer/component_json.h"

#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {

using nlohmann::json;

Status UnsupportedType(const std::string& component, const std::string& type) {
  return Status::Error(component + " type \"" + type + "\" is not supported");
}

Status ReadType(const json& object, const std::string& component, std::string* type) {
  if (!object.is_object()) return Status::Error(component + " must be an object or null");
  auto it = object.find("type");
  if (it == object.end() || !it->is_string()) return Status::Error(component + " has no \"type\" string");
  *type = it->get<std::string>();
  return Status::Ok();
}

Status ReadString(const json& object, const char* key, const std::string& where, bool required,
                  std::string* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    if (required) return Status::Error(where + ": missing \"" + key + "\"");
    return Status::Ok();
  }
  if (!it->is_string()) return Status::Error(where + ": \"" + key + "\" must be a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

Status ReadBool(const json& object, const char* key, const std::string& where, bool* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Status::Error(where + ": \"" + key + "\" must be true or false");
  *out = it->get<bool>();
  return Status::Ok();
}

Status ReadInt(const json& object, const char* key, const std::string& where, bool required, int64_t* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    if (required) return Status::Error(where + ": missing \"" + key + "\"");
    return Status::Ok();
  }
  if (!it->is_number_integer()) return Status::Error(where + ": \"" + key + "\" must be an integer");
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status ReadChar(const json& object, const char* key, const std::string& where, std::string* out) {
  std::string value;
  TRAINERD_RETURN_IF_ERROR(ReadString(object, key, where, true, &value));
  size_t length = 0;
  if (value.empty() || (DecodeUtf8At(value, 0, &length), length != value.size()))
    return Status::Error(where + ": \"" + key + "\" must be exactly one character, got \"" + value + "\"");
  *out = value;
  return Status::Ok();
}

StatusOr<SplitPattern> ReadPattern(const json& object, const std::string& where) {
  auto it = object.find("pattern");
  if (it == object.end() || !it->is_object() || it->size() != 1)
    return Status::Error(where + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    std::string literal = s->get<std::string>();
    if (literal.empty()) return Status::Error(where + ": an empty String pattern is not supported");
    return SplitPattern::Literal(std::move(literal));
  }
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    auto pattern = SplitPattern::FromRegex(r->get<std::string>());
    if (!pattern.ok()) return pattern.status().WithContext(where);
    return pattern;
  }
  return Status::Error(where + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

Status ReadStringPattern(const json& object, const std::string& where, std::string* literal) {
  auto it = object.find("pattern");
  if (it != object.end() && it->is_object() && it->contains("Regex"))
    return Status::Error(where + " with a Regex pattern is not supported");
  if (it == object.end() || !it->is_object() || !it->contains("String") || !(*it)["String"].is_string())
    return Status::Error(where + ": \"pattern\" must be {\"String\": ...}");
  *literal = (*it)["String"].get<std::string>();
  if (literal->empty()) return Status::Error(where + ": an empty String pattern is not supported");
  return Status::Ok();
}

}  // namespace trainerd::engine::tokenizer
