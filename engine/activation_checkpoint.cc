#include "engine/activation_checkpoint.h"

#include <cstdint>
#include <vector>

namespace trainerd::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The layer inputs travel through saved_data (tensors, the segment length,
// the dropout draw's numbers) so that nothing outside the autograd graph must
// outlive the step.
// Undefined tensors are left out (an IValue holds defined tensors only).
void SaveTensor(AutogradContext* ctx, const char* key, const torch::Tensor& t) {
  if (t.defined()) ctx->saved_data[key] = t;
}

torch::Tensor LoadTensor(AutogradContext* ctx, const char* key) {
  auto it = ctx->saved_data.find(key);
  return it == ctx->saved_data.end() ? torch::Tensor() : it->second.toTensor();
}

void SaveInputs(AutogradContext* ctx, const LlamaModel::LayerInputs& in) {
  SaveTensor(ctx, "cu_seqlens", in.segments.cu_seqlens);
  ctx->saved_data["max_len"] = in.segments.max_len;
  ctx->saved_data["cudnn"] = static_cast<int64_t>(in.cudnn);
  SaveTensor(ctx, "positions", in.positions);
  SaveTensor(ctx, "cos", in.cos);
  SaveTensor(ctx, "sin", in.sin);
  SaveTensor(ctx, "mask", in.mask);
  // The draw itself, not the generator: the second forward makes the same
  // masks from it, also inside a CUDA graph (engine/lora_dropout.h).
  ctx->saved_data["dropout"] = DropoutDrawToInts(in.dropout);
}

LlamaModel::LayerInputs LoadInputs(AutogradContext* ctx) {
  LlamaModel::LayerInputs in;
  in.segments.cu_seqlens = LoadTensor(ctx, "cu_seqlens");
  in.segments.max_len = ctx->saved_data["max_len"].toInt();
  in.cudnn = static_cast<CudnnAttentionMode>(ctx->saved_data["cudnn"].toInt());
  in.positions = LoadTensor(ctx, "positions");
  in.cos = LoadTensor(ctx, "cos");
  in.sin = LoadTensor(ctx, "sin");
  in.mask = LoadTensor(ctx, "mask");
  in.dropout = DropoutDrawFromInts(ctx->saved_data["dropout"].toIntVector());
  return in;
}

// Input: the layer's input h, summed (the residual stream's base + delta),
// and the anchor; outputs: the layer's residual stream (base, delta).
class CheckpointedLayerFunction : public torch::autograd::Function<CheckpointedLayerFunction> {
 public:
  // `anchor` is a 0-dim tensor that requires grad, so that the outputs require
  // grad even where h does not (the first layer's input, frozen embeddings).
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& anchor,
                             const LlamaModel* model, int64_t index, const LlamaModel::LayerInputs& in) {
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
    const LlamaModel::LayerInputs in = LoadInputs(ctx);
    torch::Tensor h = ctx->get_saved_variables()[0].detach();
    h.requires_grad_(ctx->saved_data["h_requires_grad"].toBool());
    LlamaModel::Residual out;
    {
      torch::AutoGradMode enable(true);
      out = model->LayerForward(index, {h, {}}, in);
    }
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
                                       const LlamaModel::LayerInputs& in) {
  static thread_local torch::Tensor anchor = torch::zeros({}, torch::requires_grad());
  // One tensor kept for the backward, not two: the sum made here (a pass of
  // its own, on recomputed layers only).
  const torch::Tensor input = h.delta.defined() ? h.base + h.delta : h.base;
  const tensor_list out = CheckpointedLayerFunction::apply(input, anchor, &model, static_cast<int64_t>(index), in);
  return {out[0], out[1]};
}

}  // namespace trainerd::engine
