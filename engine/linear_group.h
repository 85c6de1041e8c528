// Linear layers of the decoder that read the same input (q|k|v, gate|up, and
// o or down alone), run as one GEMM with their LoRA updates inside it, for
// LoRA fine-tuning (frozen base weights).
//
// The group keeps its members' frozen weights in one widened matrix
//   widened = [ W_1 | s_1 B_1            ]   (sum out_i, in + cols), and the
//             [ W_2 |        s_2 B_2     ]   A rows below for a group wider
//             [ ... |               ...  | 0 ]   in than out (see below)
// whose first `in` columns are the weights stacked by rows (each member's
// `weight` is a view of its rows) and whose last `cols` columns hold every
// LoRA member's scaled B, block-diagonal, padded with zeros to a multiple of 8
// (rows stay 16-byte aligned). The input is widened the same way,
// x_ext = [x | x A^T | 0] with A = [A_1; A_2; ...], so that
//   y = x_ext widened^T = [x W_i^T + s_i (x A_i^T) B_i^T]_i
// is one GEMM: the LoRA terms cost a few more columns of the frozen product
// instead of a pass over each (N, out_i) output, and in the backward
// g widened = [g W | s g B] gives the input gradient and the LoRA term's
// u = s g B from one GEMM too. B is the float32 parameter (PEFT's master
// copy); its scaled model-dtype copy in `widened` is a cache, never the
// source of truth, written again whenever B changed (LoraCopies below).
//
// A group whose input is wider than its output (down: 14336 in, 4096 out)
// also keeps the A's (model-dtype copies, cached the same way) in
// rows below the weights, [W | sB ; A | 0], so that its input gradient
// [g | u] [W ; A] = g W + u A is one GEMM too (u first, from g and sB),
// instead of an (N, in) pass adding u A afterwards.
//
// An input with no spare columns after its rows (attention's output, for o)
// is not copied into a widened buffer: the thin LoRA product s (x A^T) B^T
// comes first, and the frozen GEMM adds x W^T onto it (beta 1).
//
// LoRA dropout runs on the node too: only the thin LoRA products see the
// masks, made again from the forward pass's draw (engine/lora_dropout.h).
//
// Where the node does not apply (weights that need gradients, a group not
// widened), each member's Linear::Forward runs and
// autograd does the rest. Same products in the model dtype as Forward, with
// the scaling folded into B's copy; sums may be ordered differently.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "engine/linear.h"
#include "engine/lora_dropout.h"

namespace trainerd::engine {

struct LinearGroup {
  torch::Tensor widened;       // (sum out_i + a_rows, in + cols) in the model dtype; undefined until Widen
  torch::Tensor bias;          // (sum out_i) when a member has a bias (zeros for the others)
  int64_t in = 0;              // the members' input width
  int64_t cols = 0;            // the B columns, padding included
  int64_t a_rows = 0;          // the A rows below the weights, padding included (0: none)
  std::vector<int64_t> outs;   // per member: its rows
  std::vector<int64_t> ranks;  // per member: its LoRA rank, 0 without LoRA
  // The input gradient dense (N, in) rather than the left part of the
  // backward's (N, in + cols) product: for an input whose producer would copy
  // a strided gradient (attention's backward, for o). Costs a thin product
  // for the LoRA term's u, which otherwise comes out of the same GEMM; u A is
  // made first and g W added onto it by the GEMM (beta 1).
  bool dense_input_gradient = false;

  // The columns a producer of this group's input may leave after each row
  // (FusedRmsNorm, FusedSwiGlu) so that the node widens the input in place.
  int64_t spare_columns() const { return widened.defined() ? cols : 0; }
  // The columns a producer of this group's output gradient may leave after
  // each row (FusedAddRmsNorm's backward, for down) so that the backward's
  // [g | u] is g's own buffer: a group with A rows only.
  int64_t gradient_spare_columns() const { return widened.defined() ? a_rows : 0; }

