#include "engine/linear_group.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/epilogue_gemm.h"
#include "engine/fused_ops.h"
#include "engine/lora_dropout.h"

namespace trainerd::engine {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// B columns are padded to a multiple of this: rows of the widened matrix and
// input stay 16-byte aligned in 16-bit dtypes (cuBLAS's fast paths).
constexpr int64_t kColumnAlignment = 8;

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// (N, in + cols) view of x's buffer when x (N, in) is the left part of rows
// `in + cols` apart that the buffer holds in full (a producer left the room:
// LinearGroup::spare_columns); undefined otherwise.
torch::Tensor WidenedView(const torch::Tensor& x, int64_t in, int64_t cols) {
  const int64_t row = in + cols;
  if (cols == 0 || x.dim() != 2 || x.size(1) != in || x.stride(1) != 1 || x.stride(0) != row) return {};
  const int64_t needed = (x.storage_offset() + x.size(0) * row) * static_cast<int64_t>(x.element_size());
  if (static_cast<int64_t>(x.storage().nbytes()) < needed) return {};
  // Through detach: the node writes the spare columns, which autograd does
  // not track (nothing reads them but this node).
  return x.detach().as_strided({x.size(0), row}, {row, 1});
}

// [left | right | 0] (N, width): one concatenation, which writes whole rows
// at copy bandwidth, where a copy into the left part of wider rows runs at
// about a third of it. right (N, r) with r <= width - left's columns.
torch::Tensor ConcatPadded(const torch::Tensor& left, const torch::Tensor& right, int64_t width) {
  std::vector<torch::Tensor> parts{left, right};
  const int64_t pad = width - left.size(1) - right.size(1);
  if (pad > 0) parts.push_back(torch::zeros({left.size(0), pad}, left.options()));
  return torch::cat(parts, 1);
}

using LoraSource = LinearGroup::LoraCopies::Source;

// Appends to `casts` the copies that bring the group's LoRA copies up to date
// with `lora` (A_1, B_1, A_2, B_2, ... of the LoRA members) and `scaling` (per
// member), and returns what the copies hold once they are done.
std::vector<LoraSource> StaleLoraCasts(const LinearGroup& group, at::TensorList lora,
                                       const std::vector<double>& scaling, std::vector<ScaledCast>* casts) {
  const LinearGroup::LoraCopies& copies = group.lora_copies;
  std::vector<LoraSource> now;
  size_t j = 0;
  for (size_t i = 0; i < group.outs.size(); ++i) {
    if (group.ranks[i] == 0) continue;
    const torch::Tensor& a = lora[j];
    const torch::Tensor& b = lora[j + 1];
    const LoraSource source{a, b, a.data_ptr(), b.data_ptr(), a._version(), b._version(), scaling[i]};
    const size_t member = now.size();
    if (member >= copies.written.size() || !(copies.written[member] == source)) {
      casts->push_back({a, copies.a_blocks[member], 1.0});
      casts->push_back({b, copies.b_blocks[member], scaling[i]});
    }
    now.push_back(source);
    j += 2;
  }
  return now;
}

// The group's LoRA copies up to date, in this forward if need be.
void EnsureLoraCopies(const LinearGroup& group, at::TensorList lora, const std::vector<double>& scaling) {
  std::vector<ScaledCast> casts;
  std::vector<LoraSource> now = StaleLoraCasts(group, lora, scaling, &casts);
  if (!casts.empty()) FusedScaledCasts(casts);
  group.lora_copies.written = std::move(now);
}

// The LoRA parameters of `members` (A_1, B_1, A_2, B_2, ...) and each
// member's scaling (0 without LoRA) and, if asked for, its dropout
// probability (0 without LoRA).
void LoraOf(const std::vector<const Linear*>& members, std::vector<torch::Tensor>* lora,
            std::vector<double>* scaling, std::vector<double>* dropout = nullptr) {
  for (const Linear* l : members) {
    scaling->push_back(l->lora ? l->lora->scaling : 0.0);
    if (dropout != nullptr) dropout->push_back(l->lora ? l->lora->dropout : 0.0);
    if (l->lora) {
      lora->push_back(l->lora->a);
      lora->push_back(l->lora->b);
    }
  }
}

// y_i = x W_i^T (+ bias_i) + s_i (x A_i^T) B_i^T for every member i, as one
// GEMM of the widened input and matrix (see the header). Inputs: x (N, in),
// then the LoRA members' A and B, in member order; the group (widened
// matrix, stacked bias, layout), the members' scalings and x's recipe
// (InputRecipe; its tensors are the producer's, not differentiated here).
//
// With LoRA dropout (a draw, and members with p > 0), a member's x A_i^T is
// dropout_i(x) A_i^T, its A gradient u_i^T dropout_i(x), and its input
// gradient term dropout_i(u_i A_i), each mask made again from the draw
// (engine/lora_dropout.h). The widened GEMMs stay as they are: only the thin
// LoRA products see the masks. The node then keeps x (or SwiGLU's recipe,
// which makes x again), not the norm's recipe, and the input gradient's LoRA
// terms are added after the GEMM rather than inside it.
//
// With a QkvRope, the outputs are rotated (the GEMM's epilogue, or a pass in
// place over the product) and the backward rotates the output gradient back
// before its own work.
class WidenedGroupFunction : public torch::autograd::Function<WidenedGroupFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList lora,
                             const LinearGroup& group, const std::vector<double>& scaling,
                             const InputRecipe& recipe, const DropoutMasks& dropout,
                             const std::vector<double>& dropout_p, SwiGluOutput* swiglu,
                             at::TensorList swiglu_inputs, const SwiGluInput* swiglu_handoff, QkvRope* rope) {
    const int64_t n = x.size(0), in = group.in, cols = group.cols;
    const int64_t rank = Sum(group.ranks);
    bool any_dropout = false;
    for (size_t i = 0; i < dropout_p.size(); ++i) {
      any_dropout = any_dropout || (group.ranks[i] > 0 && dropout.Of(static_cast<int64_t>(i), dropout_p[i]).active());
    }
    // What the backward reads for the A gradients u^T x (none without LoRA).
    auto rows_of = [&](const torch::Tensor& r) {
      return r.defined() && r.numel() == n * in ? r.detach().reshape({n, in}) : torch::Tensor();
    };
    torch::Tensor norm_input, norm_rstd, norm_weight, gate, up;
    if (rank > 0) {
      const torch::Tensor normed_rows = rows_of(recipe.norm_input);
      const torch::Tensor gate_rows = rows_of(recipe.gate), up_rows = rows_of(recipe.up);
      if (!any_dropout && normed_rows.defined() && recipe.norm_rstd.defined() && recipe.norm_rstd.numel() == n &&
          recipe.norm_weight.defined() && recipe.norm_weight.numel() == in) {
        norm_input = normed_rows;
        norm_rstd = recipe.norm_rstd.detach().reshape({n});
        norm_weight = recipe.norm_weight.detach().reshape({in});
      } else if (gate_rows.defined() && up_rows.defined()) {
        gate = gate_rows;
        up = up_rows;
      }
    }
    const bool keep_x = rank > 0 && !norm_input.defined() && !gate.defined();
    // The A's stacked in the model dtype (rank, in), and each s_i B_i in its
    // block of the widened matrix: copies rewritten only when the parameters
    // changed (LinearGroup::LoraCopies). x A^T goes into the B columns of the
    // widened input.
    torch::Tensor a_cat, t;  // t = x A^T (N, rank)
    if (rank > 0) {
      EnsureLoraCopies(group, lora, scaling);
      a_cat = group.lora_copies.a_stacked;
    }
    // No LoRA member (cols 0): the stacked product of x as it is.
    torch::Tensor x_ext = cols == 0 ? x : WidenedView(x, in, cols);
    const bool in_place = x_ext.defined();
    const torch::Tensor top = group.widened.narrow(0, 0, Sum(group.outs));  // [W | sB | 0]
    torch::Tensor y;  // (N, sum out)
    bool rotated = false;  // y rotated by its GEMM's epilogue (QkvRope)
    // t = x A^T, each dropout member's columns from its dropped x.
    auto lora_product = [&](torch::Tensor& t_out) {
      if (!any_dropout) {
        at::mm_out(t_out, x, a_cat.t());
        return;
      }
      int64_t col = 0;
      for (size_t i = 0; i < group.ranks.size(); ++i) {
        if (group.ranks[i] == 0) continue;
        const LoraDropoutMask mask = dropout.Of(static_cast<int64_t>(i), dropout_p[i]);
        torch::Tensor t_i = t_out.narrow(1, col, group.ranks[i]);
        at::mm_out(t_i, mask.active() ? DropoutRows(x, mask) : x, a_cat.narrow(0, col, group.ranks[i]).t());
        col += group.ranks[i];
      }
    };
    if (in_place) {
      if (rank > 0) {
        t = x_ext.narrow(1, in, rank);
        // gate|up's GEMM made t into these columns (SwiGluInput::lora_t_made).
        const bool made = swiglu_handoff != nullptr && swiglu_handoff->lora_t_made && !any_dropout;
        if (!made) lora_product(t);
      }
      if (cols > rank) x_ext.narrow(1, in + rank, cols - rank).zero_();
      if (swiglu != nullptr && !group.bias.defined() && group.outs.size() == 2 && group.outs[0] == group.outs[1]) {
        y = GateUpWithSwiGlu(x_ext, top, swiglu->spare_columns, &swiglu->h, swiglu->down_a, &swiglu->down_t_made);
      }
      if (rope != nullptr && !group.bias.defined()) {
        y = ProductWithRope(x_ext, top, rope->positions, rope->inv_freq, rope->head_dim,
                            rope->rotated_heads * rope->head_dim);
        rotated = y.defined();
      }
      if (!y.defined()) {
        y = group.bias.defined() ? torch::addmm(group.bias, x_ext, top.t()) : torch::mm(x_ext, top.t());
      }
    } else {
      // No room left by the producer (attention's output, for o; cols > 0,
      // so rank > 0): the LoRA term first, t (sB)^T by a thin product, then
      // x W^T added onto it in the frozen GEMM's epilogue (beta 1), instead
      // of copying x into a widened buffer. The LoRA term is rounded to the
      // model dtype once more than in the widened product.
      t = torch::empty({n, rank}, x.options());
      lora_product(t);
      const torch::Tensor sb_t = top.narrow(1, in, rank).t();
      y = group.bias.defined() ? torch::addmm(group.bias, t, sb_t) : torch::mm(t, sb_t);
      y.addmm_(x, top.narrow(1, 0, in).t());
    }
    if (rope != nullptr) {
      if (!rotated) RotateHeadsInPlace(y, rope->rotated_heads, rope->head_dim, rope->positions, rope->inv_freq);
      rope->done = true;
      ctx->saved_data["rope_positions"] = rope->positions;
      ctx->saved_data["rope_inv_freq"] = rope->inv_freq;
      ctx->saved_data["rope_heads"] = rope->rotated_heads;
      ctx->saved_data["rope_head_dim"] = rope->head_dim;
      ctx->saved_data["rope_gradient_rotated_back"] = rope->gradient_rotated_back;
    }
    tensor_list outputs;
    int64_t row = 0;
    for (int64_t out : group.outs) {
      outputs.push_back(y.narrow(1, row, out));
      row += out;
    }
    // Kept for the backward: x itself where no recipe makes it, not the
    // widened copy (whoever else keeps x, attention for o's input, shares
    // it), else the recipe's tensors; and t = x A^T: a view of the producer's
    // buffer where x keeps that alive anyway, else its few columns of its
    // own, so that the widened input is freed with this forward.
    // Detached aliases: x may be a view of the producer's buffer, which this
    // forward just wrote (the spare columns); autograd refuses to rebuild the
    // history of a view made inside a custom Function (the fused kernels')
    // after its base changed in place, and saving x itself asks for it.
    const torch::Tensor t_kept = rank > 0 && in_place ? (keep_x ? t.detach() : t.clone()) : t;
    tensor_list saved{keep_x ? x.detach() : torch::Tensor(), t_kept,
                      a_cat, norm_input, norm_rstd, norm_weight, gate, up};
    for (const auto& t : lora) saved.push_back(t);
    // SwiGLU's inputs, whose gradients the backward returns (SwiGluInput).
    for (const auto& t : swiglu_inputs) saved.push_back(t);
    ctx->save_for_backward(saved);
    ctx->saved_data["swiglu_backward"] = !swiglu_inputs.empty();
    // SwiGLU level 3 (engine/epilogue_gemm.h): gate|up's t and a buffer for
    // its B gradients handed to down's node (SwiGluOutput), and down's node
    // told to take its A gradient from its input gradient's epilogue.
    const bool level3 = SwiGluGemmLevel(x.device(), x.scalar_type()) >= 3;
    if (level3 && swiglu != nullptr && rank > 0 && !any_dropout && group.outs.size() == 2 &&
        group.outs[0] == group.outs[1]) {
      swiglu->lora_t = t_kept;
      swiglu->rank_gate = group.ranks[0];
      swiglu->rank_up = group.ranks[1];
      swiglu->lora_b_sums = torch::empty({rank, group.outs[0]}, x.options().dtype(torch::kFloat32));
      swiglu->lora_b_filled = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64));
      ctx->saved_data["handed_b_sums"] = swiglu->lora_b_sums;
      ctx->saved_data["handed_b_filled"] = swiglu->lora_b_filled;
    }
    if (!swiglu_inputs.empty()) {
      ctx->saved_data["fused_a"] = level3 && rank > 0 && !any_dropout;
      if (swiglu_handoff != nullptr && swiglu_handoff->lora_b_sums.defined()) {
        ctx->saved_data["handoff_t"] = swiglu_handoff->lora_t;
        ctx->saved_data["handoff_b_sums"] = swiglu_handoff->lora_b_sums;
        ctx->saved_data["handoff_b_filled"] = swiglu_handoff->lora_b_filled;
        ctx->saved_data["handoff_ranks"] = std::vector<int64_t>{swiglu_handoff->rank_gate, swiglu_handoff->rank_up};
      }
    }
    // The widened matrix is rewritten by every forward (its B columns): kept
    // out of save_for_backward's version check; B does not change between a
    // forward and its backward (the optimizer steps after the backward).
    ctx->saved_data["widened"] = group.widened;
    ctx->saved_data["n"] = n;
    ctx->saved_data["in"] = in;
    ctx->saved_data["outs"] = group.outs;
    ctx->saved_data["ranks"] = group.ranks;
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["dense_input_gradient"] = group.dense_input_gradient;
    if (any_dropout) {
      ctx->saved_data["dropout_draw"] = DropoutDrawToInts(*dropout.draw);
      ctx->saved_data["dropout_first"] = dropout.first;
      ctx->saved_data["dropout_p"] = dropout_p;
    }
    return outputs;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];  // (N, in), or undefined: made by the recipe
    const torch::Tensor& t = saved[1];  // (N, rank): x A^T
    const torch::Tensor& a_cat = saved[2];
    const at::ArrayRef<torch::Tensor> recipe = at::ArrayRef<torch::Tensor>(saved).slice(3, 5);
    // SwiGLU's backward in this node: x = silu(gate) * up (SwiGluInput).
    const bool swiglu_backward = ctx->saved_data["swiglu_backward"].toBool();
    const size_t lora_count = saved.size() - 8 - (swiglu_backward ? 2 : 0);
    const at::ArrayRef<torch::Tensor> lora = at::ArrayRef<torch::Tensor>(saved).slice(8, lora_count);
    const torch::Tensor swiglu_gate = swiglu_backward ? saved[8 + lora_count] : torch::Tensor();
    const torch::Tensor swiglu_up = swiglu_backward ? saved[9 + lora_count] : torch::Tensor();
    const torch::Tensor widened = ctx->saved_data["widened"].toTensor();
    const int64_t n = ctx->saved_data["n"].toInt();
    const int64_t in = ctx->saved_data["in"].toInt();
    const auto outs = ctx->saved_data["outs"].toIntVector();
    const auto ranks = ctx->saved_data["ranks"].toIntVector();
    const auto scaling = ctx->saved_data["scaling"].toDoubleVector();
    const int64_t rank = Sum(ranks);
    const bool need_x = ctx->needs_input_grad(0) || swiglu_backward;  // SwiGLU's backward starts from dh
    // The members' dropout masks (none: inactive), from the forward's draw.
    std::vector<LoraDropoutMask> masks(outs.size());
    DropoutDraw draw;
    bool any_dropout = false;
    if (ctx->saved_data.find("dropout_draw") != ctx->saved_data.end()) {
      draw = DropoutDrawFromInts(ctx->saved_data["dropout_draw"].toIntVector());
      const DropoutMasks dropout{&draw, ctx->saved_data["dropout_first"].toInt()};
      const auto p = ctx->saved_data["dropout_p"].toDoubleVector();
      for (size_t i = 0; i < outs.size(); ++i) {
        if (ranks[i] > 0) masks[i] = dropout.Of(static_cast<int64_t>(i), p[i]);
        any_dropout = any_dropout || masks[i].active();
      }
    }

    // (N, sum out); with the rotary embedding in the forward, rotated back
    // (here, unless its consumer did: QkvRope::gradient_rotated_back).
    const bool rotate_back = ctx->saved_data.find("rope_heads") != ctx->saved_data.end() &&
                             !ctx->saved_data["rope_gradient_rotated_back"].toBool();
    const torch::Tensor g = rotate_back ? RopeGradient(ctx, grads, outs, n) : StackedGradient(grads, outs, n);
    const int64_t out_total = Sum(outs);
    const torch::Tensor top = widened.narrow(0, 0, out_total);  // [W | sB | 0]
    torch::Tensor grad_x, u;  // u = s g B (N, rank), every LoRA member's columns
    torch::Tensor swiglu_grads;  // [dgate | dup] (N, 2 in) where down's GEMM made them
    torch::Tensor fused_grad_a;  // u^T x (rank, in) float32 where down's GEMM made it (level 3)
    // gate|up's LoRA handed on to this node (SwiGluInput, level 3): its t,
    // ranks and the buffer for its B gradients, filled below on every path.
    const bool handoff = swiglu_backward && ctx->saved_data.find("handoff_t") != ctx->saved_data.end();
    const torch::Tensor handoff_t = handoff ? ctx->saved_data["handoff_t"].toTensor() : torch::Tensor();
    const torch::Tensor handoff_b_sums = handoff ? ctx->saved_data["handoff_b_sums"].toTensor() : torch::Tensor();
    const std::vector<int64_t> handoff_ranks =
        handoff ? ctx->saved_data["handoff_ranks"].toIntVector() : std::vector<int64_t>{};
    bool handoff_filled = false;
    // Input wider than the output (down): [g | u | 0] [W ; A ; 0] = g W + u A,
    // so that no pass over the wide input gradient follows. With dropout the
    // members' terms u_i A_i are added one by one after g W (below).
    const bool lora_term_in_gemm = need_x && rank > 0 && widened.size(0) > out_total && !any_dropout;
    const bool dense = ctx->saved_data["dense_input_gradient"].toBool();
    if (need_x && !lora_term_in_gemm && !dense) {
      // g [W | sB | 0] = [g W | u | 0]: the input gradient and u from one
      // GEMM, then u A added (disjoint columns of the one product).
      const torch::Tensor grad_ext = torch::mm(g, top);
      grad_x = grad_ext.narrow(1, 0, in);
      if (rank > 0) {
        u = grad_ext.narrow(1, in, rank);
        if (!any_dropout) grad_x.addmm_(u, a_cat);
      }
    } else if (lora_term_in_gemm) {
      // u first, a thin product over g, into the spare columns of g's rows
      // where its producer left them (gradient_spare_columns), else beside a
      // copy of g; then [g | u | 0] [W ; A ; 0] in one GEMM.
      const int64_t a_rows = widened.size(0) - out_total;
      const torch::Tensor sb = top.narrow(1, in, rank);
      const torch::Tensor g_ext = WidenedView(g, out_total, a_rows);
      if (g_ext.defined()) {
        u = g_ext.narrow(1, out_total, rank);
        at::mm_out(u, g, sb);
        if (a_rows > rank) g_ext.narrow(1, out_total + rank, a_rows - rank).zero_();
        // SwiGLU's backward in this GEMM's epilogue where the GEMM of our own
        // takes it: [dgate | dup] instead of dh.
        if (swiglu_backward) {
          // At level 3 with LoRA's products over dgate, dup and h in it
          // too: gate|up's B gradients (handed on by its node) and this
          // node's A gradient.
          SwiGluBackwardLora sums;
          if (handoff) {
            sums.gate_up_t = handoff_t;
            sums.rank_gate = handoff_ranks[0];
            sums.rank_up = handoff_ranks[1];
            sums.b_sums = handoff_b_sums;
          }
          if (ctx->saved_data["fused_a"].toBool()) sums.down_u = u;
          const bool asked = handoff || sums.down_u.defined();
          swiglu_grads = DownInputGradientWithSwiGlu(g_ext, widened.narrow(1, 0, in), swiglu_gate, swiglu_up,
                                                     asked ? &sums : nullptr);
          handoff_filled = sums.done && handoff;
          if (sums.done && sums.down_u.defined()) fused_grad_a = sums.a_sums;
        }
        if (!swiglu_grads.defined()) grad_x = torch::mm(g_ext, widened.narrow(1, 0, in));
      } else {
        u = torch::mm(g, sb);
        grad_x = torch::mm(ConcatPadded(g, u, widened.size(0)), widened.narrow(1, 0, in));
      }
    } else {
      // u first, a thin product over g; then the input gradient, if needed,
      // dense: onto u A, or as g W alone (no LoRA, or dropout's terms after).
      if (rank > 0) u = torch::mm(g, top.narrow(1, in, rank));
      if (need_x && rank > 0 && !any_dropout) {
        // u A first (a thin product), then g W added onto it in the GEMM's
        // epilogue (beta 1): no pass over the input gradient afterwards.
        grad_x = torch::mm(u, a_cat);
        grad_x.addmm_(g, top.narrow(1, 0, in));
      } else if (need_x) {
        grad_x = torch::mm(g, top.narrow(1, 0, in));
      }
    }
    // u^T x (rank, in); with dropout, member by member through the masks,
    // the input gradient's terms u_i A_i added in the same pass.
    torch::Tensor grad_a;
    if (rank > 0) {
      grad_a = fused_grad_a.defined() ? fused_grad_a
               : any_dropout ? DroppedLoraGradients(u, x, recipe, a_cat, ranks, masks, need_x ? &grad_x : nullptr)
                             : LoraInputProduct(u, x, recipe);
    }
    // SwiGLU's backward: gate's and up's gradients in place of x's.
    torch::Tensor grad_gate, grad_up;
    if (swiglu_backward) {
      if (swiglu_grads.defined()) {
        grad_gate = swiglu_grads.narrow(1, 0, in);
        grad_up = swiglu_grads.narrow(1, in, in);
      } else {
        std::tie(grad_gate, grad_up) = SwiGluGradients(grad_x, swiglu_gate, swiglu_up);
      }
      grad_x = torch::Tensor();
      // Where the GEMM did not take gate|up's B gradients: products over
      // dgate and dup here (what gate|up's node would run; its buffer filled
      // either way). The buffer holds float32 sums and the products are in
      // the model's dtype, so copy_ casts (mm_out writes its inputs' dtype).
      if (handoff && !handoff_filled && grad_gate.defined() && grad_up.defined()) {
        const int64_t rank_gate = handoff_ranks[0], rank_up = handoff_ranks[1];
        const torch::Tensor gate_rows = grad_gate.reshape({n, -1}), up_rows = grad_up.reshape({n, -1});
        if (rank_gate > 0) {
          handoff_b_sums.narrow(0, 0, rank_gate).copy_(torch::mm(handoff_t.narrow(1, 0, rank_gate).t(), gate_rows));
        }
        if (rank_up > 0) {
          handoff_b_sums.narrow(0, rank_gate, rank_up)
              .copy_(torch::mm(handoff_t.narrow(1, rank_gate, rank_up).t(), up_rows));
        }
        handoff_filled = true;
      }
      if (handoff_filled) ctx->saved_data["handoff_b_filled"].toTensor().fill_(1);
    }
    tensor_list result{grad_x};
    if (rank > 0) {
      // t^T g (rank, sum out): every member's dB^T as a diagonal block, from
      // one thin product that reads g once (the off-diagonal blocks are
      // arithmetic to spare on a pass bound by memory). Per member, g_i^T t_i
      // streamed g at 1.5-1.8 TB/s for the 1024- and 4096-wide members on an
      // H200 (8b profile), against about 3.7 for a product of this shape.
      // Or [t_gate^T dgate ; t_up^T dup] (rank, out) float32 from down's
      // backward, where it filled the buffer this node handed on (level 3).
      const bool handed = ctx->saved_data.find("handed_b_filled") != ctx->saved_data.end() &&
                          ctx->saved_data["handed_b_filled"].toTensor().item<int64_t>() == 1;
      const torch::Tensor handed_b = handed ? ctx->saved_data["handed_b_sums"].toTensor() : torch::Tensor();
      const torch::Tensor grad_bt = handed ? torch::Tensor() : torch::mm(t.t(), g);
      // dA_i = u_i^T x; dB_i = s_i g_i^T t_i; back to the float32 parameters,
      // scaled and cast by one batch of copies for the whole group. Where a
      // parameter's .grad is there already (a step's later micro-batches; every
      // micro-batch under CUDA graphs, engine/step_graph.h) the batch adds the
      // gradient into it, as autograd would, and autograd gets none to add:
      // one launch for the group instead of an add per parameter.
      std::vector<ScaledCast> casts;
      int64_t row = 0, col = 0;
      size_t j = 0;
      for (size_t i = 0; i < outs.size(); ++i) {
        if (ranks[i] > 0) {
          const torch::Tensor& a = lora[j];
          const torch::Tensor& b = lora[j + 1];
          torch::Tensor grad_ai = grad_a.narrow(0, col, ranks[i]);
          if (AddsIntoGrad(a)) {
            casts.push_back({grad_ai, a.grad(), 1.0, /*accumulate=*/true});
            grad_ai = torch::Tensor();
          } else if (grad_ai.scalar_type() != a.scalar_type()) {
            torch::Tensor cast = torch::empty({ranks[i], in}, a.options());
            casts.push_back({grad_ai, cast, 1.0});
            grad_ai = cast;
          }
          result.push_back(grad_ai);
          const torch::Tensor grad_bi = handed ? handed_b.narrow(0, col, ranks[i]).t()
                                               : grad_bt.narrow(0, col, ranks[i]).narrow(1, row, outs[i]).t();
          if (AddsIntoGrad(b)) {
            casts.push_back({grad_bi, b.grad(), scaling[i], /*accumulate=*/true});
            result.push_back(torch::Tensor());
          } else {
            torch::Tensor grad_b = torch::empty({outs[i], ranks[i]}, b.options());
            casts.push_back({grad_bi, grad_b, scaling[i]});
            result.push_back(grad_b);
          }
          col += ranks[i];
          j += 2;
        }
        row += outs[i];
      }
      FusedScaledCasts(casts);
    }
    result.push_back(torch::Tensor());  // group
    result.push_back(torch::Tensor());  // scaling
    result.push_back(torch::Tensor());  // recipe
    result.push_back(torch::Tensor());  // dropout
    result.push_back(torch::Tensor());  // dropout_p
    result.push_back(torch::Tensor());  // swiglu
    if (swiglu_backward) {
      result.push_back(grad_gate);
      result.push_back(grad_up);
    }
    result.push_back(torch::Tensor());  // swiglu_handoff
    result.push_back(torch::Tensor());  // rope
    return result;
  }

 private:
  // The output gradient (N, sum out) of a forward that rotated its outputs:
  // the members' gradients as heads, rotated back (QkvRopeGradient).
  static torch::Tensor RopeGradient(AutogradContext* ctx, const tensor_list& grads, const std::vector<int64_t>& outs,
                                    int64_t n) {
    const int64_t d = ctx->saved_data["rope_head_dim"].toInt();
    std::vector<torch::Tensor> heads_grads;
    std::vector<int64_t> heads;
    for (size_t i = 0; i < outs.size(); ++i) {
      heads.push_back(outs[i] / d);
      heads_grads.push_back(i < grads.size() && grads[i].defined() ? grads[i].reshape({n, outs[i] / d, d})
                                                                   : torch::Tensor());
    }
    return QkvRopeGradient(heads_grads, heads, ctx->saved_data["rope_heads"].toInt(),
                           ctx->saved_data["rope_positions"].toTensor(), ctx->saved_data["rope_inv_freq"].toTensor());
  }

  // Whether the backward adds parameter p's gradient into p.grad itself:
  // where autograd would add it there (a .grad of p's shape and dtype; not
  // while differentiating the backward).
  static bool AddsIntoGrad(const torch::Tensor& p) {
    const torch::Tensor& grad = p.grad();
    return !torch::GradMode::is_enabled() && grad.defined() && grad.sizes() == p.sizes() &&
           grad.scalar_type() == p.scalar_type() && grad.device() == p.device();
  }

  // u^T x (rank, in) for u (N, rank): from x, or from what its recipe kept
  // (norm_input, norm_rstd, norm_weight, gate, up; see InputRecipe).
  static torch::Tensor LoraInputProduct(const torch::Tensor& u, const torch::Tensor& x,
                                        at::ArrayRef<torch::Tensor> recipe) {
    const torch::Tensor &norm_input = recipe[0], &norm_rstd = recipe[1], &norm_weight = recipe[2];
    const torch::Tensor &gate = recipe[3], &up = recipe[4];
    if (norm_input.defined()) {
      // x = w * (h * rstd) by rows: u^T x = ((rstd u)^T h) w, float32 around
      // the GEMM (in the model dtype, like the plain product).
      const torch::Tensor scaled = (u.to(torch::kFloat32) * norm_rstd.unsqueeze(1)).to(norm_input.scalar_type());
      return torch::mm(scaled.t(), norm_input).to(torch::kFloat32).mul_(norm_weight.to(torch::kFloat32));
    }
    if (gate.defined()) return torch::mm(u.t(), FusedSwiGlu(gate, up));  // x again, freed after the GEMM
    return torch::mm(u.t(), x);
  }

  // The input the members' masks apply to: x kept, or made again by SwiGLU's
  // recipe (a group with dropout keeps x otherwise).
  static torch::Tensor DropoutInput(const torch::Tensor& x, at::ArrayRef<torch::Tensor> recipe) {
    return x.defined() ? x : FusedSwiGlu(recipe[3], recipe[4]);
  }

  // u^T x (rank, in) with each member's rows u_i^T dropout_i(x) where it has
  // a mask; with grad_x, each member's input-gradient term u_i A_i added into
  // it, through its mask where it has one (one pass for both,
  // LoraDropoutBackward).
  static torch::Tensor DroppedLoraGradients(const torch::Tensor& u, const torch::Tensor& x,
                                            at::ArrayRef<torch::Tensor> recipe, const torch::Tensor& a_cat,
                                            const std::vector<int64_t>& ranks,
                                            const std::vector<LoraDropoutMask>& masks, torch::Tensor* grad_x) {
    const torch::Tensor rows = DropoutInput(x, recipe);
    torch::Tensor grad_a = torch::empty({u.size(1), rows.size(1)}, rows.options());
    int64_t col = 0;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == 0) continue;
      const torch::Tensor u_i = u.narrow(1, col, ranks[i]);
      const torch::Tensor a_i = a_cat.narrow(0, col, ranks[i]);
      torch::Tensor grad_a_i = grad_a.narrow(0, col, ranks[i]);
      torch::Tensor dropped = rows;
      if (grad_x != nullptr && masks[i].active()) {
        dropped = LoraDropoutBackward(rows, u_i, a_i, *grad_x, masks[i]);
      } else if (grad_x != nullptr) {
        grad_x->addmm_(u_i, a_i);
      } else if (masks[i].active()) {
        dropped = DropoutRows(rows, masks[i]);
      }
      at::mm_out(grad_a_i, u_i.t(), dropped);
      col += ranks[i];
    }
    return grad_a;
  }

  // The members' output gradients side by side (N, sum out): the buffer they
  // already share when a consumer wrote them so (the fused SwiGLU backward
  // does, for gate|up), else a concatenation; zeros for an unused output.
  static torch::Tensor StackedGradient(const tensor_list& grads, const std::vector<int64_t>& outs, int64_t n) {
    const int64_t total = Sum(outs);
    if (grads.size() == 1 && grads[0].defined()) return grads[0];
    torch::TensorOptions options;
    for (const torch::Tensor& gi : grads) {
      if (gi.defined()) options = gi.options();
    }
    bool adjacent = true;
    int64_t column = 0;  // where grads[i] must start in grads[0]'s rows
    for (size_t i = 0; i < grads.size() && adjacent; ++i) {
      const torch::Tensor& gi = grads[i];
      adjacent = gi.defined() && gi.dim() == 2 && gi.stride(1) == 1 && gi.stride(0) == total &&
                 gi.storage().is_alias_of(grads[0].storage()) &&
                 gi.storage_offset() == grads[0].storage_offset() + column;
      column += outs[i];
    }
    if (adjacent) return grads[0].as_strided({n, total}, {total, 1});
    std::vector<torch::Tensor> parts;
    for (size_t i = 0; i < grads.size(); ++i) {
      parts.push_back(grads[i].defined() ? grads[i] : torch::zeros({n, outs[i]}, options));
    }
    return torch::cat(parts, 1);
  }
};

