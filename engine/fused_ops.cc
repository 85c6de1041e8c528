#include "engine/fused_ops.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef TRAINERD_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/fused_kernels.h"
#endif

namespace trainerd::engine {

namespace {

// (x1, x2) -> (-x2, x1) over the last dimension's halves.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x rotated by the positions' angles (inverse: the transposed rotation) into
// out (tokens, heads, d): dense, or token rows of a wider buffer (stride(0)
// >= heads * d, stride(1) == d, stride(2) == 1); or copied there unchanged
// (rotate false).
struct RopePart {
  torch::Tensor x, out;
  bool rotate = true;
};

}  // namespace

torch::Tensor PlainRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps, torch::Tensor* rstd) {
  torch::Tensor h = x.to(torch::kFloat32);
  torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  const torch::Tensor inverse = torch::rsqrt(variance + eps);  // (..., 1)
  if (rstd != nullptr) *rstd = inverse.detach().reshape({-1});
  h = h * inverse;
  return weight * h.to(x.scalar_type());
}

torch::Tensor PlainSwiGlu(const torch::Tensor& gate, const torch::Tensor& up) { return torch::silu(gate) * up; }

torch::Tensor PlainRope(const torch::Tensor& x, const torch::Tensor& position_ids, const torch::Tensor& inv_freq) {
  torch::Tensor freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq.to(torch::kFloat32);  // (tokens, d/2)
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);                                                     // (tokens, d)
  torch::Tensor cos = emb.cos().to(x.scalar_type()).unsqueeze(1);  // (tokens, 1, d)
  torch::Tensor sin = emb.sin().to(x.scalar_type()).unsqueeze(1);
  return x * cos + RotateHalf(x) * sin;
}

torch::Tensor PlainSoftmaxCrossEntropyRows(torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index,
                                           bool write_grad) {
  const torch::NoGradGuard no_grad;                                    // not an autograd op
  const int64_t rows = logits.size(0);
  const torch::Tensor f = logits.to(torch::kFloat32);                  // (rows, V); logits itself when float32
  const torch::Tensor valid = targets != ignore_index;                 // (rows) bool
  const torch::Tensor index = torch::where(valid, targets, torch::zeros_like(targets)).unsqueeze(1);  // (rows, 1)
  const torch::Tensor lse = torch::logsumexp(f, 1);                    // (rows)
  const torch::Tensor picked = f.gather(1, index).squeeze(1);
  torch::Tensor loss = (lse - picked) * valid;
  if (write_grad) {
    // A new tensor (f - lse), so f (possibly logits) is read whole before logits is written.
    torch::Tensor probs = (f - lse.unsqueeze(1)).exp_();
    probs.scatter_add_(1, index, torch::full({rows, 1}, -1.0, f.options()));
    probs.mul_(valid.unsqueeze(1));
    logits.copy_(probs);
  }
  return loss;
}

void PlainScaledCasts(const std::vector<ScaledCast>& casts) {
  const torch::NoGradGuard no_grad;
  for (const ScaledCast& c : casts) {
    torch::Tensor dst = c.dst;
    if (c.accumulate) {
      dst.add_(torch::mul(c.src, torch::scalar_tensor(c.scale)).to(dst.scalar_type()));
    } else {
      torch::mul_out(dst, c.src, torch::scalar_tensor(c.scale));
    }
  }
}

