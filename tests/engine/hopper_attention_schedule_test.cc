// engine/kernels/hopper_attention_schedule.h: the attention backward's
// blocks ("slots") and their steps, on the CPU. Over shapes like the 8b row's
// and with tails (a sequence not a multiple of 64 or 128, an odd number of
// (sequence, kv head) groups, an odd number of key tiles, one key tile):
// every (sequence, kv head, key tile) is one slot's segment exactly once,
// every segment walks each of its (query head, query tile) steps exactly once
// in the documented order, and the slots' steps are equal (the waves even).
#include "engine/kernels/hopper_attention_schedule.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace trainerd {
namespace {

using kernels::BackwardSegment;
using kernels::BackwardShape;
using kernels::BackwardStep;

struct Case {
  int batch, kv_heads, group, seq;
};

std::string Name(const Case& c) {
  return std::to_string(c.batch) + " x " + std::to_string(c.seq) + ", " + std::to_string(c.kv_heads) +
         " kv heads of " + std::to_string(c.group);
}

BackwardShape ShapeOf(const Case& c) { return {c.batch, c.kv_heads, c.group, (c.seq + 63) / 64}; }

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {4, 8, 4, 2048},  // the 8b row
      {8, 8, 4, 2048},  // 8b-ckpt's micro-batch of 8
      {2, 2, 4, 300},   // key tiles 3 (odd), the last query tile partial
      {3, 1, 8, 300},   // groups 3 (odd) with key tiles 3: the middle keys alone
      {1, 1, 4, 512},   // one group: paired with itself
      {1, 3, 2, 640},   // groups 3, key tiles 5
      {2, 4, 1, 77},    // one key tile, no grouping
      {5, 1, 1, 129},   // 129 tokens: 3 query tiles, 2 key tiles
      {1, 8, 4, 8192},  // one long sequence
  };
  return cases;
}

TEST(HopperAttentionSchedule, EverySegmentOnceAndEveryStepOnce) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Name(c));
    const BackwardShape shape = ShapeOf(c);
    const int kv_tiles = kernels::BackwardKvTiles(shape);
    ASSERT_EQ(kv_tiles, (c.seq + 127) / 128);
    std::set<std::tuple<int, int, int>> seen;  // (batch, kv head, key tile)
    for (int slot = 0; slot < kernels::BackwardSlots(shape); ++slot) {
      int count = 0;
      kernels::SegmentOf(slot, 0, shape, &count);
      ASSERT_TRUE(count == 1 || count == 2) << "slot " << slot;
      for (int m = 0; m < count; ++m) {
        const BackwardSegment seg = kernels::SegmentOf(slot, m, shape, &count);
        ASSERT_TRUE(seg.batch >= 0 && seg.batch < c.batch && seg.kv_head >= 0 && seg.kv_head < c.kv_heads &&
                    seg.j >= 0 && seg.j < kv_tiles)
            << "slot " << slot << " segment " << m;
        EXPECT_TRUE(seen.insert({seg.batch, seg.kv_head, seg.j}).second)
            << "slot " << slot << " repeats batch " << seg.batch << " kv head " << seg.kv_head << " keys " << seg.j;
        EXPECT_EQ(seg.first_i, 2 * seg.j);
        EXPECT_EQ(seg.steps, c.group * (shape.q64_tiles - seg.first_i));
        EXPECT_EQ(seg.upwards, m == 1) << "the first segment downwards, the second upwards";
        // The steps: each (query head, tile at or past the keys) once, the
        // group's heads inside a tile, tiles downwards or upwards.
        std::set<std::pair<int, int>> steps;
        BackwardStep step(seg, shape.q64_tiles);
        int previous_i = -1;
        for (int n = 0; n < seg.steps; ++n, step.Next(seg, c.group)) {
          ASSERT_TRUE(step.hh >= 0 && step.hh < c.group && step.i >= seg.first_i && step.i < shape.q64_tiles)
              << "step " << n << ": head " << step.hh << " tile " << step.i;
          EXPECT_TRUE(steps.insert({step.hh, step.i}).second);
          EXPECT_EQ(step.hh, n % c.group);
          if (step.hh == 0 && previous_i >= 0) EXPECT_EQ(step.i, previous_i + (seg.upwards ? 1 : -1));
          if (step.hh == 0) previous_i = step.i;
        }
        EXPECT_EQ(static_cast<int>(steps.size()), seg.steps);
      }
    }
    EXPECT_EQ(static_cast<int>(seen.size()), c.batch * c.kv_heads * kv_tiles) << "every key tile of every group";
  }
}

// Every slot has the same steps, but a lone middle segment (an odd group
// count with an odd number of key tiles); the slots of a pair of groups are
// consecutive, so that they are launched together.
TEST(HopperAttentionSchedule, SlotsAreEvenAndPairsTogether) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Name(c));
    const BackwardShape shape = ShapeOf(c);
    const int kv_tiles = kernels::BackwardKvTiles(shape);
    const int even = c.group * (2 * shape.q64_tiles - 2 * kv_tiles + 2);
    int lone = 0;
    std::map<int, std::pair<int, int>> pair_slots;  // first group of the pair: first and last slot
    for (int slot = 0; slot < kernels::BackwardSlots(shape); ++slot) {
      int count = 0, steps = 0;
      const BackwardSegment first = kernels::SegmentOf(slot, 0, shape, &count);
      for (int m = 0; m < count; ++m) steps += kernels::SegmentOf(slot, m, shape, &count).steps;
      if (count == 1) {
        ++lone;
        EXPECT_EQ(2 * first.j, kv_tiles - 1) << "only the middle keys run alone";
      } else {
        EXPECT_EQ(steps, even) << "slot " << slot;
      }
      const int group = first.batch * c.kv_heads + first.kv_head;
      auto it = pair_slots.emplace(group, std::make_pair(slot, slot)).first;
      it->second.second = slot;
    }
    EXPECT_EQ(lone, (c.batch * c.kv_heads) % 2 == 1 && kv_tiles % 2 == 1 ? 1 : 0);
    for (const auto& [group, slots] : pair_slots) {
      EXPECT_LE(slots.second - slots.first + 1, kv_tiles) << "group " << group << "'s slots are consecutive";
    }
  }
}

}  // namespace
}  // namespace trainerd
