#include "engine/step_graph.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include <torch/version.h>

#if defined(TRAINERD_WITH_C10_CUDA) && TORCH_VERSION_MAJOR >= 2
#define TRAINERD_WITH_CUDA_GRAPHS 1
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace trainerd::engine {

StepGraphPlan PlanStepGraph(const TokenDataset& data, bool dropout, int64_t micro_batch_size) {
  StepGraphPlan plan;
  if (dropout) {
    plan.obstacle = "LoRA dropout draws new random numbers every step";
    return plan;
  }
  if (data.examples.empty()) return plan;
  const bool packed = !data.examples.front().position_ids.empty();
  size_t longest = 0, shortest = SIZE_MAX;
  int64_t tokens = 0, most_examples = 0;
  for (const TokenExample& ex : data.examples) {
    if (ex.position_ids.empty() == packed) {
      plan.obstacle = "packed and unpacked examples are mixed";
      return plan;
    }
    longest = std::max(longest, ex.input_ids.size());
    shortest = std::min(shortest, ex.input_ids.size());
    tokens += static_cast<int64_t>(ex.input_ids.size());
    int64_t examples = 0;
    for (int64_t p : ex.position_ids) examples += p == 0 ? 1 : 0;
    most_examples = std::max(most_examples, examples);
  }
  if (!packed) {
    if (shortest != longest) {
      plan.obstacle = "the examples differ in length (from " + std::to_string(shortest) + " to " +
                      std::to_string(longest) + " tokens), so batches differ in width";
    }
    return plan;
  }
  const double padded = static_cast<double>(longest) * static_cast<double>(data.examples.size());
  const double waste = 1.0 - static_cast<double>(tokens) / padded;
  if (waste > 0.1) {
    plan.obstacle = "padding every packed row to the longest (" + std::to_string(longest) + " tokens) would add " +
                    std::to_string(static_cast<int>(waste * 100 + 0.5)) + "% padding";
    return plan;
  }
  plan.shape.width = static_cast<int64_t>(longest);
  plan.shape.segments = micro_batch_size * (most_examples + 1);
  return plan;
}

#ifdef TRAINERD_WITH_CUDA_GRAPHS

struct StepGraph::State {
  std::vector<torch::Tensor> params;
  c10::cuda::CUDAStream stream;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  at::cuda::CUDAGraph graph;
  bool captured = false;
  std::vector<Batch> inputs;          // the graph's input buffers
  torch::Tensor targets;              // 0-dim float32
  torch::Tensor loss_sum;             // 0-dim float32, the graph's output
  std::vector<torch::Tensor> grads;   // per parameter: the gradient the graph writes (undefined: none)
  int64_t runs = 0;

  explicit State(const torch::Device& device) : stream(c10::cuda::getStreamFromPool(false, device.index())) {}
};

bool StepGraph::Supported(const torch::Device& device) { return device.is_cuda(); }

StepGraph::StepGraph(std::vector<torch::Tensor> params, const torch::Device& device)
    : state_(std::make_unique<State>(device)) {
  state_->params = std::move(params);
  // The new stream starts after everything queued on the current one.
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(device.index()));
  ready.block(state_->stream);
  state_->stream_guard.emplace(state_->stream);
}

StepGraph::~StepGraph() {
  // Whoever reads the results next (export, another job) does so on the
  // previous stream: everything queued here finishes first.
  state_->stream.synchronize();
  state_->stream_guard.reset();
}

bool StepGraph::captured() const { return state_->captured; }

namespace {

bool SameShape(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || a.sizes() == b.sizes());
}

// The tensors of a batch that a graph reads, in a fixed order (undefined where
// the batch has none); B is Batch or const Batch.
template <typename B>
auto Inputs(B& b) {
  return std::array<decltype(&b.input_ids), 4>{&b.input_ids, &b.labels, &b.position_ids, &b.segments.cu_seqlens};
}

}  // namespace

