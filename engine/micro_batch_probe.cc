#include "engine/micro_batch_probe.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "engine/batch.h"
#include "engine/device_memory.h"

namespace trainerd::engine {
namespace {

std::vector<at::Generator> Generators(const torch::Device& device) {
  std::vector<at::Generator> gens = {at::detail::getDefaultCPUGenerator()};
  if (device.is_cuda()) gens.push_back(at::globalContext().defaultGenerator(device));
  return gens;
}

std::string GiB(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
  return buf;
}

void DropGradients(const NamedTensors& trainable) {
  for (const auto& [_, t] : trainable) t.mutable_grad() = torch::Tensor();
}

}  // namespace

StatusOr<MicroBatchChoice> FindMicroBatchSize(LlamaModel& model, const TokenDataset& train,
                                              const NamedTensors& trainable) {
  MicroBatchChoice choice;
  const torch::Device device = model.device();
  if (!device.is_cuda()) {
    choice.explanation = "1 on the CPU (no device memory to fill)";
    return choice;
  }
  if (train.examples.empty()) return Status::Error("micro_batch_size: auto: the training set is empty");
  const TokenExample* longest = train.Longest();
  const int64_t total = TotalMemoryBytes(device);
  const int64_t limit = total / 10 * 9;
  const int64_t cap = std::min<int64_t>(kMaxAutoMicroBatch, static_cast<int64_t>(train.examples.size()));

  std::vector<at::Generator> gens = Generators(device);
  std::vector<torch::Tensor> rng;
  for (at::Generator& g : gens) {
    std::lock_guard<std::mutex> lock(g.mutex());
    rng.push_back(g.get_state());
  }
  std::vector<torch::Tensor> optimizer_state;  // AdamW's exp_avg and exp_avg_sq, reserved
  for (const auto& [_, t] : trainable) {
    optimizer_state.push_back(torch::empty_like(t));
    optimizer_state.push_back(torch::empty_like(t));
  }
  const bool was_training = model.training();
  model.set_training(true);

  int64_t chosen = 0, chosen_peak = 0;
  std::string stop = "the largest size tried";
  for (int64_t b = 1; b <= cap; b *= 2) {
    int64_t peak = 0;
    try {
      ResetPeakMemory(device);
      std::vector<const TokenExample*> rows(static_cast<size_t>(b), longest);
      Batch batch = MakeBatch(rows, device);
      torch::Tensor loss = CausalLmLossSum(model, batch);
      (loss / static_cast<double>(std::max<int64_t>(1, batch.target_tokens))).backward();
      torch::cuda::synchronize(device.index());
      peak = PeakMemoryBytes(device);
    } catch (const c10::Error& e) {
      if (!IsOutOfMemory(e)) throw;
      DropGradients(trainable);
      ReleaseCachedMemory(device);
      stop = std::to_string(b) + " ran out of memory";
      break;
    }
    DropGradients(trainable);
    if (peak > limit) {
      stop = std::to_string(b) + " peaked at " + GiB(peak) + ", over 90% of the card's " + GiB(total);
      break;
    }
    chosen = b;
    chosen_peak = peak;
  }
  model.set_training(was_training);
  optimizer_state.clear();
  ReleaseCachedMemory(device);
  ResetPeakMemory(device);
  for (size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(rng[i]);
  }
  const std::string tokens = std::to_string(longest->input_ids.size());
  if (chosen == 0) {
    return Status::Error("micro_batch_size: auto: not even one example of " + tokens + " tokens fits on " +
                         DeviceModelName(device) + " (" + stop + "); lower data.max_seq_len, set "
                         "training.gradient_checkpointing: true, or use a smaller model.dtype");
  }
  choice.micro_batch_size = chosen;
  choice.explanation = std::to_string(chosen) + " (longest example " + tokens + " tokens; peak " + GiB(chosen_peak) +
                       " of " + GiB(total) + "; " + (chosen == cap && stop == "the largest size tried"
                                                          ? "the cap, min(" + std::to_string(kMaxAutoMicroBatch) +
                                                                ", examples)"
                                                          : stop) +
                       ")";
  return choice;
}

}  // namespace trainerd::engine
