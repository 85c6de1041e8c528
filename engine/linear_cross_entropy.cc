#include "engine/linear_cross_entropy.h"

#include <algorithm>

#include "engine/fused_ops.h"

namespace trainerd::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, int64_t ignore_index, int64_t chunk_rows) {
    const bool need_hidden = hidden.requires_grad(), need_weight = weight.requires_grad();
    const int64_t n = hidden.size(0);
    const auto f32 = hidden.options().dtype(torch::kFloat32);
    torch::Tensor loss = torch::zeros({}, f32);
    torch::Tensor grad_hidden = need_hidden ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight = need_weight ? torch::zeros(weight.sizes(), f32) : torch::Tensor();
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - start);
      const torch::Tensor h = hidden.narrow(0, start, rows);
      const torch::Tensor t = targets.narrow(0, start, rows);
      // Logits in the model dtype (as the reference makes them); the fused op
      // turns them into each row's loss (float32 math) and, in place, into
      // d loss / d logits = softmax - onehot(target), zero on unlabelled rows.
      torch::Tensor logits = torch::mm(h, weight.t());  // (rows, V)
      const bool need_grad = need_hidden || need_weight;
      loss.add_(FusedSoftmaxCrossEntropyRows(logits, t, ignore_index, need_grad).sum());
      if (!need_grad) continue;
      const torch::Tensor& d_logits = logits;
      if (need_hidden) {
        torch::Tensor out = grad_hidden.narrow(0, start, rows);
        torch::mm_out(out, d_logits, weight);
      }
      if (need_weight) grad_weight.add_(torch::mm(d_logits.t(), h).to(torch::kFloat32));
    }
    ctx->save_for_backward({grad_hidden, grad_weight});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return loss;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grad_outputs[0];  // 0-dim float32: the loss is linear in it
    torch::Tensor grad_hidden = saved[0].defined() ? saved[0] * g.to(saved[0].scalar_type()) : torch::Tensor();
    torch::Tensor grad_weight;
    if (saved[1].defined()) {
      const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
      grad_weight = saved[1].mul(g).to(dtype);
    }
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t ignore_index, int64_t chunk_elements) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "LinearCrossEntropySum: hidden (N, H) and weight (V, H) expected, got ", hidden.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0), "LinearCrossEntropySum: targets (N) expected");
  const int64_t chunk_rows = std::max<int64_t>(1, chunk_elements / weight.size(0));
  torch::Tensor loss = LinearCrossEntropyFunction::apply(hidden, weight, targets, ignore_index, chunk_rows);
  return loss;
}

}  // namespace trainerd::engine
