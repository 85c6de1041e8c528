// The Hopper attention backward's schedule (hopper_attention.cu): which
// blocks ("slots") run which segments, and each segment's steps in order.
// Host and device code without CUDA headers: the kernel walks it, the CPU
// tests (tests/engine/hopper_attention_schedule_test.cc) check that it covers
// every (sequence, kv head, 128 keys) once with every step once.
//
// A segment is one kv head's 128 keys j of one sequence (a "group": its query
// heads share the keys) over the 64-row query tiles from the keys' own on:
// group * (q64 tiles - 2 j) steps, each one query head's tile, the group's
// heads inside a tile. A slot runs two segments: keys j of one group with its
// tiles downwards, then keys kv_tiles - 1 - j of the next group with its tiles
// upwards. Why:
// - every slot has the same steps (group * (2 q64 tiles - 2 kv_tiles + 2)),
//   so the slots fill the SMs in even waves, whatever their order;
// - the slots of a pair of groups are launched together (slot number: pairs
//   outermost), so their first segments start together and their second
//   ones end together: downwards from the same start, or upwards to the same
//   end, all of a group's segments reach a query tile at about the same
//   time, and the tile's dQ sums, Q and dO stay in L2 while its keys' blocks
//   add onto them (blocks of a tile hundreds of microseconds apart sent each
//   step's sums to DRAM and back: bench/speed/NOTES.md, "The backward's order").
// An odd group count leaves the last group paired with itself (j with
// kv_tiles - 1 - j; the middle keys alone where kv_tiles is odd).
#pragma once

#ifdef __CUDACC__
#define TRAINERD_SCHEDULE_FN __host__ __device__ __forceinline__
#else
#define TRAINERD_SCHEDULE_FN inline
#endif

namespace trainerd::kernels {

constexpr int kScheduleKeys = 128;    // keys a segment (the backward's K and V tile)
constexpr int kScheduleQueries = 64;  // query rows a step

// The launch's shape as the schedule needs it.
struct BackwardShape {
  int batch, kv_heads;
  int group;      // query heads a kv head
  int q64_tiles;  // 64-row query tiles a sequence (the last may be partial)
};

struct BackwardSegment {
  int batch, kv_head, j, first_i, steps;
  bool upwards;
};

// 128-key tiles a sequence.
TRAINERD_SCHEDULE_FN int BackwardKvTiles(const BackwardShape& s) { return (s.q64_tiles + 1) / 2; }

// The launch's blocks.
TRAINERD_SCHEDULE_FN int BackwardSlots(const BackwardShape& s) {
  const int groups = s.batch * s.kv_heads, kv_tiles = BackwardKvTiles(s);
  return groups / 2 * kv_tiles + groups % 2 * ((kv_tiles + 1) / 2);
}

// Segment m (0 or 1) of a slot, and how many the slot has (*count: 1 only for
// the middle keys of a group paired with itself). Computed where used rather
// than kept in an array, which a run-time index would put in local memory.
TRAINERD_SCHEDULE_FN BackwardSegment SegmentOf(int slot, int m, const BackwardShape& s, int* count) {
  const int groups = s.batch * s.kv_heads, kv_tiles = BackwardKvTiles(s);
  const int paired = groups / 2 * kv_tiles;
  const bool alone = slot >= paired;  // the last of an odd number of groups
  const int p = alone ? slot - paired : slot % kv_tiles;
  const int first_group = alone ? groups - 1 : 2 * (slot / kv_tiles);
  *count = alone && kv_tiles - 1 - p == p ? 1 : 2;
  const int group = m == 0 || alone ? first_group : first_group + 1;
  BackwardSegment seg;
  seg.batch = group / s.kv_heads;
  seg.kv_head = group % s.kv_heads;
  seg.j = m == 0 ? p : kv_tiles - 1 - p;
  seg.first_i = seg.j * (kScheduleKeys / kScheduleQueries);
  seg.steps = s.group * (s.q64_tiles - seg.first_i);
  seg.upwards = m == 1;
  return seg;
}

// A segment's steps in order: query head hh of the group and 64-row query
// tile i, advanced one step at a time (no division a step).
struct BackwardStep {
  int hh, i;
  TRAINERD_SCHEDULE_FN BackwardStep(const BackwardSegment& seg, int q64_tiles)
      : hh(0), i(seg.upwards ? seg.first_i : q64_tiles - 1) {}
  TRAINERD_SCHEDULE_FN void Next(const BackwardSegment& seg, int group) {
    if (++hh == group) hh = 0, i += seg.upwards ? 1 : -1;
  }
};

}  // namespace trainerd::kernels

#undef TRAINERD_SCHEDULE_FN
