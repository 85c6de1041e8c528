#include "engine/lora_dropout.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include "engine/fused_ops.h"
#include "engine/kernels/philox.h"

#ifdef TRAINERD_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace trainerd::engine {

namespace {

float Scale(double p) { return static_cast<float>(1.0 / (1.0 - p)); }

// Mask m of x, scaled, into (or onto) y on the kernel; false where it does not apply.
bool OnKernel(const torch::Tensor& x, torch::Tensor& y, const LoraDropoutMask& m, float scale, bool accumulate) {
  return DropoutRowsOnKernel(x, y, m.draw->philox, static_cast<uint64_t>(m.mask), kernels::DropoutThreshold(m.p),
                             scale, accumulate);
}

// The mask on the host, as float32 0/1: the same bits as the kernel's (a
// device without the kernels, the CPU).
torch::Tensor HostKeepMask(const LoraDropoutMask& m, int64_t rows, int64_t cols) {
  TORCH_CHECK(m.draw->philox.seed_ptr == nullptr, "LoRA dropout: a draw recorded in a CUDA graph has no host mask");
  torch::Tensor mask = torch::empty({rows, cols}, torch::kFloat32);
  float* out = mask.data_ptr<float>();
  const int64_t total = rows * cols;
  const uint64_t seed = m.draw->philox.seed;
  const uint64_t number = m.draw->philox.offset + static_cast<uint64_t>(m.mask);
  const uint32_t drop_below = kernels::DropoutThreshold(m.p);
  at::parallel_for(0, (total + 7) / 8, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      const kernels::Philox4 words = kernels::DropoutWords(seed, number, static_cast<uint64_t>(q));
      for (int j = 0; j < 8 && 8 * q + j < total; ++j) {
        out[8 * q + j] = kernels::DropoutKeeps(kernels::DropoutDraw16(words, j), drop_below) ? 1.f : 0.f;
      }
    }
  });
  return mask;
}

}  // namespace

DropoutDraw NewDropoutDraw(const torch::Device& device, int64_t masks) {
  TORCH_CHECK(masks > 0, "NewDropoutDraw: ", masks, " masks");
  DropoutDraw draw;
  draw.masks = masks;
#ifdef TRAINERD_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    const std::lock_guard<std::mutex> lock(gen.mutex());
    // The offset advances by the masks (rounded up to 4, as the generator
    // requires): no two draws share a mask number.
    const at::PhiloxCudaState state =
        at::check_generator<at::CUDAGeneratorImpl>(gen)->philox_cuda_state(static_cast<uint64_t>((masks + 3) / 4 * 4));
    if (state.captured_) {
      draw.philox.seed_ptr = state.seed_.ptr;
      draw.philox.offset_ptr = state.offset_.ptr;
      draw.philox.offset_intragraph = state.offset_intragraph_;
    } else {
      draw.philox.seed = state.seed_.val;
      draw.philox.offset = state.offset_.val;
    }
    return draw;
  }
#else
  (void)device;
#endif
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(gen.mutex());
  draw.philox.seed = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  return draw;
}

std::vector<int64_t> DropoutDrawToInts(const DropoutDraw& d) {
  return {static_cast<int64_t>(d.philox.seed),
          static_cast<int64_t>(d.philox.offset),
          static_cast<int64_t>(reinterpret_cast<intptr_t>(d.philox.seed_ptr)),
          static_cast<int64_t>(reinterpret_cast<intptr_t>(d.philox.offset_ptr)),
          static_cast<int64_t>(d.philox.offset_intragraph),
          d.masks};
}

DropoutDraw DropoutDrawFromInts(const std::vector<int64_t>& v) {
  TORCH_CHECK(v.size() == 6, "DropoutDrawFromInts: ", v.size(), " integers");
  DropoutDraw d;
  d.philox.seed = static_cast<uint64_t>(v[0]);
  d.philox.offset = static_cast<uint64_t>(v[1]);
  d.philox.seed_ptr = reinterpret_cast<const int64_t*>(static_cast<intptr_t>(v[2]));
  d.philox.offset_ptr = reinterpret_cast<const int64_t*>(static_cast<intptr_t>(v[3]));
  d.philox.offset_intragraph = static_cast<uint64_t>(v[4]);
  d.masks = v[5];
  return d;
}

torch::Tensor DropoutKeepMask(const LoraDropoutMask& m, int64_t rows, int64_t cols,
                              const torch::TensorOptions& options) {
  TORCH_CHECK(m.active(), "DropoutKeepMask: no dropout draw");
  if (options.device().is_cuda() && FusedKernelsBuilt()) {
    const torch::Tensor ones = torch::ones({rows, cols}, options);
    torch::Tensor mask = torch::empty({rows, cols}, options);
    if (OnKernel(ones, mask, m, 1.f, /*accumulate=*/false)) return mask;
  }
  return HostKeepMask(m, rows, cols).to(options);
}

torch::Tensor PlainDropoutRows(const torch::Tensor& x, const LoraDropoutMask& m) {
  TORCH_CHECK(m.active() && x.dim() == 2, "PlainDropoutRows: a matrix and a dropout draw");
  return x * DropoutKeepMask(m, x.size(0), x.size(1), x.options()) * Scale(m.p);
}

torch::Tensor DropoutRows(const torch::Tensor& x, const LoraDropoutMask& m) {
  TORCH_CHECK(m.active() && x.dim() == 2, "DropoutRows: a matrix and a dropout draw");
  if (x.is_cuda()) {
    torch::Tensor y = torch::empty(x.sizes(), x.options());
    if (OnKernel(x, y, m, Scale(m.p), /*accumulate=*/false)) return y;
  }
  return PlainDropoutRows(x, m);
}

void AddDropoutRows(torch::Tensor& acc, const torch::Tensor& v, const LoraDropoutMask& m) {
  TORCH_CHECK(m.active() && v.dim() == 2 && acc.sizes() == v.sizes() && acc.scalar_type() == v.scalar_type(),
              "AddDropoutRows: matrices of one shape and dtype and a dropout draw");
  if (OnKernel(v, acc, m, Scale(m.p), /*accumulate=*/true)) return;
  acc.add_(PlainDropoutRows(v, m));
}

torch::Tensor LoraDropoutBackward(const torch::Tensor& x, const torch::Tensor& u, const torch::Tensor& a,
                                  torch::Tensor& acc, const LoraDropoutMask& m) {
  TORCH_CHECK(m.active() && x.dim() == 2 && acc.sizes() == x.sizes() && u.dim() == 2 && a.dim() == 2 &&
                  u.size(0) == x.size(0) && a.size(0) == u.size(1) && a.size(1) == x.size(1),
              "LoraDropoutBackward: x and acc (rows, cols), u (rows, rank), a (rank, cols) and a dropout draw");
  if (x.is_cuda()) {
    torch::Tensor dropped = torch::empty(x.sizes(), x.options());
    if (LoraDropoutBackwardOnKernel(x, dropped, u, a, acc, m.draw->philox, static_cast<uint64_t>(m.mask),
                                    kernels::DropoutThreshold(m.p), Scale(m.p))) {
      return dropped;
    }
  }
  AddDropoutRows(acc, torch::mm(u, a), m);
  return DropoutRows(x, m);
}

}  // namespace trainerd::engine
