#include "engine/linear_cross_entropy.h"

#include <algorithm>

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
      const torch::Tensor valid = t != ignore_index;                          // (rows) bool
      const torch::Tensor index = torch::where(valid, t, torch::zeros_like(t)).unsqueeze(1);  // (rows, 1)
      torch::Tensor logits = torch::mm(h, weight.t()).to(torch::kFloat32);   // (rows, V)
      const torch::Tensor lse = torch::logsumexp(logits, 1);                 // (rows)
      const torch::Tensor picked = logits.gather(1, index).squeeze(1);
      loss.add_(((lse - picked) * valid).sum());
      if (!need_hidden && !need_weight) continue;
      // d loss / d logits = softmax - onehot(target), zero on unlabelled rows;
      // built in place in the float32 logits, then taken to the model dtype as
      // autograd would (the logits were made in it).
      torch::Tensor& probs = logits;
      probs.sub_(lse.unsqueeze(1)).exp_();
      probs.scatter_add_(1, index, torch::full({rows, 1}, -1.0, f32));
      probs.mul_(valid.unsqueeze(1));
      const torch::Tensor d_logits = probs.to(hidden.scalar_type());
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