// Whether the group is widened for exactly these members' ranks, with
// frozen weights: the node's layout fits them.
bool WidenedLayoutFits(const LinearGroup& group, const std::vector<const Linear*>& members) {
  if (!group.widened.defined() || members.size() != group.outs.size()) return false;
  for (size_t i = 0; i < members.size(); ++i) {
    const Linear* l = members[i];
    if (l->weight.requires_grad() || (l->bias.defined() && l->bias.requires_grad())) return false;
    if (group.ranks[i] != (l->lora ? l->lora->a.size(0) : 0)) return false;
  }
  return true;
}

}  // namespace

void RefreshLoraCopies(const std::vector<GroupMembers>& groups) {
  const torch::NoGradGuard no_grad;
  std::vector<ScaledCast> casts;
  std::vector<std::pair<const LinearGroup*, std::vector<LoraSource>>> updates;
  for (const GroupMembers& gm : groups) {
    if (gm.group == nullptr || !WidenedLayoutFits(*gm.group, gm.members)) continue;
    std::vector<torch::Tensor> lora;
    std::vector<double> scaling;
    LoraOf(gm.members, &lora, &scaling);
    if (lora.empty()) continue;
    updates.emplace_back(gm.group, StaleLoraCasts(*gm.group, lora, scaling, &casts));
  }
  if (!casts.empty()) FusedScaledCasts(casts);
  for (auto& [group, now] : updates) group->lora_copies.written = std::move(now);
}

