#include "engine/linear.h"

#include <cstdint>

namespace trainerd::engine {

torch::Tensor Linear::Forward(const torch::Tensor& x, const DropoutMasks& dropout) const {
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
    // Dropout with the mask made from the pass's draw.
    const LoraDropoutMask mask = dropout.Of(0, lora->dropout);
    const torch::Tensor h = mask.active() ? PlainDropoutRows(x2, mask) : x2;
    y.addmm_(torch::mm(h, a.t()), b.t(), /*beta=*/1, /*alpha=*/lora->scaling);
  }
  return y.view(out_shape);
}

}  // namespace trainerd::engine
