// LoRA dropout (PEFT's lora_dropout: y = W x + s B A dropout(x), every module
// with a mask of its own) whose masks are functions of one draw of the
// generator per forward pass: mask m of a draw is Philox of (seed, offset + m,
// element / 8), 16 bits an element (engine/kernels/philox.h), made wherever it is needed and never
// stored. So a backward makes a module's mask again instead of keeping it,
// activation checkpointing's second forward draws the same masks by being
// given the same draw, and a CUDA graph of a step replays with new masks each
// time (on CUDA the draw is the generator's graph-safe state).
//
// Every mask of every module of a forward pass comes from one draw: module j
// of decoder layer i is mask 7 i + j (DecoderLayer::Modules' order).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "engine/kernels/fused_kernels.h"

namespace trainerd::engine {

struct DropoutDraw {
  // CUDA: the default generator's Philox state (seed, offset) or, while a CUDA
  // graph is being recorded, where each replay finds them. CPU: a seed drawn
  // from the default CPU generator, offset 0.
  kernels::PhiloxState philox;
  int64_t masks = 0;  // how many masks the draw covers; 0: no draw
  bool defined() const { return masks > 0; }
};

// A draw of `masks` masks (> 0) from the default generator of `device`. Both
// generators are seeded by the job's seed and saved with checkpoints, so
// draws repeat exactly on resume.
DropoutDraw NewDropoutDraw(const torch::Device& device, int64_t masks);

// A draw as plain integers (an autograd node's saved data), and back.
std::vector<int64_t> DropoutDrawToInts(const DropoutDraw& draw);
DropoutDraw DropoutDrawFromInts(const std::vector<int64_t>& ints);

// Which mask of which draw a LoRA module applies, and its probability p.
struct LoraDropoutMask {
  const DropoutDraw* draw = nullptr;
  int64_t mask = 0;
  double p = 0;
  bool active() const { return draw != nullptr && draw->defined() && p > 0; }
};

// The masks of a module or group of modules in a forward pass: the pass's
// draw (none: no dropout, as in evaluation) and the number of its first
// module's mask; module i of the group takes mask first + i.
struct DropoutMasks {
  const DropoutDraw* draw = nullptr;
  int64_t first = 0;
  // Module i's mask for its dropout probability p (inactive where p is 0).
  LoraDropoutMask Of(int64_t i, double p) const { return {draw, first + i, p}; }
};

// Mask `m.mask` of a (rows, cols) matrix: 1 where an element is kept, 0 where
// it is dropped, with `options`' dtype and device.
torch::Tensor DropoutKeepMask(const LoraDropoutMask& m, int64_t rows, int64_t cols,
                              const torch::TensorOptions& options);

// x (rows, cols) dropped by mask m as LibTorch ops, x * mask * scale with
// scale = 1 / (1 - p), differentiated by autograd (the backward multiplies by
// the same mask): the plain path's dropout (Linear::Forward) and what the
// kernel computes.
torch::Tensor PlainDropoutRows(const torch::Tensor& x, const LoraDropoutMask& m);

// x (rows, cols) dropped by mask m: T(x * scale) where kept, 0 where dropped
// (PlainDropoutRows, bit for bit; on the kernel where it applies). A new dense
// tensor; not differentiated (for nodes that write their own backward).
torch::Tensor DropoutRows(const torch::Tensor& x, const LoraDropoutMask& m);

// acc (rows, cols) += DropoutRows(v, m), in place, without the temporary.
void AddDropoutRows(torch::Tensor& acc, const torch::Tensor& v, const LoraDropoutMask& m);

// The backward of a module's dropout_m(x) A^T, both terms through mask m:
// acc (rows, cols) += DropoutRows(u a, m) (the input gradient's term; u
// (rows, rank), a (rank, cols)), and DropoutRows(x, m) returned (what the A
// gradient u^T dropout(x) multiplies). On the kernel where it applies, in one
// pass that makes the mask once (u a summed in float32 and rounded to the
// dtype, as the thin GEMM writes it, its sum order aside); else as
// AddDropoutRows(acc, u a, m) and DropoutRows(x, m).
torch::Tensor LoraDropoutBackward(const torch::Tensor& x, const torch::Tensor& u, const torch::Tensor& a,
                                  torch::Tensor& acc, const LoraDropoutMask& m);

}  // namespace trainerd::engine
