#include "engine/llama_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <torch/version.h>

#include "engine/activation_checkpoint.h"
#include "engine/epilogue_gemm.h"
#include "engine/fused_ops.h"
#include "engine/hopper_attention.h"

namespace trainerd::engine {

Linear* DecoderLayer::Module(const std::string& short_name) {
  if (short_name == "q_proj") return &q_proj;
  if (short_name == "k_proj") return &k_proj;
  if (short_name == "v_proj") return &v_proj;
  if (short_name == "o_proj") return &o_proj;
  if (short_name == "gate_proj") return &gate_proj;
  if (short_name == "up_proj") return &up_proj;
  if (short_name == "down_proj") return &down_proj;
  return nullptr;
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return PlainRmsNorm(x, weight, eps);
}

torch::Tensor RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  torch::Tensor exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
  torch::Tensor inv_freq = 1.0 / torch::pow(torch::tensor(config.rope_theta, torch::kFloat32), exponents);
  const RopeScaling& s = config.rope_scaling;
  switch (s.type) {
    case RopeScalingType::kNone:
      return inv_freq;
    case RopeScalingType::kLinear:
      return inv_freq / s.factor;
    case RopeScalingType::kLlama3: {
      // transformers' _compute_llama3_parameters.
      const double old_context = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = old_context / s.low_freq_factor;
      const double high_freq_wavelen = old_context / s.high_freq_factor;
      torch::Tensor wavelen = 2 * M_PI / inv_freq;
      torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
      torch::Tensor smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      torch::Tensor is_medium = torch::logical_not(wavelen < high_freq_wavelen) &
                                torch::logical_not(wavelen > low_freq_wavelen);
      return torch::where(is_medium, smoothed, scaled);
    }
  }
  return inv_freq;
}

namespace {

// (x1, x2) -> (-x2, x1) over the last dimension's halves.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// (B, nkv, T, d) -> (B, nkv * n_rep, T, d), each kv head repeated n_rep times
// in place (transformers' repeat_kv).
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

}  // namespace

torch::Tensor PackedAttentionMask(const torch::Tensor& position_ids) {
  const int64_t t = position_ids.size(1);
  torch::Tensor segment = (position_ids == 0).to(torch::kInt64).cumsum(1);  // (B, T)
  torch::Tensor same = segment.unsqueeze(2) == segment.unsqueeze(1);        // (B, T, T)
  torch::Tensor causal =
      torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(position_ids.device())).tril();
  return (same & causal).unsqueeze(1);
}

PackedSegments PackedSegmentsFromPositions(const torch::Tensor& position_ids, const torch::Device& device,
                                           int64_t capacity) {
  TORCH_CHECK(position_ids.dim() == 2, "position_ids must be (B, T), got ", position_ids.sizes());
  const torch::Tensor pos = position_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t t = pos.size(1), total = pos.numel();
  TORCH_CHECK(total <= std::numeric_limits<int32_t>::max(), "a batch of ", total,
              " tokens is too large for variable-length attention's int32 offsets");
  const int64_t* p = pos.data_ptr<int64_t>();
  std::vector<int32_t> cu;
  int64_t max_len = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (i % t == 0 || p[i] == 0) {  // a row or an example (or a row's padding) starts
      if (!cu.empty()) max_len = std::max(max_len, i - cu.back());
      cu.push_back(static_cast<int32_t>(i));
    }
  }
  if (!cu.empty()) max_len = std::max(max_len, total - cu.back());
  cu.push_back(static_cast<int32_t>(total));
  if (capacity > 0) {
    TORCH_CHECK(static_cast<int64_t>(cu.size()) - 1 <= capacity, "a batch of ", cu.size() - 1,
                " segments exceeds the capacity of ", capacity);
    cu.resize(static_cast<size_t>(capacity) + 1, static_cast<int32_t>(total));
    max_len = t;
  }
  PackedSegments s;
  torch::Tensor host = torch::from_blob(cu.data(), {static_cast<int64_t>(cu.size())}, torch::kInt32).clone();
  // Pinned and asynchronous on CUDA: no wait for the stream's queued work.
  s.cu_seqlens = device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host.to(device);
  s.max_len = max_len;
  return s;
}

