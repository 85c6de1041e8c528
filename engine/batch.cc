#include "engine/batch.h"

#include <algorithm>

namespace trainerd::engine {

Batch MakeBatch(const std::vector<const TokenExample*>& examples, const torch::Device& device) {
  size_t width = 0;
  for (const TokenExample* ex : examples) width = std::max(width, ex->input_ids.size());
  const int64_t rows = static_cast<int64_t>(examples.size());
  torch::Tensor ids = torch::zeros({rows, static_cast<int64_t>(width)}, torch::kInt64);
  torch::Tensor labels = torch::full({rows, static_cast<int64_t>(width)}, kIgnoreIndex, torch::kInt64);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto labels_a = labels.accessor<int64_t, 2>();
  const bool packed = std::any_of(examples.begin(), examples.end(),
                                  [](const TokenExample* ex) { return !ex->position_ids.empty(); });
  // Padding continues as a run of positions of its own, so that it forms its
  // own segment and no real token attends to it.
  torch::Tensor positions = torch::arange(static_cast<int64_t>(width), torch::kInt64).repeat({rows, 1});
  auto positions_a = positions.accessor<int64_t, 2>();
  Batch batch;
  for (int64_t r = 0; r < rows; ++r) {
    const TokenExample& ex = *examples[r];
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      ids_a[r][t] = ex.input_ids[t];
      labels_a[r][t] = ex.labels[t];
      positions_a[r][t] = ex.position_ids.empty() ? static_cast<int64_t>(t) : ex.position_ids[t];
    }
    for (size_t t = ex.input_ids.size(); t < width; ++t) {
      positions_a[r][t] = static_cast<int64_t>(t - ex.input_ids.size());
    }
    batch.input_tokens += static_cast<int64_t>(ex.input_ids.size());
    batch.target_tokens += ex.target_tokens();
  }
  batch.input_ids = ids.to(device);
  batch.labels = labels.to(device);
  if (packed) batch.position_ids = positions.to(device);
  if (packed && device.is_cuda()) batch.segments = PackedSegmentsFromPositions(positions, device);
  return batch;
}

torch::Tensor CausalLmLossSum(const LlamaModel& model, const Batch& batch) {
  const int64_t t = batch.input_ids.size(1);
  torch::Tensor hidden = model.Hidden(batch.input_ids, batch.position_ids, batch.segments);  // (B, T, H)
  torch::Tensor logits = model.Logits(hidden.narrow(1, 0, t - 1)).to(torch::kFloat32);  // (B, T-1, V)
  torch::Tensor targets = batch.labels.narrow(1, 1, t - 1).reshape({-1});
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), targets,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

}  // namespace trainerd::engine
