#include "engine/tokenizer/byte_level.h"

#include <array>

#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> bytes;  // every mapped code point is below 0x144

  ByteLevelTables() {
    bytes.fill(-1);
    std::array<char32_t, 256> code_point{};
    std::array<bool, 256> printable{};
    // Printable Latin-1 bytes stand for themselves; the others are numbered
    // from U+0100 in byte order.
    for (int b = 0; b < 256; ++b)
      printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) code_point[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(code_point[b], &chars[b]);
      bytes[code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t byte) { return Tables().chars[byte]; }

int ByteLevelByte(char32_t code_point) {
  return code_point < 512 ? Tables().bytes[code_point] : -1;
}

void AppendByteLevel(const std::string& text, std::string* out) {
  const auto& chars = Tables().chars;
  for (unsigned char b : text) out->append(chars[b]);
}

}  // namespace trainerd::engine::tokenizer