namespace {

#if TORCH_VERSION_MAJOR >= 2
// Whether flash attention runs on this CUDA device. LibTorch builds without
// its flash kernels, and GPUs before Ampere, refuse the call with a c10::Error;
// asked once per device with a tiny call, then remembered.
bool FlashAttentionRunsOn(const torch::Device& device) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const int index = device.has_index() ? device.index() : -1;
  auto it = known.find(index);
  if (it != known.end()) return it->second;
  bool runs = false;
  try {
    torch::NoGradGuard no_grad;
    torch::Tensor x = torch::zeros({2, 1, 8}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
    torch::Tensor cu = torch::tensor({0, 2}, torch::kInt32).to(device);
    at::_flash_attention_forward(x, x, x, cu, cu, 2, 2, /*dropout_p=*/0.0, /*is_causal=*/true,
                                 /*return_debug_mask=*/false);
    runs = true;
  } catch (const std::exception&) {  // c10::Error and its kin: fall back to the dense mask
    runs = false;
  }
  known.emplace(index, runs);
  return runs;
}
#endif

}  // namespace

bool UsesVarlenAttention(const torch::Device& device, torch::ScalarType dtype, int64_t head_dim) {
#if TORCH_VERSION_MAJOR >= 2
  if (!device.is_cuda()) return false;
  if (dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;  // flash has no fp32
  if (head_dim % 8 != 0 || head_dim > 256) return false;                    // flash's backward needs these
  return FlashAttentionRunsOn(device);
#else
  // LibTorch 1.13 has no variable-length attention entry point.
  (void)device, (void)dtype, (void)head_dim;
  return false;
#endif
}

torch::Tensor VarlenCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const PackedSegments& segments) {
#if TORCH_VERSION_MAJOR >= 2
  // The same cu_seqlens for queries and keys (self-attention); is_causal is
  // then the usual causal mask inside each segment. Scale defaults to 1/sqrt(d).
  auto out = at::_flash_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), segments.cu_seqlens,
                                          segments.cu_seqlens, segments.max_len, segments.max_len,
                                          /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false);
  return std::get<0>(out);
#else
  (void)q, (void)k, (void)v, (void)segments;
  TORCH_CHECK(false, "variable-length attention needs LibTorch 2.x");
  return {};
#endif
}