  // The model-dtype copies of the LoRA parameters that the node's GEMMs read:
  // each member's s_i B_i in its block of `widened`, and the A's stacked in
  // `a_stacked` (rank, in), or in the A rows where the group keeps them. They
  // are written again only when a parameter changed since: another tensor,
  // another storage, or a new version (every in-place update, the
  // optimizer's included, bumps the counter), or another scaling.
  // RefreshLoraCopies writes those of many groups in one launch, and a
  // forward writes whatever is still out of date.
  struct LoraCopies {
    struct Source {
      // The parameters themselves, held so that a freed one's address cannot
      // come back as a new tensor that looks the same.
      torch::Tensor a, b;
      const void* a_data = nullptr;
      const void* b_data = nullptr;
      int64_t a_version = -1, b_version = -1;
      double scaling = 0;
      bool operator==(const Source& o) const {
        return a.is_same(o.a) && b.is_same(o.b) && a_data == o.a_data && b_data == o.b_data &&
               a_version == o.a_version && b_version == o.b_version && scaling == o.scaling;
      }
    };
    std::vector<Source> written;  // per LoRA member, what its copies hold; empty: nothing yet
    // (rank, in) in the model dtype: a tensor of its own, or a view of the A
    // rows. Set by Widen, with the per-member views the copies are written to:
    // a_blocks[i] (rank_i, in) of it, b_blocks[i] (out_i, rank_i) of `widened`.
    torch::Tensor a_stacked;
    std::vector<torch::Tensor> a_blocks, b_blocks;
  };
  mutable LoraCopies lora_copies;
};

// A group and its member modules, in the group's order.
struct GroupMembers {
  const LinearGroup* group = nullptr;
  std::vector<const Linear*> members;
};

// How a group's input x (N, in) was made from tensors its producer keeps for
// its own backward anyway. The node needs x in the backward only for the LoRA
// A gradients u^T x; given a recipe it keeps what x is made from instead of x
// (activation memory: the (N, in) input is freed with the forward).
//   RMSNorm: x = weight * (norm_input * rstd) by rows (FusedRmsNorm), so
//     u^T x = ((rstd u)^T norm_input) weight: no x at all, and no extra pass.
//   SwiGLU: x = silu(gate) * up (FusedSwiGlu), made again in the backward: one
//     elementwise pass over (N, in) for the memory of x.
// Neither, or a recipe whose shapes do not fit x: the node keeps x.
struct InputRecipe {
  torch::Tensor norm_input;   // (..., in), the normalised rows
  torch::Tensor norm_rstd;    // (N) float32, their 1/rms
  torch::Tensor norm_weight;  // (in)
  torch::Tensor gate, up;     // (..., in) each
};

// Moves `members`' weights (and biases) into group.widened (group.bias): each
// member's weight (bias) becomes a view of its rows. The members' LoRA, as
// attached now, lays out the B columns. Frees the members' separate weights.
// Resets the group (dense_input_gradient too).
void Widen(LinearGroup& group, const std::vector<Linear*>& members);

// Brings the LoRA copies (LinearGroup::LoraCopies) of every widened group
// listed up to date with its members' parameters: all out-of-date copies of
// all of them in one batch of casts (FusedScaledCasts: one launch per 48 on
// CUDA), rather than a few small launches per group in each forward. Call it
// before a forward, after the optimizer has stepped; skipping it costs speed
// only, since each forward checks its own group.
void RefreshLoraCopies(const std::vector<GroupMembers>& groups);

// SwiGLU's output asked of a gate|up group's GEMM (two members of equal width,
// gate's then up's; engine/epilogue_gemm.h, GateUpWithSwiGlu): where the
// GEMM of our own takes it, h is silu(gate) * up (N, f) in rows f +
// spare_columns wide, for FusedSwiGlu's `made`; else undefined.
//
// At SwiGLU level 3 (engine/epilogue_gemm.h), a node with LoRA on gate or up
// and no dropout also hands down's node what LoRA's products in down's
// backward need (SwiGluInput): its t = x [A_gate ; A_up]^T (N, rank_gate +
// rank_up) and a float32 buffer (rank_gate + rank_up, f) for gate's and up's
// B gradients, transposed and unscaled, which down's backward fills and this
// node's backward then reads instead of a product over its output gradient.
// lora_b_filled (a CPU int64 scalar) says whether it did: only then does
// gate|up's backward read the buffer (a path that does not fill it, such as
// a product the GEMM declines, costs gate|up its own product, as at level 2).
struct SwiGluOutput {
  int64_t spare_columns = 0;
  torch::Tensor h;
  torch::Tensor lora_t, lora_b_sums, lora_b_filled;  // undefined: none handed on
  int64_t rank_gate = 0, rank_up = 0;
  // In, optional: down's LoRA A's stacked (CurrentLoraA of the down group),
  // for the GEMM to make down's t = h A^T into h's spare columns as well
  // (GateUpWithSwiGlu's down_a); out: whether it did.
  torch::Tensor down_a;
  bool down_t_made = false;
};

// SwiGLU's backward taken into down's node (engine/epilogue_gemm.h): x is h =
// silu(gate) * up, made outside autograd, and gate and up (the gate|up
// group's outputs) are the node's differentiable inputs in its place: its
// backward returns their gradients, from its input gradient dh (in the
// GEMM's epilogue where the GEMM of our own takes it, else by
// SwiGluGradients), and none for x. A node that runs its members one by one
// makes x again with autograd from gate and up instead.
//
// With gate|up's LoRA handed on (SwiGluOutput's lora_*), the node's backward
// fills lora_b_sums = [t_gate^T dgate ; t_up^T dup] where its GEMM's
// epilogue takes them (level 3), and then sets lora_b_filled. At level 3 the
// node also takes its own A gradient u^T h from that epilogue.
//
// lora_t_made: x's rows hold the node's t = x A^T in their first spare
// columns already (gate|up's GEMM made it, SwiGluOutput::down_t_made), which
// the node then takes as they are; it makes t itself where x is not in such
// rows or its LoRA has dropout.
struct SwiGluInput {
  torch::Tensor gate, up;
  torch::Tensor lora_t, lora_b_sums, lora_b_filled;
  int64_t rank_gate = 0, rank_up = 0;
  bool lora_t_made = false;
};

// The rotary embedding asked of a q|k|v group's product (engine/
// epilogue_gemm.h, RopeGemmEnabled): its first rotated_heads heads of
// head_dim columns (q's, then k's) rotated by the positions' angles, as
// FusedQkvRope rotates them. The widened node then returns its outputs
// rotated (in its GEMM's epilogue where ProductWithRope takes the product,
// else by RotateHeadsInPlace over it) and sets `done`; its backward takes
// the rotation's first (QkvRopeGradient: the output gradient rotated back
// into one buffer, as FusedQkvRope's backward writes it), unless
// `gradient_rotated_back`: the caller's promise that the outputs' consumer
// hands their gradients back rotated back already (attention of our own,
// engine/hopper_attention.h), which the backward then takes as they come. A
// node that runs its members one by one leaves `done` false: the caller
// rotates.
struct QkvRope {
  torch::Tensor positions;  // (N) int64, a row's position
  torch::Tensor inv_freq;   // (head_dim / 2) float32
  int64_t head_dim = 0;
  int64_t rotated_heads = 0;
  bool gradient_rotated_back = false;
  bool done = false;
};

// Each member applied to x (..., in): their outputs (..., out_i) in order, as
// Linear::Forward gives them. On the widened node the outputs are column views
// of one (N, sum out_i) product (row stride sum out_i); `recipe` says how x was
// made, if the node may keep that instead of x (ignored elsewhere). `dropout`:
// the pass's draw (training) and member 0's mask number; member i's LoRA
// dropout takes mask dropout.first + i. swiglu: SwiGLU's output asked too.
// swiglu_input: x is SwiGLU's output of these, whose backward the node takes.
// rope: the rotary embedding asked of the product (QkvRope).
std::vector<torch::Tensor> ForwardGroup(const LinearGroup& group, const std::vector<const Linear*>& members,
                                        const torch::Tensor& x, const InputRecipe& recipe = {},
                                        const DropoutMasks& dropout = {}, SwiGluOutput* swiglu = nullptr,
                                        const SwiGluInput* swiglu_input = nullptr, QkvRope* rope = nullptr);
inline std::vector<torch::Tensor> ForwardGroup(const GroupMembers& group, const torch::Tensor& x,
                                               const InputRecipe& recipe = {}, const DropoutMasks& dropout = {},
                                               SwiGluOutput* swiglu = nullptr,
                                               const SwiGluInput* swiglu_input = nullptr, QkvRope* rope = nullptr) {
  return ForwardGroup(*group.group, group.members, x, recipe, dropout, swiglu, swiglu_input, rope);
}

// The group's LoRA A's stacked, (sum of ranks, in) in the model dtype: the
// copies its widened node's forward reads, brought up to date with the
// members' parameters first (as that forward would). Undefined where the
// group has no LoRA or does not run as a widened node (WidenedLayoutFits).
torch::Tensor CurrentLoraA(const GroupMembers& group);

}  // namespace trainerd::engine
