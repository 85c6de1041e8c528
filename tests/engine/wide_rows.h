// Inputs as the decoder's producers hand them to a widened LoRA group
// (engine/linear_group.h): the left part of rows with the group's spare
// columns after each, made inside a custom Function.
#pragma once

#include <torch/torch.h>

namespace trainerd::testing {

// x (N, in) copied into the left part of rows `in + spare` wide, made inside a
// custom Function as the fused kernels make their outputs (FusedRmsNorm,
// FusedSwiGlu): autograd treats views with that origin strictly when their
// base changes in place, which the widened node does to the spare columns.
class WideRowsFunction : public torch::autograd::Function<WideRowsFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x, int64_t spare) {
    const torch::Tensor rows = torch::empty({x.size(0), x.size(1) + spare}, x.options());
    torch::Tensor left = rows.narrow(1, 0, x.size(1));
    left.copy_(x);
    return left;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

}  // namespace trainerd::testing
