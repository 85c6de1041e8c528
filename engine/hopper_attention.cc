#include "engine/hopper_attention.h"

#include <atomic>
#include <cmath>
#include <string>

#include "engine/environment_level.h"
#include "engine/hopper_rows.h"

#ifdef TRAINERD_WITH_HOPPER_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/hopper_attention.h"
#endif

namespace trainerd::engine {
namespace {

std::atomic<int64_t> runs{0};

// TRAINERD_HOPPER_ATTENTION as the environment gave it: 1 on, another value
// off, unset automatic (on where the kernels take the operands).
int EnvironmentSetting() { return EnvironmentLevel("TRAINERD_HOPPER_ATTENTION", 1); }

std::atomic<int>& Setting() {
  static std::atomic<int> on{EnvironmentSetting()};
  return on;
}

#ifdef TRAINERD_WITH_HOPPER_KERNELS
constexpr int64_t kHeadDim = 128;

// The kernels' operands over q, k, v (and o, lse) of one call.
kernels::HopperAttentionOperands Operands(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& o, const torch::Tensor& lse, int64_t batch,
                                          int64_t seq, int64_t heads, int64_t kv_heads) {
  kernels::HopperAttentionOperands a;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.q_stride = q.stride(0);
  a.k_stride = k.stride(0);
  a.v_stride = v.stride(0);
  a.o = o.data_ptr();
  a.o_stride = o.stride(0);
  a.lse = lse.data_ptr<float>();
  a.batch = batch;
  a.seq = seq;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  return a;
}

// The rotary embedding's positions and frequencies that q and k were rotated
// by, or neither (HopperCausalAttention). A struct, not two tensor arguments:
// autograd takes every tensor argument of a Function as an input, and
// refuses an undefined one.
struct RopeTables {
  torch::Tensor positions, inv_freq;
};

// O = attention(q, k, v) by the forward kernel; saves q, k, v, O and the
// log-sum-exps (and the rotary embedding's positions and frequencies where
// given); the backward hands the gradients back as column views of one
// buffer laid out as q|k|v, q's and k's rotated back where the rotary
// embedding's were given.
class HopperAttentionFunction : public torch::autograd::Function<HopperAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               const RopeTables& rope) {
    const c10::cuda::CUDAGuard guard(q.device());
    torch::Tensor o = torch::empty({batch * seq, heads * kHeadDim}, q.options());
    torch::Tensor lse = torch::empty({batch, heads, seq}, q.options().dtype(torch::kFloat32));
    const std::string error = kernels::HopperAttentionForward(
        Operands(q, k, v, o, lse, batch, seq, heads, kv_heads), c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(error.empty(), error);
    runs.fetch_add(1, std::memory_order_relaxed);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["shape"] = std::vector<int64_t>{batch, seq, heads, kv_heads};
    if (rope.positions.defined()) {
      ctx->saved_data["rope_positions"] = rope.positions.to(torch::kInt64).contiguous();
      ctx->saved_data["rope_inv_freq"] = rope.inv_freq.to(torch::kFloat32).contiguous();
    }
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const int64_t batch = shape[0], seq = shape[1], heads = shape[2], kv_heads = shape[3];
    const torch::Tensor& q = saved[0];
    torch::Tensor grad_o = grads[0];
    if (!HopperBf16Rows(grad_o)) grad_o = grad_o.contiguous();
    const c10::cuda::CUDAGuard guard(q.device());
    torch::Tensor grad = torch::empty({batch * seq, (heads + 2 * kv_heads) * kHeadDim}, q.options());
    torch::Tensor workspace = torch::empty({kernels::HopperAttentionWorkspaceBytes(batch, seq, heads)},
                                           q.options().dtype(torch::kUInt8));
    torch::Tensor dq = grad.narrow(1, 0, heads * kHeadDim);
    torch::Tensor dk = grad.narrow(1, heads * kHeadDim, kv_heads * kHeadDim);
    torch::Tensor dv = grad.narrow(1, (heads + kv_heads) * kHeadDim, kv_heads * kHeadDim);
    kernels::HopperAttentionGradientOperands g;
    g.forward = Operands(q, saved[1], saved[2], saved[3], saved[4], batch, seq, heads, kv_heads);
    g.grad_o = grad_o.data_ptr();
    g.grad_o_stride = grad_o.stride(0);
    g.grad_q = dq.data_ptr();
    g.grad_k = dk.data_ptr();
    g.grad_v = dv.data_ptr();
    g.grad_q_stride = g.grad_k_stride = g.grad_v_stride = grad.stride(0);
    g.workspace = workspace.data_ptr();
    torch::Tensor rope_positions, rope_inv_freq;  // kept alive through the launch
    if (ctx->saved_data.find("rope_positions") != ctx->saved_data.end()) {
      rope_positions = ctx->saved_data["rope_positions"].toTensor();
      rope_inv_freq = ctx->saved_data["rope_inv_freq"].toTensor();
      g.rope_positions = rope_positions.data_ptr<int64_t>();
      g.rope_inv_freq = rope_inv_freq.data_ptr<float>();
    }
    const std::string error = kernels::HopperAttentionBackward(g, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(error.empty(), error);
    return {dq, dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

}  // namespace

void SetHopperAttention(bool on) { Setting().store(on ? 1 : 0); }

void ResetHopperAttention() { Setting().store(EnvironmentSetting()); }

bool HopperAttentionEnabled() { return Setting().load(std::memory_order_relaxed) != 0; }

bool HopperAttentionIsAutomatic() { return Setting().load(std::memory_order_relaxed) == kAutomaticLevel; }

bool HopperAttentionFits(const torch::Device& device, torch::ScalarType dtype, int64_t head_dim) {
#ifdef TRAINERD_WITH_HOPPER_KERNELS
  if (!HopperAttentionEnabled() || head_dim != kHeadDim || !device.is_cuda() || dtype != torch::kBFloat16) {
    return false;
  }
  const c10::cuda::CUDAGuard guard(device);
  return kernels::HopperAttentionSuits();
#else
  (void)device, (void)dtype, (void)head_dim;
  return false;
#endif
}

bool HopperAttentionTakes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          int64_t head_dim) {
  return HopperBf16Rows(q) && HopperBf16Rows(k) && HopperBf16Rows(v) && k.device() == q.device() &&
         v.device() == q.device() && HopperAttentionFits(q.device(), q.scalar_type(), head_dim);
}

torch::Tensor HopperCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    const torch::Tensor& rope_positions, const torch::Tensor& rope_inv_freq) {
#ifdef TRAINERD_WITH_HOPPER_KERNELS
  TORCH_CHECK(q.size(0) == batch * seq && k.size(0) == batch * seq && v.size(0) == batch * seq &&
                  q.size(1) == heads * kHeadDim && k.size(1) == kv_heads * kHeadDim && v.size(1) == k.size(1),
              "HopperCausalAttention: q, k, v must be (batch * seq, heads * 128) and (batch * seq, kv_heads * 128)");
  TORCH_CHECK(rope_positions.defined() == rope_inv_freq.defined() &&
                  (!rope_positions.defined() ||
                   (rope_positions.numel() == batch * seq && rope_inv_freq.numel() == kHeadDim / 2 &&
                    rope_positions.device() == q.device() && rope_inv_freq.device() == q.device())),
              "HopperCausalAttention: the rotary embedding's positions (batch * seq) and inverse frequencies (64) "
              "go together, on q's device");
  return HopperAttentionFunction::apply(q, k, v, batch, seq, heads, kv_heads,
                                        RopeTables{rope_positions, rope_inv_freq});
#else
  (void)q, (void)k, (void)v, (void)batch, (void)seq, (void)heads, (void)kv_heads, (void)rope_positions,
      (void)rope_inv_freq;
  TORCH_CHECK(false, "HopperCausalAttention: this build has no Hopper kernels");
  return {};
#endif
}

int64_t HopperAttentionRuns() { return runs.load(); }

}  // namespace trainerd::engine
