#include "engine/fused_adamw.h"

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/version.h>

namespace trainerd::engine {
namespace {

// The optimizer's state map is keyed by the parameter's TensorImpl: a void*
// in LibTorch 2.x, its printed address in 1.13.
template <typename Key>
Key StateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << p.unsafeGetTensorImpl();
    return out.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

using StateMap = std::remove_reference_t<decltype(std::declval<torch::optim::AdamW&>().state())>;
using StateKeyType = typename StateMap::key_type;

torch::optim::AdamWParamState& EnsureState(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto& state = optimizer.state();
  const StateKeyType key = StateKey<StateKeyType>(p);
  auto it = state.find(key);
  if (it == state.end()) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    it = state.emplace(key, std::move(fresh)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

}  // namespace

bool FusedAdamW::Available(const torch::Device& device) {
#if TORCH_VERSION_MAJOR >= 2
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

void FusedAdamW::InitializeState() {
  for (auto& group : optimizer_.param_groups()) {
    for (auto& p : group.params()) EnsureState(optimizer_, p);
  }
}

void FusedAdamW::Step(const torch::Device& device) {
  if (!Available(device)) {
    optimizer_.step();
    return;
  }
#if TORCH_VERSION_MAJOR >= 2
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer_.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "FusedAdamW: amsgrad is not supported");
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    std::vector<torch::optim::AdamWParamState*> states;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      torch::optim::AdamWParamState& s = EnsureState(optimizer_, p);
      StepCounter& counter = steps_[p.unsafeGetTensorImpl()];
      if (counter.host_step != s.step()) {  // first use, or the state was loaded from a checkpoint
        counter.device_step = torch::full({}, static_cast<double>(s.step()),
                                          torch::TensorOptions().dtype(torch::kFloat32).device(p.device()));
        counter.host_step = s.step();
      }
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      steps.push_back(counter.device_step);
      states.push_back(&s);
    }
    if (params.empty()) continue;
    // The kernel reads the step counts as they are (bias corrections 1 - beta^step): they are
    // advanced first, on the device, as torch.optim does.
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(),
                      std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false);
    for (size_t i = 0; i < params.size(); ++i) {
      // The parameters changed in place: their version counters say so, as
      // any in-place op's do (what the model's cached LoRA copies check,
      // engine/linear_group.h), whether or not this LibTorch's fused op does.
      torch::autograd::impl::bump_version(params[i]);
      states[i]->step(states[i]->step() + 1);
      steps_[params[i].unsafeGetTensorImpl()].host_step = states[i]->step();
    }
  }
#endif
}

}  // namespace trainerd::engine