bool StepGraph::Matches(const std::vector<Batch>& batches) const {
  const State& s = *state_;
  if (!s.captured || batches.size() != s.inputs.size()) return false;
  for (size_t i = 0; i < batches.size(); ++i) {
    const auto from = Inputs(batches[i]), to = Inputs(s.inputs[i]);
    for (size_t k = 0; k < from.size(); ++k) {
      if (!SameShape(*from[k], *to[k])) return false;
    }
    if (batches[i].segments.max_len != s.inputs[i].segments.max_len) return false;
  }
  return true;
}

StatusOr<torch::Tensor> StepGraph::CaptureAndRun(const std::vector<Batch>& batches, int64_t targets,
                                                 const Body& body) {
  State& s = *state_;
  TORCH_CHECK(!s.captured, "StepGraph: captured already");
  s.inputs.clear();
  for (const Batch& b : batches) {
    Batch copy = b;
    for (torch::Tensor* t : Inputs(copy)) {
      if (t->defined()) *t = t->clone();
    }
    s.inputs.push_back(std::move(copy));
  }
  s.targets = torch::full({}, static_cast<double>(targets),
                          torch::TensorOptions().dtype(torch::kFloat32).device(batches.front().input_ids.device()));
  for (torch::Tensor& p : s.params) p.mutable_grad() = torch::Tensor();
  c10::cuda::CUDACachingAllocator::emptyCache();
  try {
    s.graph.capture_begin();
    s.loss_sum = body(s.inputs, s.targets);
    s.graph.capture_end();
  } catch (const std::exception& e) {
    // Leave the stream out of capture mode, so that the job can stop cleanly.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s.stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(s.stream.stream(), &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    }
    (void)cudaGetLastError();
    s.loss_sum = torch::Tensor();
    for (torch::Tensor& p : s.params) p.mutable_grad() = torch::Tensor();
    return Status::Error(std::string("recording the step as a CUDA graph failed: ") + e.what() +
                         "; set training.cuda_graphs: false to train without graphs");
  }
  s.grads.clear();
  for (const torch::Tensor& p : s.params) s.grads.push_back(p.grad());
  s.captured = true;
  s.graph.replay();
  ++s.runs;
  return s.loss_sum;
}

torch::Tensor StepGraph::Run(const std::vector<Batch>& batches, int64_t targets) {
  State& s = *state_;
  TORCH_CHECK(Matches(batches), "StepGraph::Run: the batches do not have the captured shapes");
  for (size_t i = 0; i < batches.size(); ++i) {
    const auto from = Inputs(batches[i]);  // const tensors
    const auto to = Inputs(s.inputs[i]);
    for (size_t k = 0; k < from.size(); ++k) {
      if (from[k]->defined()) to[k]->copy_(*from[k], /*non_blocking=*/true);
    }
  }
  s.targets.fill_(static_cast<double>(targets));
  s.graph.replay();
  for (size_t i = 0; i < s.params.size(); ++i) s.params[i].mutable_grad() = s.grads[i];
  ++s.runs;
  return s.loss_sum;
}

int64_t StepGraph::runs() const { return state_->runs; }

#else  // no CUDA graphs in this build

struct StepGraph::State {};

bool StepGraph::Supported(const torch::Device&) { return false; }
StepGraph::StepGraph(std::vector<torch::Tensor>, const torch::Device&) {
  TORCH_CHECK(false, "StepGraph: this build has no CUDA graphs (StepGraph::Supported)");
}
StepGraph::~StepGraph() = default;
bool StepGraph::captured() const { return false; }
bool StepGraph::Matches(const std::vector<Batch>&) const { return false; }
StatusOr<torch::Tensor> StepGraph::CaptureAndRun(const std::vector<Batch>&, int64_t, const Body&) {
  return Status::Error("this build has no CUDA graphs");
}
torch::Tensor StepGraph::Run(const std::vector<Batch>&, int64_t) {
  TORCH_CHECK(false, "StepGraph: this build has no CUDA graphs");
}
int64_t StepGraph::runs() const { return 0; }

#endif

}  // namespace trainerd::engine