bool FusedKernelsBuilt() {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

#ifdef TRAINERD_WITH_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::optional<kernels::DType> KernelDType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return kernels::DType::kFloat32;
    case torch::kFloat16:
      return kernels::DType::kFloat16;
    case torch::kBFloat16:
      return kernels::DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

// Whether the kernels take t: a non-empty CUDA tensor of a kernel dtype.
bool KernelTensor(const torch::Tensor& t) {
  return t.defined() && t.is_cuda() && t.numel() > 0 && KernelDType(t.scalar_type()).has_value();
}

kernels::DType DTypeOf(const torch::Tensor& t) { return *KernelDType(t.scalar_type()); }

// The current stream of t's device, as the launchers take it.
void* StreamOf(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

void Check(const std::string& error) { TORCH_CHECK(error.empty(), "fused kernel: ", error); }

// t (..., cols) as (rows, cols) with unit column stride, without a copy when
// its rows are evenly spaced (a narrow of wider rows); else a contiguous copy.
torch::Tensor Rows(const torch::Tensor& t) {
  const int64_t cols = t.size(-1);
  torch::Tensor r = t.reshape({-1, cols});
  if ((cols > 1 && r.stride(1) != 1) || (r.size(0) > 1 && r.stride(0) < cols)) r = r.contiguous();
  return r;
}

// The distance between rows of a Rows() matrix, in elements.
int64_t RowStride(const torch::Tensor& r) { return r.size(0) > 1 ? r.stride(0) : r.size(1); }

// (rows, cols) in a fresh buffer whose rows are cols + spare apart: the left part.
torch::Tensor WithSpareColumns(int64_t rows, int64_t cols, int64_t spare, const torch::TensorOptions& options) {
  const torch::Tensor buffer = torch::empty({rows, cols + spare}, options);
  return spare > 0 ? buffer.narrow(1, 0, cols) : buffer;
}

// The RMSNorm backward of both norm nodes: dx (rows, H) of x2 (the norm's
// input, (rows, H) dense) for dy (rows possibly wider: a widened group's
// gradient), plus dsum ((..., H), rows possibly wider) inside the kernel when
// defined: the gradient that reaches a residual sum from its other consumers;
// and dweight in the weight's dtype when weight_grad (undefined otherwise).
// dx is the left part of rows dx_spare elements wider (uninitialised).
std::pair<torch::Tensor, torch::Tensor> RmsNormGradients(const torch::Tensor& dy_in, const torch::Tensor& dsum_in,
                                                         const torch::Tensor& x2, const torch::Tensor& w,
                                                         const torch::Tensor& rstd, bool weight_grad,
                                                         int64_t dx_spare) {
  const int64_t rows = x2.size(0), hidden = x2.size(1);
  const torch::Tensor dy = Rows(dy_in);
  const torch::Tensor dsum = dsum_in.defined() ? Rows(dsum_in) : torch::Tensor();
  torch::Tensor dx = WithSpareColumns(rows, hidden, dx_spare, x2.options());
  torch::Tensor dweight, workspace;  // float32 (H) and the kernel's partial sums
  if (weight_grad) {
    dweight = torch::empty({hidden}, x2.options().dtype(torch::kFloat32));
    const int64_t floats = static_cast<int64_t>(kernels::RmsNormBackwardWorkspaceBytes(rows, hidden) / sizeof(float));
    workspace = torch::empty({floats}, x2.options().dtype(torch::kFloat32));
  }
  float* dw = dweight.defined() ? dweight.data_ptr<float>() : nullptr;
  void* ws = workspace.defined() ? workspace.data_ptr() : nullptr;
  const size_t ws_bytes = workspace.defined() ? workspace.numel() * sizeof(float) : 0;
  const int64_t dx_stride = hidden + dx_spare;
  Check(dsum.defined() ? kernels::AddRmsNormBackward(dy.data_ptr(), RowStride(dy), dsum.data_ptr(), RowStride(dsum),
                                                     x2.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                                                     dx.data_ptr(), dx_stride, dw, ws, ws_bytes, rows, hidden,
                                                     DTypeOf(x2), StreamOf(x2))
                       : kernels::RmsNormBackward(dy.data_ptr(), RowStride(dy), x2.data_ptr(), w.data_ptr(),
                                                  rstd.data_ptr<float>(), dx.data_ptr(), dx_stride, dw, ws, ws_bytes,
                                                  rows, hidden, DTypeOf(x2), StreamOf(x2)));
  return {dx, dweight.defined() ? dweight.to(w.scalar_type()) : torch::Tensor()};
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  // rstd_out: when not null, set to the per-row 1/rms it saves, (rows)
  // float32: handed out beside the graph, so that the node stays the one
  // output node it always was.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               double eps, int64_t spare, torch::Tensor* rstd_out) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t hidden = x.size(-1);
    const torch::Tensor x2 = x.contiguous().view({-1, hidden});  // (rows, H)
    const torch::Tensor w = weight.contiguous();                 // (H)
    torch::Tensor y = WithSpareColumns(x2.size(0), hidden, spare, x2.options());
    torch::Tensor rstd = torch::empty({x2.size(0)}, x2.options().dtype(torch::kFloat32));  // (rows)
    Check(kernels::RmsNormForward(x2.data_ptr(), w.data_ptr(), y.data_ptr(), hidden + spare, rstd.data_ptr<float>(),
                                  x2.size(0), hidden, static_cast<float>(eps), DTypeOf(x), StreamOf(x)));
    ctx->save_for_backward({x2, w, rstd});
    if (rstd_out != nullptr) *rstd_out = rstd;
    return y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x2 = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& rstd = saved[2];
    const c10::cuda::CUDAGuard guard(x2.device());
    const auto [dx, dweight] = RmsNormGradients(grads[0], {}, x2, w, rstd, ctx->needs_input_grad(1), 0);
    return {dx.view(grads[0].sizes()), dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Inputs residual, delta (..., H), weight; outputs {sum, y} (see FusedAddRmsNorm).
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& residual, const torch::Tensor& delta,
                               const torch::Tensor& weight, double eps, int64_t spare, torch::Tensor* rstd_out,
                               int64_t gradient_spare) {
    const c10::cuda::CUDAGuard guard(residual.device());
    const int64_t hidden = residual.size(-1);
    const torch::Tensor r2 = residual.contiguous().view({-1, hidden});  // (rows, H)
    const torch::Tensor d2 = delta.contiguous().view({-1, hidden});
    const torch::Tensor w = weight.contiguous();
    torch::Tensor sum = torch::empty(residual.sizes(), r2.options());  // an output, saved as such
    torch::Tensor y = WithSpareColumns(r2.size(0), hidden, spare, r2.options());
    torch::Tensor rstd = torch::empty({r2.size(0)}, r2.options().dtype(torch::kFloat32));
    Check(kernels::AddRmsNormForward(r2.data_ptr(), d2.data_ptr(), sum.data_ptr(), w.data_ptr(), y.data_ptr(),
                                     hidden + spare, rstd.data_ptr<float>(), r2.size(0), hidden,
                                     static_cast<float>(eps), DTypeOf(residual), StreamOf(residual)));
    ctx->save_for_backward({sum, w, rstd});
    ctx->saved_data["gradient_spare"] = gradient_spare;
    if (rstd_out != nullptr) *rstd_out = rstd;
    return {sum, y.view(residual.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& w = saved[1];
    const torch::Tensor& rstd = saved[2];
    const int64_t rows = rstd.size(0), hidden = w.size(0);
    const torch::Tensor sum = saved[0].view({rows, hidden});
    const c10::cuda::CUDAGuard guard(sum.device());
    const torch::Tensor dsum = grads[0].defined() ? Rows(grads[0]) : torch::Tensor();  // (rows, H), rows apart
    torch::Tensor dx, dweight;
    if (!grads[1].defined()) {  // y unused: the sum's gradient alone
      dx = dsum.defined() ? dsum : torch::zeros(sum.sizes(), sum.options());
    } else {
      std::tie(dx, dweight) = RmsNormGradients(grads[1], dsum, sum, w, rstd, ctx->needs_input_grad(2),
                                               ctx->saved_data["gradient_spare"].toInt());
    }
    const torch::Tensor shaped = dx.view(saved[0].sizes());
    return {shaped, shaped, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// SwiGLU's output where something else made it already (gate|up's GEMM, in
// its epilogue): the (rows, cols) view of rows cols + spare wide. Not a tensor
// argument, so that autograd does not take it for an input of the node.
struct MadeOutput {
  torch::Tensor h;
};

// gate and up (any shape, the same) as (rows, cols) matrices with one row
// stride, as the SwiGLU kernels read them: in place when both are evenly
// spaced alike (the halves of one gate|up product), else contiguous copies.
std::pair<torch::Tensor, torch::Tensor> SwiGluRows(const torch::Tensor& gate, const torch::Tensor& up) {
  torch::Tensor g = Rows(gate), u = Rows(up);
  if (RowStride(g) != RowStride(u)) {
    g = g.contiguous();
    u = u.contiguous();
  }
  return {g, u};
}

// SwiGLU's backward by the kernel: dout, g, u (rows, cols) as Rows() makes
// them, g and u with one row stride. When gate and up are the halves of one
// gate|up product, so are their gradients: the group that made them takes
// them as one matrix.
std::pair<torch::Tensor, torch::Tensor> KernelSwiGluGradients(const torch::Tensor& dout, const torch::Tensor& g,
                                                              const torch::Tensor& u) {
  const c10::cuda::CUDAGuard guard(g.device());
  const int64_t rows = g.size(0), cols = g.size(1), in_stride = RowStride(g);
  const bool halves = in_stride == 2 * cols &&
                      static_cast<char*>(u.data_ptr()) == static_cast<char*>(g.data_ptr()) + cols * g.element_size();
  torch::Tensor dgate, dup;
  if (halves) {
    const torch::Tensor both = torch::empty({rows, 2 * cols}, g.options());
    dgate = both.narrow(1, 0, cols);
    dup = both.narrow(1, cols, cols);
  } else {
    dgate = torch::empty({rows, cols}, g.options());
    dup = torch::empty({rows, cols}, g.options());
  }
  Check(kernels::SwiGluBackward(dout.data_ptr(), RowStride(dout), g.data_ptr(), u.data_ptr(), in_stride,
                                dgate.data_ptr(), dup.data_ptr(), halves ? 2 * cols : cols, rows, cols, DTypeOf(g),
                                StreamOf(g)));
  return {dgate, dup};
}

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate, const torch::Tensor& up,
                               int64_t spare, const MadeOutput& made) {
    const c10::cuda::CUDAGuard guard(gate.device());
    const auto [g, u] = SwiGluRows(gate, up);
    const int64_t rows = g.size(0), cols = g.size(1);
    torch::Tensor out = made.h;
    if (!out.defined()) {
      out = WithSpareColumns(rows, cols, spare, g.options());
      Check(kernels::SwiGluForward(g.data_ptr(), u.data_ptr(), RowStride(g), out.data_ptr(), cols + spare, rows,
                                   cols, DTypeOf(g), StreamOf(g)));
    }
    ctx->save_for_backward({g, u});
    return out.view(gate.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto [dgate, dup] = KernelSwiGluGradients(Rows(grads[0]), saved[0], saved[1]);
    return {dgate.view(grads[0].sizes()), dup.view(grads[0].sizes()), torch::Tensor(), torch::Tensor()};
  }
};

// Whether the RoPE kernel reads x (tokens, heads, d) in place: elements and
// heads dense, tokens apart by at least a token's heads * d values. Strides
// of size-1 dimensions do not matter (contiguous() leaves them arbitrary).
bool RopeReadsInPlace(const torch::Tensor& x) {
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  return x.stride(2) == 1 && (heads == 1 || x.stride(1) == d) && (tokens == 1 || x.stride(0) >= heads * d);
}

// Every part of one token count, head size and dtype: one launch for each
// kernels::kMaxRopeSegments of them.
void RotateInto(const std::vector<RopePart>& parts, const torch::Tensor& position_ids,
                const torch::Tensor& inv_freq, bool inverse) {
  if (parts.size() > static_cast<size_t>(kernels::kMaxRopeSegments)) {
    for (size_t begin = 0; begin < parts.size(); begin += kernels::kMaxRopeSegments) {
      const size_t end = std::min(parts.size(), begin + kernels::kMaxRopeSegments);
      RotateInto(std::vector<RopePart>(parts.begin() + begin, parts.begin() + end), position_ids, inv_freq, inverse);
    }
    return;
  }
  if (parts.empty()) return;
  std::vector<kernels::RopeSegment> segments;
  std::vector<torch::Tensor> inputs;  // alive until the launch
  for (const RopePart& p : parts) {
    const torch::Tensor x = RopeReadsInPlace(p.x) ? p.x : p.x.contiguous();
    inputs.push_back(x);
    const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
    segments.push_back({x.data_ptr(), tokens == 1 ? heads * d : x.stride(0), p.out.data_ptr(),
                        tokens == 1 ? heads * d : p.out.stride(0), heads, p.rotate});
  }
  const torch::Tensor& x = inputs.front();
  Check(kernels::RopeSegments(segments.data(), static_cast<int>(segments.size()), position_ids.data_ptr<int64_t>(),
                              inv_freq.data_ptr<float>(), x.size(0), x.size(2), inverse, DTypeOf(x), StreamOf(x)));
}

// A new contiguous (tokens, heads, d) tensor for x (tokens, heads, d).
torch::Tensor EmptyHeads(const torch::Tensor& x) {
  return torch::empty({x.size(0), x.size(1), x.size(2)}, x.options());
}

// x rotated, as a new contiguous (tokens, heads, d) tensor.
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& position_ids, const torch::Tensor& inv_freq,
                     bool inverse) {
  torch::Tensor out = EmptyHeads(x);
  RotateInto({{x, out}}, position_ids, inv_freq, inverse);
  return out;
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& position_ids,
                               const torch::Tensor& inv_freq) {
    const c10::cuda::CUDAGuard guard(x.device());
    const torch::Tensor pos = position_ids.to(torch::kInt64).contiguous();  // (tokens)
    const torch::Tensor inv = inv_freq.to(torch::kFloat32).contiguous();    // (d/2)
    ctx->save_for_backward({pos, inv});
    return Rotate(x, pos, inv, /*inverse=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const c10::cuda::CUDAGuard guard(grads[0].device());
    return {Rotate(grads[0], saved[0], saved[1], /*inverse=*/true), torch::Tensor(), torch::Tensor()};
  }
};

// q and k rotated, v copied (FusedQkvRope). Inputs q, k, v, position_ids,
// inv_freq; the backward writes the three input gradients into one buffer.
class QkvRopeFunction : public torch::autograd::Function<QkvRopeFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& position_ids,
                               const torch::Tensor& inv_freq) {
    const c10::cuda::CUDAGuard guard(q.device());
    const torch::Tensor pos = position_ids.to(torch::kInt64).contiguous();  // (tokens)
    const torch::Tensor inv = inv_freq.to(torch::kFloat32).contiguous();    // (d/2)
    ctx->save_for_backward({pos, inv});
    ctx->saved_data["heads"] = std::vector<int64_t>{q.size(1), k.size(1), v.size(1)};
    // v's own copy even when it is dense: attention keeps it, and it must not
    // keep alive the q|k|v product v is a view of. One launch for the three.
    torch::Tensor q_out = EmptyHeads(q), k_out = EmptyHeads(k), v_out = EmptyHeads(v);
    RotateInto({{q, q_out}, {k, k_out}, {v, v_out, /*rotate=*/false}}, pos, inv, /*inverse=*/false);
    return {q_out, k_out, v_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> heads = ctx->saved_data["heads"].toIntVector();
    variable_list result(5);
    if (!grads[0].defined() && !grads[1].defined() && !grads[2].defined()) return result;
    // [dq | dk | dv] (tokens, width): each gradient a view of its columns.
    const torch::Tensor buffer =
        QkvRopeGradient({grads[0], grads[1], grads[2]}, heads, heads[0] + heads[1], saved[0], saved[1]);
    const int64_t tokens = buffer.size(0), d = buffer.size(1) / (heads[0] + heads[1] + heads[2]);
    int64_t column = 0;
    for (size_t i = 0; i < 3; ++i) {
      result[i] = buffer.narrow(1, column, heads[i] * d).view({tokens, heads[i], d});
      column += heads[i] * d;
    }
    return result;
  }
};

// The kernel path of FusedSoftmaxCrossEntropyRows: logits (rows, V) contiguous, a kernel tensor.
torch::Tensor SoftmaxCrossEntropyRowsOnKernel(torch::Tensor& logits, const torch::Tensor& targets,
                                              int64_t ignore_index, bool write_grad) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const torch::Tensor t = targets.contiguous();  // (rows) int64
  torch::Tensor loss = torch::empty({logits.size(0)}, logits.options().dtype(torch::kFloat32));
  Check(kernels::SoftmaxCrossEntropyRows(logits.data_ptr(), t.data_ptr<int64_t>(), loss.data_ptr<float>(),
                                         logits.size(0), logits.size(1), ignore_index, write_grad,
                                         DTypeOf(logits), StreamOf(logits)));
  // Written through a raw pointer: tell autograd, as an in-place op would
  // (a saved logits tensor then fails its version check instead of being wrong).
  if (write_grad) torch::autograd::impl::bump_version(logits);
  return loss;
}

}  // namespace
#endif  // TRAINERD_WITH_CUDA_KERNELS

torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps, int64_t spare_columns,
                           torch::Tensor* rstd) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(x) && weight.defined() && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
      weight.scalar_type() == x.scalar_type() && weight.device() == x.device()) {
    return RmsNormFunction::apply(x, weight, eps, spare_columns, rstd);
  }
#endif
  return PlainRmsNorm(x, weight, eps, rstd);
}

std::pair<torch::Tensor, torch::Tensor> FusedAddRmsNorm(const torch::Tensor& residual, const torch::Tensor& delta,
                                                        const torch::Tensor& weight, double eps, int64_t spare_columns,
                                                        torch::Tensor* rstd, int64_t gradient_spare_columns) {
  if (!delta.defined()) return {residual, FusedRmsNorm(residual, weight, eps, spare_columns, rstd)};
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(residual) && delta.sizes() == residual.sizes() && delta.scalar_type() == residual.scalar_type() &&
      delta.device() == residual.device() && weight.defined() && weight.dim() == 1 &&
      weight.size(0) == residual.size(-1) && weight.scalar_type() == residual.scalar_type() &&
      weight.device() == residual.device()) {
    const variable_list out =
        AddRmsNormFunction::apply(residual, delta, weight, eps, spare_columns, rstd, gradient_spare_columns);
    return {out[0], out[1]};
  }
