// Small hand-written tokenizer.json files for the tokenizer tests, written
// into a fresh temporary folder.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/byte_level.h"

namespace trainerd::engine::tokenizer::testing {

inline std::string MakeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "trainerd-tok-XXXXXX").string();
  return std::string(mkdtemp(pattern.data()));
}

inline std::string WriteJson(const std::string& dir, const nlohmann::json& j) {
  const std::string path = dir + "/tokenizer.json";
  std::ofstream(path) << j.dump(1);
  return path;
}

constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// An "added_tokens" entry of tokenizer.json for a special token matched in the
// raw text (not normalized, no stripping).
inline nlohmann::json SpecialAddedToken(int id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// Byte-level BPE, Llama 3 style. Ids 0..255 are the byte-level characters in
// byte order (so a lone byte b has id b: 'h' = 104, ' ' ("Ġ") = 32), then:
//   256 "Ġt"   (merge rank 0: Ġ t)      257 "he"    (rank 1: h e)
//   258 "Ġthe" (rank 2: Ġt he)          259 "ll"    (rank 3: l l)
//   260 "hell" (rank 4: he ll)          261 "hello" (rank 5: hell o)
//   262 "34"   (rank 6: 3 4)            263 "ab"    (no merge makes it)
//   264 "<|begin_of_text|>", 265 "<|end|>": special added tokens.
inline nlohmann::json ByteLevelBpe(bool ignore_merges = false) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<uint8_t>(b))] = b;
  const char* extra[] = {"Ġt", "he", "Ġthe", "ll", "hell", "hello", "34", "ab"};
  for (int i = 0; i < 8; ++i) vocab[extra[i]] = 256 + i;
  vocab["<|begin_of_text|>"] = 264;
  vocab["<|end|>"] = 265;
  json added = json::array();
  added.push_back(SpecialAddedToken(264, "<|begin_of_text|>"));
  added.push_back(SpecialAddedToken(265, "<|end|>"));
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", kLlama3Regex}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                       {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "Sequence"},
        {"processors",
         json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
                       {"use_regex", true}},
                      {{"type", "TemplateProcessing"},
                       {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                       {"pair", json::array()},
                       {"special_tokens",
                        {{"<|begin_of_text|>",
                          {{"id", "<|begin_of_text|>"}, {"ids", {264}}, {"tokens", {"<|begin_of_text|>"}}}}}}}})}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        // Both merge forms: strings and pairs.
        {"merges", json::array({"Ġ t", "h e", json::array({"Ġt", "he"}), "l l", json::array({"he", "ll"}),
                                "hell o", "3 4"})}}}};
}

// SentencePiece-style BPE, Llama 2 style: Prepend("▁") + Replace(" " → "▁")
// normalizers, no pre-tokenizer, byte_fallback, "<s>" template, the Llama 2
// decoder sequence. Ids: 0 "<unk>", 1 "<s>", 2 "</s>", 3 + b for "<0xBB>",
// then 259 "▁", 260 "h", 261 "e", 262 "l", 263 "o",
//   264 "▁h" (merge rank 0: ▁ h)   265 "ll" (rank 1: l l)   266 "▁he" (rank 2: ▁h e)
//   267 "▁hell" (rank 3: ▁he ll)   268 "▁hello" (rank 4: ▁hell o).
inline nlohmann::json SentencePieceBpe() {
  using nlohmann::json;
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const char* extra[] = {"▁", "h", "e", "l", "o", "▁h", "ll", "▁he", "▁hell", "▁hello"};
  for (int i = 0; i < 10; ++i) vocab[extra[i]] = 259 + i;
  json added = json::array();
  const char* specials[] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 3; ++i)
    added.push_back(SpecialAddedToken(i, specials[i]));
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array({"▁ h", "l l", "▁h e", "▁he ll", "▁hell o"})}}}};
}

}  // namespace trainerd::engine::tokenizer::testing
