#include "engine/linear.h"

#include <cstdint>

namespace trainerd::engine {

torch::Tensor Linear::Forward(const torch::Tensor& x, bool training) const {
  // Flattened to (N, in) so that every product is one GEMM and the LoRA update
  // is added in the second GEMM's epilogue (addmm_ into the fresh output)
  // rather than by extra passes over the (N, out) output.
  const int64_t in = x.size(-1);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = weight.size(0);
  const torch::Tensor x2 = x.reshape({-1, in});
  torch::Tensor y = bias.defined() ? torch::addmm(bias, x2, weight.t()) : torch::mm(x2, weight.t());
  if (lora) {
    // The float32 adapter (PEFT's master copy) is applied in the model dtype:
    // its casts are (r, in) and (out, r), not the (N, in) activations that
    // PEFT casts to float32. In float32 models this is PEFT's arithmetic.
    // In place: autograd keeps x2 and the weights for the products, not y.
    const torch::Tensor a = lora->a.to(x.scalar_type()), b = lora->b.to(x.scalar_type());
    const torch::Tensor h = lora->dropout > 0 ? torch::dropout(x2, lora->dropout, training) : x2;
    y.addmm_(torch::mm(h, a.t()), b.t(), /*beta=*/1, /*alpha=*/lora->scaling);
  }
  return y.view(out_shape);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The tensors of a group, flattened for the autograd node: per layer its
// weight, then its bias if it has one, then A and B if it has LoRA.
struct GroupLayout {
  std::vector<int64_t> has_bias, has_lora;  // per layer, 0 or 1
  std::vector<double> scaling;              // per layer (LoRA layers)
};

// y_i = x W_i^T (+ bias_i) + s_i (x A_i^T) B_i^T for every layer i of the
// group, with A_1..A_k applied as one GEMM: t = x [A_1; ...; A_k]^T.
// Saves x, the (N, sum r) product t and the parameters.
class SharedInputLinearsFunction : public torch::autograd::Function<SharedInputLinearsFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList params,
                             const GroupLayout& layout) {
    const auto dtype = x.scalar_type();
    const size_t layers = layout.has_bias.size();
    // The LoRA A matrices of the group, stacked in the model dtype: (sum r, in).
    std::vector<torch::Tensor> a_parts;
    size_t p = 0;
    for (size_t i = 0; i < layers; ++i) {
      p += 1 + layout.has_bias[i];
      if (layout.has_lora[i]) {
        a_parts.push_back(params[p].to(dtype));
        p += 2;
      }
    }
    const torch::Tensor t = a_parts.empty() ? torch::Tensor() : torch::mm(x, torch::cat(a_parts, 0).t());  // (N, sum r)
    tensor_list outputs;
    p = 0;
    int64_t column = 0;
    for (size_t i = 0; i < layers; ++i) {
      const torch::Tensor& w = params[p++];
      torch::Tensor y = layout.has_bias[i] ? torch::addmm(params[p++], x, w.t()) : torch::mm(x, w.t());
      if (layout.has_lora[i]) {
        const torch::Tensor& b = params[p + 1];
        const int64_t r = b.size(1);
        y.addmm_(t.narrow(1, column, r), b.to(dtype).t(), /*beta=*/1, /*alpha=*/layout.scaling[i]);
        column += r;
        p += 2;
      }
      outputs.push_back(y);
    }
    tensor_list saved{x, t.defined() ? t : torch::Tensor()};
    for (const auto& param : params) saved.push_back(param);
    ctx->save_for_backward(saved);
    ctx->saved_data["has_bias"] = layout.has_bias;
    ctx->saved_data["has_lora"] = layout.has_lora;
    ctx->saved_data["scaling"] = layout.scaling;
    return outputs;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& t = saved[1];
    const at::ArrayRef<torch::Tensor> params = at::ArrayRef<torch::Tensor>(saved).slice(2);
    const auto has_bias = ctx->saved_data["has_bias"].toIntVector();
    const auto has_lora = ctx->saved_data["has_lora"].toIntVector();
    const auto scaling = ctx->saved_data["scaling"].toDoubleVector();
    const auto dtype = x.scalar_type();
    // x needs none when it comes from the (frozen) embedding: the first layer.
    const bool need_x = ctx->needs_input_grad(0);

    // The node's inputs: x, every parameter, the layout (no gradient).
    std::vector<torch::Tensor> grad_params(params.size());
    torch::Tensor grad_x;
    // u_i = s_i g_i B_i (N, r_i) of every LoRA layer, stacked beside its A_i:
    // one GEMM gives every dA, one more adds every LoRA term to grad_x.
    std::vector<torch::Tensor> u_parts, a_parts;
    std::vector<size_t> a_index;  // where each stacked A is in params
    size_t p = 0;                 // the layer's weight in params
    int64_t column = 0;           // the layer's columns in t
    for (size_t i = 0; i < has_bias.size(); ++i) {
      const torch::Tensor& g = grads[i];  // undefined when y_i was not used
      const size_t lora_at = p + 1 + has_bias[i];
      if (g.defined() && need_x) {
        if (grad_x.defined()) {
          grad_x.addmm_(g, params[p]);
        } else {
          grad_x = torch::mm(g, params[p]);
        }
      }
      if (has_lora[i]) {
        const torch::Tensor& a = params[lora_at];
        const torch::Tensor& b = params[lora_at + 1];
        const int64_t r = b.size(1);
        if (g.defined()) {
          const double s = scaling[i];
          // dB = s g^T t_i (out, r), back to B's float32.
          grad_params[lora_at + 1] = torch::mm(g.t(), t.narrow(1, column, r)).mul_(s).to(b.scalar_type());
          u_parts.push_back(torch::mm(g, b.to(dtype)).mul_(s));
          a_parts.push_back(a.to(dtype));
          a_index.push_back(lora_at);
        }
        column += r;
      }
      p = lora_at + 2 * has_lora[i];
    }
    if (!u_parts.empty()) {
      const torch::Tensor u = u_parts.size() == 1 ? u_parts[0] : torch::cat(u_parts, 1);  // (N, sum r)
      const torch::Tensor grad_a = torch::mm(u.t(), x);                                    // (sum r, in)
      int64_t row = 0;
      for (size_t j = 0; j < a_index.size(); ++j) {
        const int64_t r = a_parts[j].size(0);
        grad_params[a_index[j]] = grad_a.narrow(0, row, r).to(params[a_index[j]].scalar_type());
        row += r;
      }
      if (need_x) grad_x.addmm_(u, a_parts.size() == 1 ? a_parts[0] : torch::cat(a_parts, 0));
    }
    tensor_list result{grad_x};
    result.insert(result.end(), grad_params.begin(), grad_params.end());
    result.push_back(torch::Tensor());  // the layout
    return result;
  }
};