#endif
  torch::Tensor sum = residual + delta;
  return {sum, FusedRmsNorm(sum, weight, eps, spare_columns, rstd)};
}

torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up, int64_t spare_columns,
                          const torch::Tensor& made) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(gate) && up.defined() && up.sizes() == gate.sizes() && up.scalar_type() == gate.scalar_type() &&
      up.device() == gate.device()) {
    const bool made_fits = made.defined() && made.numel() == gate.numel() && made.size(-1) == gate.size(-1) &&
                           made.scalar_type() == gate.scalar_type() && made.device() == gate.device();
    return SwiGluFunction::apply(gate, up, spare_columns, MadeOutput{made_fits ? made : torch::Tensor()});
  }
#endif
  return PlainSwiGlu(gate, up);
}

std::pair<torch::Tensor, torch::Tensor> SwiGluGradients(const torch::Tensor& dout, const torch::Tensor& gate,
                                                        const torch::Tensor& up) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(gate) && up.sizes() == gate.sizes() && dout.sizes() == gate.sizes() &&
      up.scalar_type() == gate.scalar_type() && dout.scalar_type() == gate.scalar_type() &&
      up.device() == gate.device() && dout.device() == gate.device()) {
    const auto [g, u] = SwiGluRows(gate, up);
    auto [dgate, dup] = KernelSwiGluGradients(Rows(dout), g, u);
    return {dgate.view(gate.sizes()), dup.view(gate.sizes())};
  }
