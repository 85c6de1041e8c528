#include "engine/sha256.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace trainerd::engine {
namespace {

using trainerd::testing::ExpectErrorContains;
using trainerd::testing::TempDir;

std::string HexOf(std::string_view bytes) {
  Sha256 hash;
  hash.Update(bytes);
  return hash.HexDigest();
}

// FIPS 180-4 / NIST CSRC example vectors.
TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(HexOf(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexOf("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, OneMillionAInUnevenChunks) {
  const std::string a(1000000, 'a');
  Sha256 hash;
  size_t done = 0;
  for (size_t chunk = 1; done < a.size(); chunk = chunk * 3 % 1021 + 1) {
    const size_t n = std::min(chunk, a.size() - done);
    hash.Update(std::string_view(a).substr(done, n));
    done += n;
  }
  EXPECT_EQ(hash.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundaries (one or two final blocks). Expected
// digests from sha256sum:  yes 0123456789 | tr -d '\n' | head -c N | sha256sum
TEST(Sha256Test, PaddingBoundaries) {
  const std::string digits = "0123456789012345678901234567890123456789012345678901234567890123456789";
  const std::pair<size_t, const char*> cases[] = {
      {55, "f34d5a0f80c0cbf84c8c0b90218c22637abd199965249da736a20143c8c9c9d9"},
      {56, "83aa034bda83e458a0dc9cbce0d4e354716aa0ff770ed37ac0ed2b292052e4af"},
      {63, "074f6e9ac301d5d1b6df6f1dfb8c6f89c187ea945d352ce6a29279a9c630680b"},
      {64, "9674d9e078535b7cec43284387a6ee39956188e735a85452b0050b55341cda56"},
      {65, "52774b57c10e45040a61c14d35c1c8ebefe880082313aa0a21ebb077734cd067"},
  };
  for (const auto& [n, want] : cases) {
    EXPECT_EQ(HexOf(digits.substr(0, n)), want) << n << " bytes";
    // The same bytes fed one at a time.
    Sha256 bytewise;
    for (size_t i = 0; i < n; ++i) bytewise.Update(digits.substr(i, 1));
    EXPECT_EQ(bytewise.HexDigest(), want) << n << " bytes, one at a time";
  }
}

TEST(Sha256Test, UpdateFieldSeparatesFields) {
  Sha256 ab_c, a_bc, plain;
  ab_c.UpdateField("ab");
  ab_c.UpdateField("c");
  a_bc.UpdateField("a");
  a_bc.UpdateField("bc");
  plain.Update("abc");
  const std::string x = ab_c.HexDigest(), y = a_bc.HexDigest(), z = plain.HexDigest();
  EXPECT_NE(x, y);
  EXPECT_NE(x, z);
  EXPECT_NE(y, z);
  // A field is its 8-byte little-endian length, then its bytes.
  Sha256 field, by_hand;
  field.UpdateField("abc");
  by_hand.Update(std::string("\x03\0\0\0\0\0\0\0", 8));
  by_hand.Update("abc");
  EXPECT_EQ(field.HexDigest(), by_hand.HexDigest());
}

TEST(Sha256Test, HashFileEqualsHashingTheBytes) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::string bytes;
  for (int i = 0; i < 3 * (1 << 20) + 12345; ++i) bytes.push_back(static_cast<char>(i * 131 % 251));
  const std::string path = dir / "data.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  }
  Sha256 from_file;
  ASSERT_TRUE(HashFile(path, &from_file).ok());
  EXPECT_EQ(from_file.HexDigest(), HexOf(bytes));

  const std::string empty = dir / "empty.bin";
  std::ofstream(empty, std::ios::binary).close();
  Sha256 from_empty;
  ASSERT_TRUE(HashFile(empty, &from_empty).ok());
  EXPECT_EQ(from_empty.HexDigest(), HexOf(""));
}

TEST(Sha256Test, HashFileMissingFileNamesThePath) {
  TempDir dir;
  const std::string path = dir / "no-such-file.jsonl";
  Sha256 hash;
  ExpectErrorContains(HashFile(path, &hash), {path, "No such file"});
}

}  // namespace
}  // namespace trainerd::engine
