// Where the attention backward's dQ tiles complete, block by block, under the
// schedule of engine/kernels/hopper_attention_schedule.h: a model for a
// conversion of dQ inside the backward (bench/speed/NOTES.md, "dQ converted
// inside the backward"), where the block whose step adds a tile's last sums
// converts it. Every block runs its steps in lockstep from the same start
// (one step a unit of time); a tile's contributions that arrive at the same
// time finish in a random order (seeded), the last one completing it. Prints
// how many tiles each block completes and the most that one block completes
// within a window of consecutive steps. Host code only:
//   g++ -O2 -std=c++17 -I. -o /tmp/dq_completions bench/attention/dq_completions.cc
//   /tmp/dq_completions [batch kv_heads group q64_tiles]   (default: the 8b row, 4 8 4 32)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "engine/kernels/hopper_attention_schedule.h"

namespace {

using trainerd::kernels::BackwardSegment;
using trainerd::kernels::BackwardShape;
using trainerd::kernels::BackwardSlots;
using trainerd::kernels::BackwardStep;
using trainerd::kernels::SegmentOf;

// The most entries of sorted `steps` within any `window` consecutive steps.
int MostInWindow(const std::vector<int>& steps, int window) {
  int most = 0;
  for (size_t a = 0, b = 0; a < steps.size(); ++a) {
    while (b < steps.size() && steps[b] - steps[a] < window) ++b;
    most = std::max(most, static_cast<int>(b - a));
  }
  return most;
}

}  // namespace

int main(int argc, char** argv) {
  BackwardShape shape{4, 8, 4, 32};
  if (argc == 5) {
    shape = {std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4])};
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [batch kv_heads group q64_tiles]\n", argv[0]);
    return 2;
  }
  if (shape.batch < 1 || shape.kv_heads < 1 || shape.group < 1 || shape.q64_tiles < 1) {
    std::fprintf(stderr, "every dimension must be at least 1\n");
    return 2;
  }
  const int slots = BackwardSlots(shape);
  std::mt19937 random(1);
  std::uniform_real_distribution<double> jitter(0.0, 0.5);
  // (sequence, head, query tile) -> its last contribution: (time, slot, step).
  std::map<std::tuple<int, int, int>, std::tuple<double, int, int>> last;
  for (int slot = 0; slot < slots; ++slot) {
    int segments = 0, n = 0;
    SegmentOf(slot, 0, shape, &segments);
    for (int m = 0; m < segments; ++m) {
      const BackwardSegment seg = SegmentOf(slot, m, shape, &segments);
      BackwardStep step(seg, shape.q64_tiles);
      for (int k = 0; k < seg.steps; ++k, ++n, step.Next(seg, shape.group)) {
        const auto tile = std::make_tuple(seg.batch, seg.kv_head * shape.group + step.hh, step.i);
        const auto at = std::make_tuple(n + jitter(random), slot, n);
        auto [it, inserted] = last.emplace(tile, at);
        if (!inserted && std::get<0>(at) > std::get<0>(it->second)) it->second = at;
      }
    }
  }
  std::vector<std::vector<int>> completed(slots);
  for (const auto& [tile, at] : last) completed[std::get<1>(at)].push_back(std::get<2>(at));
  size_t fewest = last.size(), most = 0;
  for (auto& steps : completed) {
    std::sort(steps.begin(), steps.end());
    fewest = std::min(fewest, steps.size());
    most = std::max(most, steps.size());
  }
  std::printf("shape: batch %d, kv heads %d, group %d, %d query tiles of 64: %d blocks, %zu tiles\n", shape.batch,
              shape.kv_heads, shape.group, shape.q64_tiles, slots, last.size());
  std::printf("tiles a block completes: fewest %zu, mean %.1f, most %zu\n", fewest,
              static_cast<double>(last.size()) / slots, most);
  for (int window : {4, 8, 16, 32}) {
    int worst = 0;
    for (const auto& steps : completed) worst = std::max(worst, MostInWindow(steps, window));
    std::printf("most tiles one block completes within %d consecutive steps: %d\n", window, worst);
  }
  return 0;
}