#endif
  // The kernel's formula in float32, each result rounded once to the dtype.
  const torch::Tensor d = dout.to(torch::kFloat32), g = gate.to(torch::kFloat32), u = up.to(torch::kFloat32);
  const torch::Tensor s = torch::sigmoid(g);
  return {(d * u * s * (1 + g * (1 - s))).to(gate.scalar_type()), (d * g * s).to(gate.scalar_type())};
}

torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& position_ids, const torch::Tensor& inv_freq) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(x) && x.dim() == 3 && x.size(2) % 2 == 0 && x.size(2) <= 8192 && position_ids.dim() == 1 &&
      position_ids.size(0) == x.size(0) && position_ids.device() == x.device() && inv_freq.dim() == 1 &&
      inv_freq.size(0) == x.size(2) / 2 && inv_freq.device() == x.device()) {
    return RopeFunction::apply(x, position_ids, inv_freq);
  }
#endif
  return PlainRope(x, position_ids, inv_freq);
}

void FusedScaledCasts(const std::vector<ScaledCast>& casts) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  // The kernel's copies by (device, source dtype, destination dtype), in
  // order, each batch with one of its destinations (for the device, the
  // destination dtype and the stream).
  struct Batch {
    torch::Tensor dst;
    std::vector<kernels::ScaledCopy> copies;
  };
  std::map<std::tuple<int, int, int>, Batch> batches;
  std::vector<ScaledCast> plain;
  for (const ScaledCast& c : casts) {
    if (!(KernelTensor(c.src) && KernelTensor(c.dst) && c.src.dim() == 2 && c.src.sizes() == c.dst.sizes() &&
          c.src.device() == c.dst.device())) {
      plain.push_back(c);
      continue;
    }
    const auto key = std::make_tuple(static_cast<int>(c.dst.device().index()), static_cast<int>(c.src.scalar_type()),
                                     static_cast<int>(c.dst.scalar_type()));
    kernels::ScaledCopy k;
    k.src = c.src.data_ptr();
    k.dst = c.dst.data_ptr();
    k.rows = c.src.size(0);
    k.cols = c.src.size(1);
    k.src_row_stride = c.src.stride(0);
    k.src_col_stride = c.src.stride(1);
    k.dst_row_stride = c.dst.stride(0);
    k.dst_col_stride = c.dst.stride(1);
    k.scale = static_cast<float>(c.scale);
    k.accumulate = c.accumulate;
    Batch& batch = batches[key];
    if (!batch.dst.defined()) batch.dst = c.dst;
    batch.copies.push_back(k);
    // Written through a raw pointer below: tell autograd, as an in-place op would.
    torch::autograd::impl::bump_version(c.dst);
  }
  for (const auto& [key, batch] : batches) {
    const torch::Tensor& t = batch.dst;
    const c10::cuda::CUDAGuard guard(t.device());
    const kernels::DType src_dtype = *KernelDType(static_cast<torch::ScalarType>(std::get<1>(key)));
    const std::vector<kernels::ScaledCopy>& copies = batch.copies;
    for (size_t begin = 0; begin < copies.size(); begin += kernels::kMaxScaledCopies) {
      const int count = static_cast<int>(std::min<size_t>(kernels::kMaxScaledCopies, copies.size() - begin));
      Check(kernels::ScaledCopies(copies.data() + begin, count, src_dtype, DTypeOf(t), StreamOf(t)));
    }
  }
  PlainScaledCasts(plain);
