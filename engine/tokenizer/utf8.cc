#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

// Length of the well-formed prefix of the sequence at text[pos] (0 if the
// lead byte itself is invalid); *complete says whether the whole sequence is
// well formed. Follows Unicode's table 3-7 of well-formed byte sequences.
size_t ScanSequence(std::string_view text, size_t pos, bool* complete) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  size_t n = 1;
  while (n < need && pos + n < text.size()) {
    const auto b = static_cast<unsigned char>(text[pos + n]);
    const unsigned char l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
    ++n;
  }
  *complete = n == need;
  return n;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete;
    const size_t n = ScanSequence(text, pos, &complete);
    if (!complete) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

char32_t DecodeUtf8At(std::string_view text, size_t pos, size_t* length) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  const size_t n = Utf8Length(b0);
  *length = n;
  if (n == 1) return b0;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete;
    const size_t n = ScanSequence(bytes, pos, &complete);
    if (complete) {
      out.append(bytes.data() + pos, n);
      pos += n;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += n == 0 ? 1 : n;
    }
  }
  return out;
}

bool IsUnicodeWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace trainerd::engine::tokenizer
