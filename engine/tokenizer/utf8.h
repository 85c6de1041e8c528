// UTF-8 helpers for the tokenizer: validation, code point access, Rust's lossy
// decoding and Unicode's White_Space property.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace trainerd::engine::tokenizer {

// Byte offset of the first byte of `text` that is not part of a well-formed
// UTF-8 sequence (overlongs, surrogates and code points above U+10FFFF are
// ill-formed), or std::string_view::npos if `text` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view text);

// Length of the UTF-8 sequence led by `lead`; only meaningful on valid text.
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// The code point starting at byte `pos` of valid UTF-8 `text`; its length in
// bytes goes to *length.
char32_t DecodeUtf8At(std::string_view text, size_t pos, size_t* length);

void AppendUtf8(char32_t code_point, std::string* out);

// Bytes → text as Rust's String::from_utf8_lossy does: each maximal
// ill-formed subpart becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's Unicode \s).
bool IsUnicodeWhiteSpace(char32_t code_point);

}  // namespace trainerd::engine::tokenizer