#else
  PlainScaledCasts(casts);
#endif
}

std::array<torch::Tensor, 3> FusedQkvRope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& position_ids, const torch::Tensor& inv_freq) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  auto heads_like_q = [&](const torch::Tensor& x) {
    return x.defined() && x.dim() == 3 && x.size(0) == q.size(0) && x.size(2) == q.size(2) &&
           x.scalar_type() == q.scalar_type() && x.device() == q.device();
  };
  if (KernelTensor(q) && q.dim() == 3 && q.size(2) % 2 == 0 && q.size(2) <= 8192 && heads_like_q(k) &&
      heads_like_q(v) && position_ids.dim() == 1 && position_ids.size(0) == q.size(0) &&
      position_ids.device() == q.device() && inv_freq.dim() == 1 && inv_freq.size(0) == q.size(2) / 2 &&
      inv_freq.device() == q.device()) {
    const variable_list out = QkvRopeFunction::apply(q, k, v, position_ids, inv_freq);
    return {out[0], out[1], out[2]};
  }
#endif
  return {PlainRope(q, position_ids, inv_freq), PlainRope(k, position_ids, inv_freq),
          v.clone(at::MemoryFormat::Contiguous)};
}

void RotateHeadsInPlace(const torch::Tensor& y, int64_t rotated_heads, int64_t head_dim,
                        const torch::Tensor& position_ids, const torch::Tensor& inv_freq) {
  const torch::NoGradGuard no_grad;
  TORCH_CHECK(y.dim() == 2 && y.stride(1) == 1 && rotated_heads * head_dim <= y.size(1) && head_dim % 2 == 0,
              "RotateHeadsInPlace: y must be (tokens, width) rows with room for ", rotated_heads, " heads of ",
              head_dim);
  if (rotated_heads == 0 || y.size(0) == 0) return;
  const torch::Tensor heads = y.narrow(1, 0, rotated_heads * head_dim).view({y.size(0), rotated_heads, head_dim});
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(y) && head_dim <= 8192 && position_ids.device() == y.device() && inv_freq.device() == y.device()) {
    const c10::cuda::CUDAGuard guard(y.device());
    // In place: each thread reads its pair of elements before writing it.
    RotateInto({{heads, heads}}, position_ids.to(torch::kInt64).contiguous(),
               inv_freq.to(torch::kFloat32).contiguous(), /*inverse=*/false);
    return;
  }