void Widen(LinearGroup& group, const std::vector<Linear*>& members) {
  torch::NoGradGuard no_grad;
  group = LinearGroup();
  group.in = members.front()->weight.size(1);
  bool any_bias = false;
  for (const Linear* l : members) {
    group.outs.push_back(l->weight.size(0));
    group.ranks.push_back(l->lora ? l->lora->a.size(0) : 0);
    any_bias = any_bias || l->bias.defined();
  }
  const int64_t rank = Sum(group.ranks);
  group.cols = (rank + kColumnAlignment - 1) / kColumnAlignment * kColumnAlignment;
  group.a_rows = group.in > Sum(group.outs) ? group.cols : 0;
  const torch::Tensor& w0 = members.front()->weight;
  group.widened = torch::zeros({Sum(group.outs) + group.a_rows, group.in + group.cols}, w0.options());
  // Where the LoRA copies go (LinearGroup::LoraCopies), fixed by this layout.
  if (rank > 0) {
    LinearGroup::LoraCopies& copies = group.lora_copies;
    copies.a_stacked = group.a_rows > 0 ? group.widened.narrow(0, Sum(group.outs), rank).narrow(1, 0, group.in)
                                        : torch::empty({rank, group.in}, w0.options());
    int64_t row = 0, col = 0;
    for (size_t i = 0; i < group.outs.size(); ++i) {
      if (group.ranks[i] > 0) {
        copies.a_blocks.push_back(copies.a_stacked.narrow(0, col, group.ranks[i]));
        copies.b_blocks.push_back(
            group.widened.narrow(0, row, group.outs[i]).narrow(1, group.in + col, group.ranks[i]));
        col += group.ranks[i];
      }
      row += group.outs[i];
    }
  }
  if (any_bias) group.bias = torch::zeros({Sum(group.outs)}, w0.options());
  int64_t row = 0;
  for (Linear* l : members) {
    const int64_t out = l->weight.size(0);
    torch::Tensor rows = group.widened.narrow(0, row, out).narrow(1, 0, group.in);
    rows.copy_(l->weight);
    l->weight = rows;
    if (l->bias.defined()) {
      torch::Tensor b = group.bias.narrow(0, row, out);
      b.copy_(l->bias);
      l->bias = b;
    }
    row += out;
  }
}

