// SHA-256 (FIPS 180-4), for cache keys and checksums. Torch-free, no dependencies.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace trainerd::engine {

// An incremental SHA-256: Update any number of times, then take the digest once.
class Sha256 {
 public:
  static constexpr size_t kDigestSize = 32;

  Sha256();

  // Appends `bytes` to the message.
  void Update(std::string_view bytes);
  // Appends a field: its length as 8 little-endian bytes, then its bytes, so
  // that ("ab", "c") and ("a", "bc") hash differently.
  void UpdateField(std::string_view bytes);

  // Finishes the hash and returns the 32-byte digest. Call once (Digest or
  // HexDigest); no Update may follow.
  std::array<uint8_t, kDigestSize> Digest();
  // The digest as 64 lowercase hex characters. Call once.
  std::string HexDigest();

 private:
  void Compress(const uint8_t* block);  // one 64-byte block into state_

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;  // a partial block: buffered_ bytes used
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // message bytes so far
  bool finished_ = false;
};

// Feeds the bytes of the file at `path` to `hash`, streamed in blocks (not
// read whole). Errors name the path; on error `hash` may have seen a prefix.
Status HashFile(const std::string& path, Sha256* hash);

}  // namespace trainerd::engine