// Whether ForwardShared's node applies (see the header).
bool SharedNodeApplies(const std::vector<const Linear*>& layers, bool training) {
  for (const Linear* l : layers) {
    if (l->weight.requires_grad() || (l->bias.defined() && l->bias.requires_grad())) return false;
    if (l->lora && training && l->lora->dropout > 0) return false;
  }
  return true;
}

}  // namespace

std::vector<torch::Tensor> ForwardShared(const std::vector<const Linear*>& layers, const torch::Tensor& x,
                                         bool training) {
  std::vector<torch::Tensor> outputs;
  if (!SharedNodeApplies(layers, training)) {
    for (const Linear* l : layers) outputs.push_back(l->Forward(x, training));
    return outputs;
  }
  const int64_t in = x.size(-1);
  const torch::Tensor x2 = x.reshape({-1, in});
  GroupLayout layout;
  std::vector<torch::Tensor> params;
  for (const Linear* l : layers) {
    params.push_back(l->weight);
    layout.has_bias.push_back(l->bias.defined());
    if (l->bias.defined()) params.push_back(l->bias);
    layout.has_lora.push_back(l->lora.has_value());
    layout.scaling.push_back(l->lora ? l->lora->scaling : 0.0);
    if (l->lora) {
      params.push_back(l->lora->a);
      params.push_back(l->lora->b);
    }
  }
  tensor_list ys = SharedInputLinearsFunction::apply(x2, at::TensorList(params), layout);
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = layers[i]->weight.size(0);
    outputs.push_back(ys[i].view(shape));
  }
  return outputs;
}

}  // namespace trainerd::engine
