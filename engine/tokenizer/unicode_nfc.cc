#include "engine/tokenizer/unicode_nfc.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {
namespace {

struct CccRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t code_point, first, second;  // second 0: a singleton
};
struct Composition {
  char32_t first, second, composite;
};
struct QuickCheckRange {
  char32_t first, last;
};

#include "engine/tokenizer/unicode_nfc_tables.inc"

// Hangul syllables, decomposed and composed algorithmically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

template <typename Range, size_t N>
const Range* FindRange(const Range (&ranges)[N], char32_t cp) {
  const Range* it =
      std::upper_bound(ranges, ranges + N, cp, [](char32_t c, const Range& r) { return c < r.first; });
  if (it == ranges) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

// Whether `cp` is other than "ccc 0 and NFC_Quick_Check=Yes".
bool NeedsWork(char32_t cp) { return cp >= kQuickCheckMin && FindRange(kQuickCheckRanges, cp) != nullptr; }

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const Decomposition* end = kDecompositions + std::size(kDecompositions);
    const Decomposition* it = std::lower_bound(kDecompositions, end, cp,
                                               [](const Decomposition& d, char32_t c) { return d.code_point < c; });
    if (it != end && it->code_point == cp) {
      Decompose(it->first, out);
      if (it->second != 0) Decompose(it->second, out);
      return;
    }
  }
  out->push_back(cp);
}

// The primary composite of `first` + `second`, or 0.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount)
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount)
    return first + (second - kTBase);
  const Composition* end = kCompositions + std::size(kCompositions);
  const Composition* it = std::lower_bound(kCompositions, end, std::pair<char32_t, char32_t>(first, second),
                                           [](const Composition& c, const std::pair<char32_t, char32_t>& key) {
                                             return c.first != key.first ? c.first < key.first
                                                                         : c.second < key.second;
                                           });
  if (it != end && it->first == first && it->second == second) return it->composite;
  return 0;
}

}  // namespace

int CanonicalCombiningClass(char32_t cp) {
  if (cp < kCccRanges[0].first) return 0;
  const CccRange* range = FindRange(kCccRanges, cp);
  return range ? range->ccc : 0;
}

std::string NormalizeNfc(std::string_view utf8) {
  // Quick check: find the first code point that may need work. Everything
  // before it is a ccc-0 NFC_QC=Yes code point, left as is, except that the
  // one right before it may compose with what follows (and is a boundary:
  // nothing before it can).
  size_t pos = 0, previous = 0;
  bool found = false;
  while (pos < utf8.size()) {
    const auto lead = static_cast<unsigned char>(utf8[pos]);
    if (lead < 0xCC) {  // below U+0300
      previous = pos;
      pos += lead < 0x80 ? 1 : 2;
      continue;
    }
    size_t length = Utf8Length(lead);
    if (pos + length > utf8.size()) return std::string(utf8);  // truncated: invalid
    if (NeedsWork(DecodeUtf8At(utf8, pos, &length))) {
      found = true;
      break;
    }
    previous = pos;
    pos += length;
  }
  if (!found) return std::string(utf8);
  if (FindInvalidUtf8(utf8) != std::string_view::npos) return std::string(utf8);
  const size_t start = pos == 0 ? 0 : previous;

  // Canonical decomposition with canonical ordering (a stable sort of each
  // run of non-starters by combining class).
  std::vector<char32_t> chars;
  std::vector<uint8_t> classes;
  chars.reserve(utf8.size() - start);
  std::vector<char32_t> pieces;
  for (size_t i = start; i < utf8.size();) {
    size_t length;
    const char32_t cp = DecodeUtf8At(utf8, i, &length);
    i += length;
    pieces.clear();
    Decompose(cp, &pieces);
    for (char32_t piece : pieces) {
      const auto ccc = static_cast<uint8_t>(CanonicalCombiningClass(piece));
      size_t at = chars.size();
      if (ccc != 0) {
        while (at > 0 && classes[at - 1] > ccc) --at;
      }
      chars.insert(chars.begin() + static_cast<ptrdiff_t>(at), piece);
      classes.insert(classes.begin() + static_cast<ptrdiff_t>(at), ccc);
    }
  }

  // Canonical composition: each character joins the last starter when it is
  // not blocked from it (nothing between, or everything between has a lower,
  // non-zero combining class) and they have a primary composite.
  size_t out = 0;
  size_t starter = SIZE_MAX;
  int last_class = -1;  // of the last character kept after the starter; -1: none
  for (size_t i = 0; i < chars.size(); ++i) {
    const char32_t cp = chars[i];
    const int ccc = classes[i];
    if (starter != SIZE_MAX && (last_class == -1 || (last_class != 0 && last_class < ccc))) {
      const char32_t composite = Compose(chars[starter], cp);
      if (composite != 0) {
        chars[starter] = composite;
        continue;
      }
    }
    if (ccc == 0) {
      starter = out;
      last_class = -1;
    } else {
      last_class = ccc;
    }
    chars[out++] = cp;
  }

  std::string result(utf8.substr(0, start));
  result.reserve(utf8.size() + 8);
  for (size_t i = 0; i < out; ++i) AppendUtf8(chars[i], &result);
  return result;
}

}  // namespace trainerd::engine::tokenizer
