// Reading the objects of tokenizer.json (normalizer, pre_tokenizer, model,
// post_processor, decoder) with errors that name the component and key.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tokenizer/split_pattern.h"

namespace trainerd::engine::tokenizer {

// The error for a component type we do not implement:
// `pre_tokenizer type "BertPreTokenizer" is not supported`.
Status UnsupportedType(const std::string& component, const std::string& type);

// `where` is the component in errors, e.g. `pre_tokenizer Split`.
// A missing or null optional key leaves *out unchanged.
Status ReadType(const nlohmann::json& object, const std::string& component, std::string* type);
Status ReadString(const nlohmann::json& object, const char* key, const std::string& where, bool required,
                  std::string* out);
Status ReadBool(const nlohmann::json& object, const char* key, const std::string& where, bool* out);
Status ReadInt(const nlohmann::json& object, const char* key, const std::string& where, bool required,
               int64_t* out);
// A single code point given as a one-character string (Metaspace's replacement).
Status ReadChar(const nlohmann::json& object, const char* key, const std::string& where, std::string* out);
// {"String": "..."} or {"Regex": "..."}.
StatusOr<SplitPattern> ReadPattern(const nlohmann::json& object, const std::string& where);
// The literal of a {"String": ...} pattern; a Regex pattern is an error.
Status ReadStringPattern(const nlohmann::json& object, const std::string& where, std::string* literal);

}  // namespace trainerd::engine::tokenizer
