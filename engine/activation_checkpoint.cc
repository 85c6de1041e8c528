#include "engine/activation_checkpoint.h"

#include <cstdint>
#include <mutex>

namespace trainerd::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

at::Generator DeviceGenerator(const torch::Device& device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device) : at::detail::getDefaultCPUGenerator();
}

torch::Tensor GeneratorState(at::Generator& gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetGeneratorState(at::Generator& gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The attention inputs travel through saved_data (tensors and the segment
// length) so that nothing outside the autograd graph must outlive the step.
// Undefined tensors are left out (an IValue holds defined tensors only).
void SaveTensor(AutogradContext* ctx, const char* key, const torch::Tensor& t) {
  if (t.defined()) ctx->saved_data[key] = t;
}

torch::Tensor LoadTensor(AutogradContext* ctx, const char* key) {
  auto it = ctx->saved_data.find(key);
  return it == ctx->saved_data.end() ? torch::Tensor() : it->second.toTensor();
}

void SaveInputs(AutogradContext* ctx, const LlamaModel::AttentionInputs& in) {
  SaveTensor(ctx, "cu_seqlens", in.segments.cu_seqlens);
  ctx->saved_data["max_len"] = in.segments.max_len;
  ctx->saved_data["cudnn"] = static_cast<int64_t>(in.cudnn);
  SaveTensor(ctx, "positions", in.positions);
  SaveTensor(ctx, "cos", in.cos);
  SaveTensor(ctx, "sin", in.sin);
  SaveTensor(ctx, "mask", in.mask);
}

LlamaModel::AttentionInputs LoadInputs(AutogradContext* ctx) {
  LlamaModel::AttentionInputs in;
  in.segments.cu_seqlens = LoadTensor(ctx, "cu_seqlens");
  in.segments.max_len = ctx->saved_data["max_len"].toInt();
  in.cudnn = static_cast<CudnnAttentionMode>(ctx->saved_data["cudnn"].toInt());
  in.positions = LoadTensor(ctx, "positions");
  in.cos = LoadTensor(ctx, "cos");
  in.sin = LoadTensor(ctx, "sin");
  in.mask = LoadTensor(ctx, "mask");
  return in;
}

// Input: the layer's input h, summed (the residual stream's base + delta),
// and the anchor; outputs: the layer's residual stream (base, delta).
class CheckpointedLayerFunction : public torch::autograd::Function<CheckpointedLayerFunction> {
 public:
  // `anchor` is a 0-dim tensor that requires grad, so that the outputs require
  // grad even where h does not (the first layer's input, frozen embeddings).
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& anchor,
                             const LlamaModel* model, int64_t index, const LlamaModel::AttentionInputs& in) {
    // The generator's state only where the layer draws random numbers: a
    // CUDA graph's capture must not read it (engine/step_graph.h).
    if (model->HasDropout()) {
      at::Generator gen = DeviceGenerator(model->device());
      ctx->saved_data["rng"] = GeneratorState(gen);
    }
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
    ctx->saved_data["index"] = index;
    ctx->saved_data["h_requires_grad"] = h.requires_grad();
    SaveInputs(ctx, in);
    ctx->save_for_backward({h});
    const LlamaModel::Residual out = model->LayerForward(static_cast<size_t>(index), {h, {}}, in);
    return {out.base, out.delta};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto* model = reinterpret_cast<const LlamaModel*>(ctx->saved_data["model"].toInt());
    const auto index = static_cast<size_t>(ctx->saved_data["index"].toInt());
    const LlamaModel::AttentionInputs in = LoadInputs(ctx);
    torch::Tensor h = ctx->get_saved_variables()[0].detach();
    h.requires_grad_(ctx->saved_data["h_requires_grad"].toBool());
    const bool rng = ctx->saved_data.find("rng") != ctx->saved_data.end();
    at::Generator gen = DeviceGenerator(model->device());
    torch::Tensor now;
    if (rng) {
      now = GeneratorState(gen);
      SetGeneratorState(gen, ctx->saved_data["rng"].toTensor());
    }
    LlamaModel::Residual out;
    {
      torch::AutoGradMode enable(true);
      out = model->LayerForward(index, {h, {}}, in);
    }
    if (rng) SetGeneratorState(gen, now);
    tensor_list outputs, grads;  // the outputs that got a gradient
    for (int i = 0; i < 2; ++i) {
      const torch::Tensor& produced = i == 0 ? out.base : out.delta;
      if (grad_outputs[i].defined() && produced.requires_grad()) {
        outputs.push_back(produced);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!outputs.empty()) torch::autograd::backward(outputs, grads);
    return {h.requires_grad() ? h.grad() : torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

LlamaModel::Residual CheckpointedLayer(const LlamaModel& model, size_t index, const LlamaModel::Residual& h,
                                       const LlamaModel::AttentionInputs& in) {
  static thread_local torch::Tensor anchor = torch::zeros({}, torch::requires_grad());
  // One tensor kept for the backward, not two: the sum made here (a pass of
  // its own, on recomputed layers only).
  const torch::Tensor input = h.delta.defined() ? h.base + h.delta : h.base;
  const tensor_list out = CheckpointedLayerFunction::apply(input, anchor, &model, static_cast<int64_t>(index), in);
  return {out[0], out[1]};
}

}  // namespace trainerd::engine
