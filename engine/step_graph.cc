#include "engine/step_graph.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <torch/version.h>

// LibTorch 2.3 or later: the caching allocator's beginAllocateToPool with a stream filter.
#if defined(TRAINERD_WITH_C10_CUDA) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
#define TRAINERD_WITH_CUDA_GRAPHS 1
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace trainerd::engine {

BatchShape StepGraphPlan::ShapeOf(const std::vector<const TokenExample*>& examples) const {
  int64_t width = 0;
  for (const TokenExample* ex : examples) width = std::max(width, static_cast<int64_t>(ex->input_ids.size()));
  if (width_multiple > 0) width = (width + width_multiple - 1) / width_multiple * width_multiple;
  return BatchShape{std::min(width, longest), segments};
}

StepGraphPlan PlanStepGraph(const TokenDataset& data, int64_t micro_batch_size) {
  StepGraphPlan plan;
  if (data.examples.empty()) return plan;
  const bool packed = !data.examples.front().position_ids.empty();
  int64_t most_examples = 0;
  for (const TokenExample& ex : data.examples) {
    if (ex.position_ids.empty() == packed) {
      plan.obstacle = "packed and unpacked examples are mixed";
      return plan;
    }
    plan.longest = std::max(plan.longest, static_cast<int64_t>(ex.input_ids.size()));
    int64_t examples = 0;
    for (int64_t p : ex.position_ids) examples += p == 0 ? 1 : 0;
    most_examples = std::max(most_examples, examples);
  }
  plan.width_multiple = kGraphWidthMultiple * ((plan.longest + 2047) / 2048);
  // Packed: each row's examples, and one more segment for the row's padding.
  if (packed) plan.segments = micro_batch_size * (most_examples + 1);
  return plan;
}

#ifdef TRAINERD_WITH_CUDA_GRAPHS

namespace {

// Steps a run takes kernel by kernel before it records a graph: they make what
// a capture must find made (cuBLAS's workspace on the stream, the optimizer's
// state, the LoRA copies, cuDNN's plans for the first shapes).
constexpr int64_t kEagerStepsBeforeGraph = 2;

using PoolId = decltype(std::declval<at::cuda::CUDAGraph&>().pool());

// The tensors of a batch that a graph reads, in a fixed order (undefined where
// the batch has none); B is Batch or const Batch.
template <typename B>
auto Inputs(B& b) {
  return std::array<decltype(&b.input_ids), 4>{&b.input_ids, &b.labels, &b.position_ids, &b.segments.cu_seqlens};
}

// What makes two micro-batches replay the same graph: their tensors' sizes
// (-1 for an absent one) and the segments' longest.
std::vector<int64_t> ShapeKey(const Batch& b) {
  std::vector<int64_t> key;
  for (const torch::Tensor* t : Inputs(b)) {
    key.push_back(t->defined() ? t->dim() : -1);
    if (t->defined()) key.insert(key.end(), t->sizes().begin(), t->sizes().end());
  }
  key.push_back(b.segments.max_len);
  return key;
}

// While alive, the stream's allocations come from the graphs' pool (a shape's
// first, kernel-by-kernel micro-batch: its memory is the pool's, not beside it).
class AllocateToPool {
 public:
  AllocateToPool(c10::DeviceIndex device, PoolId pool, cudaStream_t stream) : device_(device), pool_(pool) {
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(device_, pool_,
                                                         [stream](cudaStream_t s) { return s == stream; });
  }
  ~AllocateToPool() {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, pool_);
    c10::cuda::CUDACachingAllocator::releasePool(device_, pool_);  // begin counted a use of the pool
  }
  AllocateToPool(const AllocateToPool&) = delete;
  AllocateToPool& operator=(const AllocateToPool&) = delete;

 private:
  c10::DeviceIndex device_;
  PoolId pool_;
};

}  // namespace

struct StepGraph::State {
  struct Graph {
    at::cuda::CUDAGraph graph;
    Batch inputs;        // the graph's input buffers
    torch::Tensor loss;  // 0-dim float32, the graph's output (in the pool)
  };
  std::vector<torch::Tensor> params;
  Body body;
  c10::DeviceIndex device;
  c10::cuda::CUDAStream stream;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  std::map<std::vector<int64_t>, std::unique_ptr<Graph>> graphs;
  std::set<std::vector<int64_t>> seen;  // shapes run kernel by kernel so far
  std::optional<PoolId> pool;           // the graphs' memory pool, from the first capture on
  torch::Tensor targets;                // 0-dim float32
  int64_t steps = 0, micro_batches = 0, graph_runs = 0;