#endif
  heads.copy_(PlainRope(heads, position_ids, inv_freq));
}

torch::Tensor QkvRopeGradient(const std::vector<torch::Tensor>& grads, const std::vector<int64_t>& heads,
                              int64_t rotated_heads, const torch::Tensor& position_ids,
                              const torch::Tensor& inv_freq) {
  const torch::NoGradGuard no_grad;
  const torch::Tensor* any = nullptr;
  for (const torch::Tensor& g : grads) {
    if (g.defined()) any = &g;
  }
  TORCH_CHECK(any != nullptr && any->dim() == 3 && grads.size() == heads.size(),
              "QkvRopeGradient: one (tokens, heads, d) gradient a part, at least one defined");
  const int64_t tokens = any->size(0), d = any->size(2);
  int64_t total = 0;
  for (int64_t h : heads) total += h;
  const torch::Tensor buffer = torch::empty({tokens, total * d}, any->options());
  // The parts split where the rotated heads end.
  std::vector<RopePart> pieces;
  int64_t first = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t split = std::clamp(rotated_heads - first, int64_t{0}, heads[i]);
    for (const auto& [begin, count, rotate] :
         {std::tuple<int64_t, int64_t, bool>{0, split, true}, {split, heads[i] - split, false}}) {
      if (count == 0) continue;
      torch::Tensor out = buffer.narrow(1, (first + begin) * d, count * d).view({tokens, count, d});
      if (grads[i].defined()) {
        pieces.push_back({grads[i].narrow(1, begin, count), out, rotate});
      } else {
        out.zero_();
      }
    }
    first += heads[i];
  }
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(buffer) && d <= 8192 && position_ids.device() == buffer.device() &&
      inv_freq.device() == buffer.device()) {
    const c10::cuda::CUDAGuard guard(buffer.device());
    RotateInto(pieces, position_ids.to(torch::kInt64).contiguous(), inv_freq.to(torch::kFloat32).contiguous(),
               /*inverse=*/true);
    return buffer;
  }
