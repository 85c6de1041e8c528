#include "engine/cudnn_attention.h"

#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "engine/llama_model.h"

namespace trainerd::engine {

namespace {

// The operator, if this LibTorch registers it with the schema this file calls:
// (query, key, value, attn_bias?, compute_log_sumexp, dropout_p, is_causal,
// return_debug_mask, *, scale?) -> (output, logsumexp, ...).
std::optional<c10::OperatorHandle> FindCudnnAttention() {
  auto handle = c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_cudnn_attention", ""});
  if (!handle) return std::nullopt;
  const auto& args = handle->schema().arguments();
  const char* expected[] = {"query",   "key",       "value",             "attn_bias", "compute_log_sumexp",
                            "dropout_p", "is_causal", "return_debug_mask", "scale"};
  if (args.size() != std::size(expected)) return std::nullopt;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() != expected[i]) return std::nullopt;
  }
  return *handle;
}

const std::optional<c10::OperatorHandle>& CudnnAttentionOp() {
  static const std::optional<c10::OperatorHandle> op = FindCudnnAttention();
  return op;
}

double RelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor w = want.to(torch::kFloat32);
  const double scale = w.abs().max().item<double>();
  return (got.to(torch::kFloat32) - w).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// Forward and backward of `mode` against flash attention on a small batch of
// deterministic inputs in the same layout the model passes (transposed views
// of (B, T, heads, d)). Any error, or a mismatch, says the mode does not run.
bool ModeMatchesFlash(const torch::Device& device, torch::ScalarType dtype, int64_t nh, int64_t nkv, int64_t d,
                      CudnnAttentionMode mode) {
  try {
    torch::AutoGradMode grad_mode(true);
    const int64_t b = 2, t = 64;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    // Inputs without the random generator (the job's seeds stay untouched).
    auto make = [&](int64_t heads, double phase) {
      return torch::sin(torch::arange(b * t * heads * d, f32) * 0.37 + phase).view({b, t, heads, d}).to(dtype);
    };
    const torch::Tensor q0 = make(nh, 0.0), k0 = make(nkv, 1.0), v0 = make(nkv, 2.0), w = make(nh, 3.0);
    auto run = [&](bool cudnn) {
      torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
      torch::Tensor v = v0.clone().requires_grad_(true);
      torch::Tensor out;  // (B, T, nh, d)
      if (cudnn) {
        out = CudnnCausalAttention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mode).transpose(1, 2);
      } else {
        out = VarlenCausalAttention(q.view({b * t, nh, d}), k.view({b * t, nkv, d}), v.view({b * t, nkv, d}),
                                    RowSegments(b, t, device))
                  .view({b, t, nh, d});
      }
      (out.to(torch::kFloat32) * w.to(torch::kFloat32)).sum().backward();
      return std::vector<torch::Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
    };
    const std::vector<torch::Tensor> got = run(true), want = run(false);
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].defined() || got[i].sizes() != want[i].sizes()) return false;
      const double err = RelativeError(got[i], want[i]);
      if (!(err <= 2e-2)) return false;  // NaN fails too
    }
    return true;
  } catch (const std::exception&) {  // c10::Error and its kin: the kernel refused
    return false;
  }
}

// Identity on the operator's output whose backward hands the operator an
// output gradient with the output's own strides. Why: PyTorch caches cuDNN's
// backward graph by shapes and q/k/v strides only, and with cuDNN 9.5.1 or
// later takes the output gradient in whatever layout it arrives, so a graph
// built for one gradient layout reads a later gradient of another layout
// wrongly (a widened o group's input gradient is a column view of a wider
// product; a plain Linear's is dense). One layout per key keeps the cache true.
class OutputLayoutGradient : public torch::autograd::Function<OutputLayoutGradient> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& out) {
    ctx->saved_data["strides"] = out.strides().vec();
    return out.view_as(out);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> strides = ctx->saved_data["strides"].toIntVector();
    const torch::Tensor& g = grads[0];  // the output's sizes
    if (!g.defined() || g.strides() == at::IntArrayRef(strides)) return {g};
    torch::Tensor matched = torch::empty_strided(g.sizes(), strides, g.options());
    matched.copy_(g);
    return {matched};
  }
};

}  // namespace

CudnnAttentionMode CudnnAttentionModeFor(const torch::Device& device, torch::ScalarType dtype, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim) {
  if (!device.is_cuda() || !CudnnAttentionOp()) return CudnnAttentionMode::kUnavailable;
  if (!UsesVarlenAttention(device, dtype, head_dim)) return CudnnAttentionMode::kUnavailable;
  if (kv_heads <= 0 || heads % kv_heads != 0) return CudnnAttentionMode::kUnavailable;
  static std::mutex mu;
  static std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, CudnnAttentionMode> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device.has_index() ? static_cast<int>(device.index()) : -1,
                                   static_cast<int>(dtype), heads, kv_heads, head_dim);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  CudnnAttentionMode mode = CudnnAttentionMode::kUnavailable;
  for (CudnnAttentionMode candidate : {CudnnAttentionMode::kNative, CudnnAttentionMode::kRepeated}) {
    if (candidate == CudnnAttentionMode::kRepeated && heads == kv_heads) break;  // the same call as kNative
    if (ModeMatchesFlash(device, dtype, heads, kv_heads, head_dim, candidate)) {
      mode = candidate;
      break;
    }
  }
  known.emplace(key, mode);
  return mode;
}

torch::Tensor CudnnCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   CudnnAttentionMode mode) {
  const auto& op = CudnnAttentionOp();
  TORCH_CHECK(op && mode != CudnnAttentionMode::kUnavailable, "cuDNN attention is not available here");
  torch::Tensor key = k, value = v;
  if (mode == CudnnAttentionMode::kRepeated && k.size(1) != q.size(1)) {
    const int64_t n_rep = q.size(1) / k.size(1);
    key = k.repeat_interleave(n_rep, 1);
    value = v.repeat_interleave(n_rep, 1);
  }
  // The log-sum-exp is what the backward needs; without gradients it is skipped.
  const bool needs_grad =
      torch::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  torch::jit::Stack stack{q,    key,  value, c10::IValue(), needs_grad, /*dropout_p=*/0.0, /*is_causal=*/true,
                          /*return_debug_mask=*/false, /*scale=*/c10::IValue()};
  op->callBoxed(&stack);
  TORCH_CHECK(!stack.empty() && stack[0].isTensor(), "cuDNN attention returned no output");
  const torch::Tensor out = stack[0].toTensor();
  return needs_grad ? OutputLayoutGradient::apply(out) : out;
}

}  // namespace trainerd::engine