  State(const torch::Device& d, Body b)
      : body(std::move(b)), device(d.index()), stream(c10::cuda::getStreamFromPool(false, d.index())) {}
};

bool StepGraph::Supported(const torch::Device& device) { return device.is_cuda(); }

StepGraph::StepGraph(std::vector<torch::Tensor> params, const torch::Device& device, Body body)
    : state_(std::make_unique<State>(device, std::move(body))) {
  state_->params = std::move(params);
  state_->targets = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
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
  state_->graphs.clear();
  state_->stream_guard.reset();
}

void StepGraph::BeginStep(int64_t targets) {
  State& s = *state_;
  std::vector<torch::Tensor> grads;
  for (torch::Tensor& p : s.params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  at::_foreach_zero_(grads);
  s.targets.fill_(static_cast<double>(targets));
  ++s.steps;
}

StatusOr<torch::Tensor> StepGraph::Run(const Batch& batch) {
  State& s = *state_;
  ++s.micro_batches;
  const std::vector<int64_t> key = ShapeKey(batch);
  auto found = s.graphs.find(key);
  if (found != s.graphs.end()) {
    State::Graph& g = *found->second;
    const auto from = Inputs(batch);  // const tensors
    const auto to = Inputs(g.inputs);
    for (size_t k = 0; k < from.size(); ++k) {
      if (from[k]->defined()) to[k]->copy_(*from[k], /*non_blocking=*/true);
    }
    g.graph.replay();
    ++s.graph_runs;
    return g.loss;
  }
  if (s.steps <= kEagerStepsBeforeGraph || !s.seen.count(key)) {
    s.seen.insert(key);
    std::optional<AllocateToPool> in_pool;
    if (s.pool) in_pool.emplace(s.device, *s.pool, s.stream.stream());
    return s.body(batch, s.targets);
  }
  // Record: the input buffers first (outside the pool: they outlive every
  // replay), then the body into the pool.
  auto g = std::make_unique<State::Graph>();
  g->inputs = batch;
  for (torch::Tensor* t : Inputs(g->inputs)) {
    if (t->defined()) *t = t->clone();
  }
  // Free cached blocks outside the pool, so that the pool does not hold the
  // same memory a second time.
  c10::cuda::CUDACachingAllocator::emptyCache();
  try {
    if (s.pool) {
      g->graph.capture_begin(*s.pool);
    } else {
      g->graph.capture_begin();
    }
    g->loss = s.body(g->inputs, s.targets);
    g->graph.capture_end();
  } catch (const std::exception& e) {
    // Leave the stream out of capture mode, so that the job can stop cleanly.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s.stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(s.stream.stream(), &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    }
    (void)cudaGetLastError();
    return Status::Error(std::string("recording a micro-batch as a CUDA graph failed: ") + e.what() +
                         "; set training.cuda_graphs: false to train without graphs");
  }
  if (!s.pool) s.pool = g->graph.pool();
  g->graph.replay();
  ++s.graph_runs;
  const torch::Tensor loss = g->loss;
  s.graphs.emplace(key, std::move(g));
  return loss;
}

int64_t StepGraph::micro_batches() const { return state_->micro_batches; }
int64_t StepGraph::graph_runs() const { return state_->graph_runs; }
int64_t StepGraph::graphs() const { return static_cast<int64_t>(state_->graphs.size()); }

#else  // no CUDA graphs in this build

struct StepGraph::State {};

bool StepGraph::Supported(const torch::Device&) { return false; }
StepGraph::StepGraph(std::vector<torch::Tensor>, const torch::Device&, Body) {
  TORCH_CHECK(false, "StepGraph: this build has no CUDA graphs (StepGraph::Supported)");
}
StepGraph::~StepGraph() = default;
void StepGraph::BeginStep(int64_t) {}
StatusOr<torch::Tensor> StepGraph::Run(const Batch&) { return Status::Error("this build has no CUDA graphs"); }
int64_t StepGraph::micro_batches() const { return 0; }
int64_t StepGraph::graph_runs() const { return 0; }
int64_t StepGraph::graphs() const { return 0; }

#endif

}  // namespace trainerd::engine