torch::Tensor CausalAttentionExplicit(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& mask) {
  const int64_t n_rep = q.size(1) / k.size(1);
  torch::Tensor kr = RepeatKv(k, n_rep), vr = RepeatKv(v, n_rep);
  const int64_t t = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  torch::Tensor scores = torch::matmul(q, kr.transpose(2, 3)) * scale;  // (B, nh, T, T)
  torch::Tensor blocked =
      mask.defined() ? torch::logical_not(mask)
                     : torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.to(torch::kFloat32).masked_fill(blocked, -std::numeric_limits<float>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1).to(q.scalar_type());
  return torch::matmul(probs, vr);
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& mask) {
#if TORCH_VERSION_MAJOR >= 2
  const int64_t n_rep = q.size(1) / k.size(1);
  if (mask.defined()) {
    return at::scaled_dot_product_attention(q, RepeatKv(k, n_rep), RepeatKv(v, n_rep), mask, /*dropout_p=*/0.0,
                                            /*is_causal=*/false);
  }
  return at::scaled_dot_product_attention(q, RepeatKv(k, n_rep), RepeatKv(v, n_rep), /*attn_mask=*/{},
                                          /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  return CausalAttentionExplicit(q, k, v, mask);
#endif
}

// Row-aligned segments for an unpacked (B, T) batch: one segment per row (a
// row's trailing padding sits after its real tokens, so causal attention keeps
// it from them). Built on the device: no host synchronisation.
PackedSegments RowSegments(int64_t b, int64_t t, const torch::Device& device) {
  PackedSegments s;
  s.cu_seqlens = torch::arange(0, (b + 1) * t, t, torch::TensorOptions().dtype(torch::kInt32).device(device));
  s.max_len = t;
  return s;
}

LlamaModel::LayerInputs LlamaModel::PrepareAttention(int64_t b, int64_t t, const torch::Tensor& position_ids,
                                                         const PackedSegments& segments) const {
  LayerInputs in;
  const auto float_on_device = torch::TensorOptions().dtype(torch::kFloat32).device(device());
  if (UsesVarlenAttention()) {
    // Heads stay in (N, heads, d) with N = B*T flattened tokens, which is what
    // the linear layers give and what flash attention takes: no transposes.
    in.segments = segments.defined()         ? segments
                  : position_ids.defined()   ? PackedSegmentsFromPositions(position_ids, device())
                                             : RowSegments(b, t, device());
    if (!position_ids.defined() && !segments.defined()) {
      in.cudnn = CudnnAttentionModeFor(device(), dtype(), config_.num_attention_heads,
                                       config_.num_key_value_heads, config_.head_dim);
    }
    in.positions = position_ids.defined()
                       ? position_ids.reshape({-1})
                       : torch::arange(t, torch::TensorOptions().dtype(torch::kInt64).device(device())).repeat({b});
    if (!FusedKernelsBuilt()) {
      torch::Tensor freqs = in.positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;  // (N, d/2)
      torch::Tensor emb = torch::cat({freqs, freqs}, -1);
      in.cos = emb.cos().to(dtype()).unsqueeze(1);  // (N, 1, d)
      in.sin = emb.sin().to(dtype()).unsqueeze(1);
    }
    return in;
  }
  // Dense path (CPU, float32 CUDA, LibTorch 1.13): cos/sin (B or 1, 1, T, d)
  // in float32 cast to the model dtype as transformers does; packed rows get a
  // (B, 1, T, T) mask, and SDPA runs its math or memory-efficient kernel.
  torch::Tensor freqs;
  if (position_ids.defined()) {
    freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;  // (B, T, d/2)
    in.mask = PackedAttentionMask(position_ids);
  } else {
    freqs = torch::outer(torch::arange(t, float_on_device), inv_freq_).unsqueeze(0);  // (1, T, d/2)
  }
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  in.cos = emb.cos().to(dtype()).unsqueeze(1);
  in.sin = emb.sin().to(dtype()).unsqueeze(1);
  return in;
}

torch::Tensor LlamaModel::Attention(const DecoderLayer& layer, const torch::Tensor& x, const InputRecipe& x_recipe,
                                    const LayerInputs& in, const DropoutMasks& layer_masks) const {
  const int64_t b = x.size(0), t = x.size(1), d = config_.head_dim;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads;
  // With the rotary embedding in q|k|v's node (RopeGemmEnabled), the group
  // returns q and k rotated and cuDNN's attention reads q, k and v as views of
  // its product, which it keeps whole for its backward (what the rotated
  // copies and v's copy below keep otherwise). Not for flash attention's
  // packed rows: it takes q, k and v contiguous, so the copies would come back.
  // Attention on the kernels of our own (engine/hopper_attention.h) where they
  // take operands of this device, dtype and head size: decided once a layer.
  const bool hopper_attention = HopperAttentionFits(x.device(), x.scalar_type(), d);
  QkvRope rope;
  const bool rope_in_group = RopeGemmEnabled(x.device(), x.scalar_type()) && in.segments.defined() &&
                             !in.cos.defined() && in.cudnn != CudnnAttentionMode::kUnavailable;
  if (rope_in_group) {
    rope = {in.positions, inv_freq_, d, nh + nkv};
    // Attention of our own rotates q's and k's gradients back in its own
    // passes (dQ's conversion, dK's epilogue): the group's backward then
    // takes them as they come, with no pass of its own over them.
    rope.gradient_rotated_back = hopper_attention;
  }
  std::vector<torch::Tensor> qkv =
      ForwardGroup(layer.QkvGroup(), x, x_recipe, {layer_masks.draw, layer_masks.first + DecoderLayer::kQkvFirst},
                   nullptr, nullptr, rope_in_group ? &rope : nullptr);
  // Else v gets its own copy below (16 MB at 8B's 4x2048): attention keeps v
  // for its backward, and a view of the widened group's product would keep
  // all of q|k|v alive; q and k are rotated into new tensors anyway.
  auto o_proj = [&](const torch::Tensor& o) {
    return ForwardGroup(layer.OGroup(), o, {}, {layer_masks.draw, layer_masks.first + DecoderLayer::kOFirst})[0];
  };
  if (in.segments.defined()) {
    torch::Tensor q = qkv[0].view({b * t, nh, d});
    torch::Tensor k = qkv[1].view({b * t, nkv, d});
    torch::Tensor v = qkv[2].view({b * t, nkv, d});
    // Whether the group's node rotated q and k and takes their gradients
    // rotated back by attention of our own.
    const bool rotates_back = rope.done && rope.gradient_rotated_back;
    if (rope.done) {
      // Rotated by the group's node: q, k and v stay views of its product.
    } else if (in.cos.defined()) {
      q = q * in.cos + RotateHalf(q) * in.sin;
      k = k * in.cos + RotateHalf(k) * in.sin;
      v = v.contiguous();
    } else {
      // The rotations and v's copy as one node, whose backward hands the q|k|v
      // group its output gradient as one buffer (no concatenation).
      const std::array<torch::Tensor, 3> rotated = FusedQkvRope(q, k, v, in.positions, inv_freq_);
      q = rotated[0];
      k = rotated[1];
      v = rotated[2];
    }
    if (in.cudnn != CudnnAttentionMode::kUnavailable) {
      // The kernels of our own where they take the operands (the setting on,
      // a Hopper GPU, bf16, heads of 128): q, k and v as (B*T, heads * d).
      if (hopper_attention) {
        const torch::Tensor q2 = q.reshape({b * t, nh * d}), k2 = k.reshape({b * t, nkv * d});
        const torch::Tensor v2 = v.reshape({b * t, nkv * d});
        if (HopperAttentionTakes(q2, k2, v2, d)) {
          const torch::Tensor o = rotates_back
                                      ? HopperCausalAttention(q2, k2, v2, b, t, nh, nkv, rope.positions, inv_freq_)
                                      : HopperCausalAttention(q2, k2, v2, b, t, nh, nkv);
          return o_proj(o.view({b, t, nh * d}));
        }
      }
      // The group's product is laid out as the kernels take it: its gradient
      // would otherwise go unrotated.
      TORCH_CHECK(!rotates_back,
                  "attention of our own does not take the q|k|v product it was to rotate the gradients of back");
      // Rows of (B, T, heads, d) seen as (B, heads, T, d): no copies.
      auto rows = [&](const torch::Tensor& x, int64_t heads) { return x.view({b, t, heads, d}).transpose(1, 2); };
      torch::Tensor o = CudnnCausalAttention(rows(q, nh), rows(k, nkv), rows(v, nkv), in.cudnn);  // (B, nh, T, d)
      return o_proj(o.transpose(1, 2).reshape({b, t, nh * d}));
    }
    torch::Tensor o = VarlenCausalAttention(q, k, v, in.segments);  // (B*T, nh, d)
    return o_proj(o.view({b, t, nh * d}));
  }
  torch::Tensor q = qkv[0].view({b, t, nh, d}).transpose(1, 2);
  torch::Tensor k = qkv[1].view({b, t, nkv, d}).transpose(1, 2);
  torch::Tensor v = qkv[2].contiguous().view({b, t, nkv, d}).transpose(1, 2);
  q = q * in.cos + RotateHalf(q) * in.sin;
  k = k * in.cos + RotateHalf(k) * in.sin;
  torch::Tensor o = CausalAttention(q, k, v, in.mask);  // (B, nh, T, d)
  o = o.transpose(1, 2).reshape({b, t, nh * d});
  return o_proj(o);
}

bool LlamaModel::UsesVarlenAttention() const {
  return engine::UsesVarlenAttention(device(), dtype(), config_.head_dim);
}

LlamaModel::Residual LlamaModel::LayerForward(size_t index, const Residual& h, const LayerInputs& in) const {
  const DecoderLayer& layer = layers_[index];
  const double eps = config_.rms_norm_eps;
  // Each producer leaves its consumer group's spare columns, and tells it how
  // its input was made (engine/linear_group.h): the groups after the norms
  // keep no normalised copy (the norms keep their input, the residual sum).
  // The first norm's backward leaves the previous layer's down its spare
  // columns too, in the gradient of h.delta (down's output).
  InputRecipe normed;
  normed.norm_weight = layer.input_norm;
  torch::Tensor sum, x;
  std::tie(sum, x) = FusedAddRmsNorm(h.base, h.delta, layer.input_norm, eps, layer.qkv.spare_columns(),
                                     &normed.norm_rstd, DownGradientSpare(index));
  normed.norm_input = sum;
  const DropoutMasks masks{&in.dropout, DecoderLayer::kModules * static_cast<int64_t>(index)};
  const torch::Tensor attention = Attention(layer, x, normed, in, masks);
  normed.norm_weight = layer.post_attention_norm;
  torch::Tensor r;
  std::tie(r, x) = FusedAddRmsNorm(sum, attention, layer.post_attention_norm, eps, layer.gate_up.spare_columns(),
                                   &normed.norm_rstd);
  normed.norm_input = r;
  // SwiGLU in gate|up's GEMM where the GEMM of our own takes it (engine/epilogue_gemm.h);
  // FusedSwiGlu's node then returns that output, else makes it.
  SwiGluOutput made{layer.down.spare_columns(), {}};
  const DropoutMasks down_masks{masks.draw, masks.first + DecoderLayer::kDownFirst};
  // Down's LoRA product x A^T in gate|up's GEMM as well, where it is asked
  // for (engine/epilogue_gemm.h, DownLoraInGateUpEnabled) and down's LoRA
  // has no dropout in this pass.
  if (DownLoraInGateUpEnabled(x.device(), x.scalar_type()) && layer.down_proj.lora &&
      !down_masks.Of(0, layer.down_proj.lora->dropout).active()) {
    made.down_a = CurrentLoraA(layer.DownGroup());
  }
  const std::vector<torch::Tensor> gate_up =
      ForwardGroup(layer.GateUpGroup(), x, normed, {masks.draw, masks.first + DecoderLayer::kGateUpFirst}, &made);
  // With checkpointing on (memory first), a layer that keeps its activations
  // does not keep the SwiGLU output either: down makes it again in its
  // backward, one elementwise pass. Recomputed layers need no such saving.
  // At SwiGLU level 3 no layer keeps it: down's A gradient comes from its
  // input gradient's GEMM, which reads gate and up (kept for SwiGLU's
  // backward anyway), and h is made again only where that GEMM declines.
  const int swiglu_level = SwiGluGemmLevel(gate_up[0].device(), gate_up[0].scalar_type());
  InputRecipe activated;
  if ((gradient_checkpointing_ && !Recomputes(index)) || swiglu_level >= 3) {
    activated.gate = gate_up[0];
    activated.up = gate_up[1];
  }
  if (swiglu_level >= 2) {
    // SwiGLU's backward in down's node (its input gradient's GEMM, where the
    // GEMM of our own takes it): h made outside autograd. At level 3 gate|up's
    // node hands its LoRA's t on (SwiGluOutput).
    torch::Tensor act;
    {
      const torch::NoGradGuard no_grad;
      act = FusedSwiGlu(gate_up[0], gate_up[1], layer.down.spare_columns(), made.h);
    }
    // Down's t made by gate|up's GEMM counts only in the rows it wrote (act is them).
    const bool t_made = made.down_t_made && act.data_ptr() == made.h.data_ptr();
    const SwiGluInput swiglu{gate_up[0],     gate_up[1],    made.lora_t, made.lora_b_sums, made.lora_b_filled,
                             made.rank_gate, made.rank_up, t_made};
    return {r, ForwardGroup(layer.DownGroup(), act, activated, down_masks, nullptr, &swiglu)[0]};
  }
  const torch::Tensor act = FusedSwiGlu(gate_up[0], gate_up[1], layer.down.spare_columns(), made.h);
  return {r, ForwardGroup(layer.DownGroup(), act, activated, down_masks)[0]};
}

void LlamaModel::WidenLinearGroups() {
  for (DecoderLayer& l : layers_) {
    Widen(l.qkv, {&l.q_proj, &l.k_proj, &l.v_proj});
    Widen(l.o, {&l.o_proj});
    l.o.dense_input_gradient = true;  // attention's backward takes its output gradient dense
    Widen(l.gate_up, {&l.gate_proj, &l.up_proj});
    Widen(l.down, {&l.down_proj});
  }
}

torch::Tensor LlamaModel::Hidden(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                                 const PackedSegments& segments) const {
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  RefreshLoraCopies();
  Residual h{torch::embedding(embed_tokens_, input_ids), {}};  // (B, T, H)
  LayerInputs in = PrepareAttention(b, t, position_ids, segments);
  if (training_ && HasDropout()) {
    in.dropout = NewDropoutDraw(device(), DecoderLayer::kModules * static_cast<int64_t>(layers_.size()));
  }
  const bool recompute = training_ && torch::GradMode::is_enabled();
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = recompute && Recomputes(i) ? CheckpointedLayer(*this, i, h, in) : LayerForward(i, h, in);
  }
  return FusedAddRmsNorm(h.base, h.delta, norm_, config_.rms_norm_eps, 0, nullptr, DownGradientSpare(layers_.size()))
      .second;
}

