#include "engine/batch.h"

#include <algorithm>

#include "engine/linear_cross_entropy.h"

namespace trainerd::engine {
namespace {

// A CPU tensor on `device`: through pinned memory and a non-blocking copy on
// CUDA (a copy from pageable memory would wait for the stream's queued work).
torch::Tensor ToDevice(const torch::Tensor& t, const torch::Device& device) {
  if (!device.is_cuda()) return t.to(device);
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace

Batch MakeBatch(const std::vector<const TokenExample*>& examples, const torch::Device& device,
                const BatchShape& shape) {
  size_t width = static_cast<size_t>(std::max<int64_t>(shape.width, 0));
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
    double run = 0;  // length of the current example (a run of positions from 0)
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      if (t > 0 && !ex.position_ids.empty() && ex.position_ids[t] == 0) {
        batch.sum_squared_lengths += run * run;
        run = 0;
      }
      ++run;
    }
    batch.sum_squared_lengths += run * run;
  }
  batch.input_ids = ToDevice(ids, device);
  batch.labels = ToDevice(labels, device);
  if (packed) batch.position_ids = ToDevice(positions, device);
  if (packed && device.is_cuda()) batch.segments = PackedSegmentsFromPositions(positions, device, shape.segments);
  return batch;
}

torch::Tensor CausalLmLossSum(const LlamaModel& model, const Batch& batch) {
  const int64_t t = batch.input_ids.size(1);
  torch::Tensor hidden = model.Hidden(batch.input_ids, batch.position_ids, batch.segments);  // (B, T, H)
  // Position t scores labels[t + 1]; the last position of a row scores nothing.
  torch::Tensor targets = torch::constant_pad_nd(batch.labels.narrow(1, 1, t - 1), {0, 1}, kIgnoreIndex);
  return LinearCrossEntropySum(hidden.reshape({-1, hidden.size(-1)}), model.lm_head(), targets.reshape({-1}),
                               kIgnoreIndex);
}

}  // namespace trainerd::engine