std::vector<torch::Tensor> ForwardGroup(const LinearGroup& group, const std::vector<const Linear*>& members,
                                        const torch::Tensor& x, const InputRecipe& recipe,
                                        const DropoutMasks& dropout, SwiGluOutput* swiglu,
                                        const SwiGluInput* swiglu_input, QkvRope* rope) {
  std::vector<torch::Tensor> outputs;
  if (!WidenedLayoutFits(group, members)) {
    // SwiGLU's backward through its own node here: x made again with autograd.
    const torch::Tensor input = swiglu_input != nullptr ? FusedSwiGlu(swiglu_input->gate, swiglu_input->up) : x;
    for (size_t i = 0; i < members.size(); ++i) {
      outputs.push_back(members[i]->Forward(input, {dropout.draw, dropout.first + static_cast<int64_t>(i)}));
    }
    return outputs;
  }
  // (N, in): a view (the leading dimensions merge), so a producer's wider
  // rows stay visible to WidenedView.
  const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
  std::vector<torch::Tensor> lora;
  std::vector<double> scaling, dropout_p;
  LoraOf(members, &lora, &scaling, &dropout_p);
  std::vector<torch::Tensor> swiglu_inputs;  // (N, f) each
  if (swiglu_input != nullptr) {
    swiglu_inputs = {swiglu_input->gate.reshape({-1, x.size(-1)}), swiglu_input->up.reshape({-1, x.size(-1)})};
  }
  // With SwiGLU's inputs the node differentiates those, never x.
  tensor_list ys = WidenedGroupFunction::apply(swiglu_input != nullptr ? x2.detach() : x2, at::TensorList(lora), group,
                                               scaling, recipe, dropout, dropout_p, swiglu,
                                               at::TensorList(swiglu_inputs), swiglu_input, rope);
  for (size_t i = 0; i < members.size(); ++i) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = group.outs[i];
    outputs.push_back(ys[i].view(shape));
  }
  return outputs;
}

torch::Tensor CurrentLoraA(const GroupMembers& group) {
  if (group.group == nullptr || !WidenedLayoutFits(*group.group, group.members)) return {};
  std::vector<torch::Tensor> lora;
  std::vector<double> scaling;
  LoraOf(group.members, &lora, &scaling);
  if (lora.empty()) return {};
  const torch::NoGradGuard no_grad;
  EnsureLoraCopies(*group.group, lora, scaling);
  return group.group->lora_copies.a_stacked;
}

}  // namespace trainerd::engine