void LlamaModel::RefreshLoraCopies() const {
  std::vector<GroupMembers> groups;
  for (const DecoderLayer& l : layers_) {
    groups.insert(groups.end(), {l.QkvGroup(), l.OGroup(), l.GateUpGroup(), l.DownGroup()});
  }
  engine::RefreshLoraCopies(groups);
}

bool LlamaModel::HasDropout() const {
  for (const DecoderLayer& l : layers_) {
    for (const Linear* m : l.Modules()) {
      if (m->lora && m->lora->dropout > 0) return true;
    }
  }
  return false;
}

torch::Tensor LlamaModel::Logits(const torch::Tensor& hidden) const {
  return torch::nn::functional::linear(hidden, lm_head_);
}

namespace {

class WeightTaker {
 public:
  WeightTaker(std::map<std::string, torch::Tensor> weights, std::string origin)
      : weights_(std::move(weights)), origin_(std::move(origin)) {}

  StatusOr<torch::Tensor> Take(const std::string& name, std::vector<int64_t> shape) {
    auto it = weights_.find(name);
    if (it == weights_.end()) {
      return Status::Error(origin_ + ": tensor " + name +
                           " is missing from the weights (config.json implies it)");
    }
    if (it->second.sizes().vec() != shape) {
      return Status::Error(origin_ + ": tensor " + name + " has shape " + ShapeString(it->second.sizes().vec()) +
                           " but config.json implies " + ShapeString(shape));
    }
    torch::Tensor t = std::move(it->second);
    weights_.erase(it);
    return t;
  }
  bool Has(const std::string& name) const { return weights_.count(name) > 0; }
  void Drop(const std::string& name) { weights_.erase(name); }
  const std::map<std::string, torch::Tensor>& rest() const { return weights_; }