#endif
  // The transposed rotation is the rotation by the opposite angles (cos even, sin odd).
  const torch::Tensor negated = -inv_freq;
  for (const RopePart& p : pieces) p.out.copy_(p.rotate ? PlainRope(p.x, position_ids, negated) : p.x);
  return buffer;
}

torch::Tensor FusedSoftmaxCrossEntropyRows(torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index,
                                           bool write_grad) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (KernelTensor(logits) && logits.dim() == 2 && logits.is_contiguous() && logits.size(1) < (int64_t{1} << 30) &&
      targets.defined() && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
      targets.scalar_type() == torch::kInt64 && targets.device() == logits.device()) {
    return SoftmaxCrossEntropyRowsOnKernel(logits, targets, ignore_index, write_grad);
  }
#endif
  return PlainSoftmaxCrossEntropyRows(logits, targets, ignore_index, write_grad);
}

bool DropoutRowsOnKernel(const torch::Tensor& x, torch::Tensor& y, const kernels::PhiloxState& philox,
                         uint64_t mask, uint32_t drop_below, float scale, bool accumulate) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  auto fits = [&](const torch::Tensor& t) {
    return KernelTensor(t) && t.dim() == 2 && t.sizes() == x.sizes() && t.scalar_type() == x.scalar_type() &&
           t.device() == x.device() && (t.size(1) <= 1 || t.stride(1) == 1);
  };
  if (!fits(x) || !fits(y)) return false;
  const c10::cuda::CUDAGuard guard(x.device());
  Check(kernels::DropoutRows(x.data_ptr(), RowStride(x), y.data_ptr(), RowStride(y), x.size(0), x.size(1), philox,
                             mask, drop_below, scale, accumulate, DTypeOf(x), StreamOf(x)));
  // Written through a raw pointer: tell autograd, as an in-place op would.
  torch::autograd::impl::bump_version(y);
  return true;
#else
  (void)x, (void)y, (void)philox, (void)mask, (void)drop_below, (void)scale, (void)accumulate;
  return false;
#endif
}

bool LoraDropoutBackwardOnKernel(const torch::Tensor& x, torch::Tensor& dropped, const torch::Tensor& u,
                                 const torch::Tensor& a, torch::Tensor& acc, const kernels::PhiloxState& philox,
                                 uint64_t mask, uint32_t drop_below, float scale) {
#ifdef TRAINERD_WITH_CUDA_KERNELS
  auto matrix = [&](const torch::Tensor& t) {
    return KernelTensor(t) && t.dim() == 2 && t.scalar_type() == x.scalar_type() && t.device() == x.device() &&
           (t.size(1) <= 1 || t.stride(1) == 1);
  };
  if (!matrix(x) || !matrix(dropped) || !matrix(u) || !matrix(a) || !matrix(acc)) return false;
  const int64_t rows = x.size(0), cols = x.size(1), rank = u.size(1);
  if (dropped.sizes() != x.sizes() || acc.sizes() != x.sizes() || u.size(0) != rows || a.size(0) != rank ||
      a.size(1) != cols) {
    return false;
  }
  if (!kernels::LoraDropoutBackwardFits(x.data_ptr(), RowStride(x), dropped.data_ptr(), RowStride(dropped),
                                        u.data_ptr(), RowStride(u), a.data_ptr(), RowStride(a), rank, acc.data_ptr(),
                                        RowStride(acc), cols)) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  Check(kernels::LoraDropoutBackward(x.data_ptr(), RowStride(x), dropped.data_ptr(), RowStride(dropped), u.data_ptr(),
                                     RowStride(u), a.data_ptr(), RowStride(a), rank, acc.data_ptr(), RowStride(acc),
                                     rows, cols, philox, mask, drop_below, scale, DTypeOf(x), StreamOf(x)));
  torch::autograd::impl::bump_version(dropped);
  torch::autograd::impl::bump_version(acc);
  return true;
#else
  (void)x, (void)dropped, (void)u, (void)a, (void)acc, (void)philox, (void)mask, (void)drop_below, (void)scale;
  return false;
#endif
}

}  // namespace trainerd::engine
