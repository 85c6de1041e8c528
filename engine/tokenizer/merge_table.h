// The BPE merge table: (left id, right id) → the merge's rank and the merged
// id, as an open-addressing hash table (linear probing, at most half full).
// BPE looks pairs up in its innermost loop, where std::unordered_map's node
// chasing was the largest cost. Header-only; not thread-safe to write, safe to
// read from many threads once built.
#pragma once

#include <cstdint>
#include <vector>

namespace trainerd::engine::tokenizer {

struct Merge {
  uint32_t rank;   // lower merges first
  int32_t new_id;  // the id of the merged token
};

class MergeTable {
 public:
  // Adds or replaces the merge of ids (a, b), both >= 0.
  void Put(int32_t a, int32_t b, Merge merge) {
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    Slot* slot = Probe(Key(a, b));
    if (slot->key == kEmpty) {
      slot->key = Key(a, b);
      ++size_;
    }
    slot->merge = merge;
  }

  // The merge of (a, b), or null.
  const Merge* Find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const Slot* slot = const_cast<MergeTable*>(this)->Probe(Key(a, b));
    return slot->key == kEmpty ? nullptr : &slot->merge;
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of ids >= 0 has this key
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };

  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // The slot holding `key`, or the empty slot where it would go.
  Slot* Probe(uint64_t key) {
    uint64_t h = key;  // splitmix64's finaliser
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == key || slots_[i].key == kEmpty) return &slots_[i];
    }
  }
  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
    for (const Slot& s : old) {
      if (s.key != kEmpty) *Probe(s.key) = s;
    }
  }

  std::vector<Slot> slots_;  // size a power of two
  size_t size_ = 0;
};

}  // namespace trainerd::engine::tokenizer