  static std::string ShapeString(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

 private:
  std::map<std::string, torch::Tensor> weights_;
  std::string origin_;
};

StatusOr<Linear> TakeLinear(WeightTaker& w, const std::string& name, int64_t in, int64_t out, bool bias) {
  Linear l;
  l.name = name;
  TRAINERD_ASSIGN_OR_RETURN(l.weight, w.Take(name + ".weight", {out, in}));
  if (bias) {
    TRAINERD_ASSIGN_OR_RETURN(l.bias, w.Take(name + ".bias", {out}));
  }
  return l;
}

}  // namespace

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromWeights(const ModelConfig& config,
                                                               std::map<std::string, torch::Tensor> weights,
                                                               const std::string& origin) {
  std::unique_ptr<LlamaModel> m(new LlamaModel(config));
  WeightTaker w(std::move(weights), origin);
  const int64_t hidden = config.hidden_size, inter = config.intermediate_size, d = config.head_dim;
  const int64_t q_out = config.num_attention_heads * d, kv_out = config.num_key_value_heads * d;
  TRAINERD_ASSIGN_OR_RETURN(m->embed_tokens_, w.Take("model.embed_tokens.weight", {config.vocab_size, hidden}));
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    DecoderLayer layer;
    TRAINERD_ASSIGN_OR_RETURN(layer.input_norm, w.Take(p + "input_layernorm.weight", {hidden}));
    TRAINERD_ASSIGN_OR_RETURN(layer.post_attention_norm, w.Take(p + "post_attention_layernorm.weight", {hidden}));
    TRAINERD_ASSIGN_OR_RETURN(layer.q_proj, TakeLinear(w, p + "self_attn.q_proj", hidden, q_out, config.qkv_bias));
    TRAINERD_ASSIGN_OR_RETURN(layer.k_proj, TakeLinear(w, p + "self_attn.k_proj", hidden, kv_out, config.qkv_bias));
    TRAINERD_ASSIGN_OR_RETURN(layer.v_proj, TakeLinear(w, p + "self_attn.v_proj", hidden, kv_out, config.qkv_bias));
    TRAINERD_ASSIGN_OR_RETURN(layer.o_proj, TakeLinear(w, p + "self_attn.o_proj", q_out, hidden, config.o_bias));
    TRAINERD_ASSIGN_OR_RETURN(layer.gate_proj, TakeLinear(w, p + "mlp.gate_proj", hidden, inter, config.mlp_bias));
    TRAINERD_ASSIGN_OR_RETURN(layer.up_proj, TakeLinear(w, p + "mlp.up_proj", hidden, inter, config.mlp_bias));
    TRAINERD_ASSIGN_OR_RETURN(layer.down_proj, TakeLinear(w, p + "mlp.down_proj", inter, hidden, config.mlp_bias));
    // Some older checkpoints carry the rotary table; it is recomputed here.
    w.Drop(p + "self_attn.rotary_emb.inv_freq");
    m->layers_.push_back(std::move(layer));
  }
  TRAINERD_ASSIGN_OR_RETURN(m->norm_, w.Take("model.norm.weight", {hidden}));
  if (config.tie_word_embeddings) {
    // Some tied checkpoints still store lm_head.weight (a copy): the embedding wins, as in transformers.
    w.Drop("lm_head.weight");
    m->lm_head_ = m->embed_tokens_;
  } else {
    TRAINERD_ASSIGN_OR_RETURN(m->lm_head_, w.Take("lm_head.weight", {config.vocab_size, hidden}));
  }
  if (!w.rest().empty()) {
    std::string names;
    int shown = 0;
    for (const auto& [name, _] : w.rest()) {
      if (shown++ == 3) { names += ", ..."; break; }
      names += (names.empty() ? "" : ", ") + name;
    }
    return Status::Error(origin + ": " + std::to_string(w.rest().size()) + " tensor(s) not part of a " +
                         config.model_type + " model as config.json describes it: " + names);
  }
  m->inv_freq_ = RopeInverseFrequencies(config).to(m->device());
  return m;
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaModel::NamedWeights() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", embed_tokens_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayer& l = layers_[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.emplace_back(p + "input_layernorm.weight", l.input_norm);
    out.emplace_back(p + "post_attention_layernorm.weight", l.post_attention_norm);
    for (const Linear* lin : l.Modules()) {
      out.emplace_back(lin->name + ".weight", lin->weight);
      if (lin->bias.defined()) out.emplace_back(lin->name + ".bias", lin->bias);
    }
  }
  out.emplace_back("model.norm.weight", norm_);
  if (!config_.tie_word_embeddings) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

}  // namespace trainerd::engine
