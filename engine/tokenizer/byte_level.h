// GPT-2's bytes_to_unicode: every byte maps to one printable code point, so
// that byte-level BPE vocabularies are plain text.
#pragma once

#include <cstdint>
#include <string>

namespace trainerd::engine::tokenizer {

// The UTF-8 encoding of the code point standing for `byte`.
const std::string& ByteLevelChar(uint8_t byte);

// The byte a code point stands for, or -1 if it stands for none.
int ByteLevelByte(char32_t code_point);

// Appends the byte-level form of `text` (each byte replaced by its code point).
void AppendByteLevel(const std::string& text, std::string* out);

}  // namespace trainerd::engine::tokenizer
