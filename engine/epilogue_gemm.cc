#include "engine/epilogue_gemm.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "engine/environment_level.h"
#include "engine/hopper_rows.h"

#ifdef TRAINERD_WITH_HOPPER_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/hopper_gemm.h"
#endif

namespace trainerd::engine {
namespace {

std::atomic<int64_t> forward_runs{0}, down_lora_runs{0}, backward_runs{0}, rope_runs{0};

// The settings: unset (kAutomaticLevel) on for bf16 on a Hopper GPU (level
// 2, the rotary on), off elsewhere.
std::atomic<int>& Setting() {
  static std::atomic<int> level{EnvironmentLevel("TRAINERD_HOPPER_GEMM", 3)};
  return level;
}

std::atomic<int>& RopeSetting() {
  static std::atomic<int> on{EnvironmentLevel("TRAINERD_HOPPER_ROPE", 1)};
  return on;
}

std::atomic<int>& DownLoraSetting() {
  static std::atomic<int> on{EnvironmentLevel("TRAINERD_HOPPER_DOWN_LORA", 1)};
  return on;
}

// The automatic settings' rule: bf16 on a Hopper GPU, where the GEMM of our
// own takes products (measured faster there; elsewhere the plain graph).
bool AutoOn(const torch::Device& device, torch::ScalarType dtype) {
#ifdef TRAINERD_WITH_HOPPER_KERNELS
  if (!device.is_cuda() || dtype != torch::kBFloat16) return false;
  const c10::cuda::CUDAGuard guard(device);
  return kernels::CurrentDeviceIsHopper();
#else
  (void)device, (void)dtype;
  return false;
#endif
}

#ifdef TRAINERD_WITH_HOPPER_KERNELS
// The kernel's rule (kernels::HopperGemmSuits) on the device `where`.
bool Suits(const torch::Device& where, int64_t m, int64_t n, int64_t k) {
  const c10::cuda::CUDAGuard guard(where);
  return kernels::HopperGemmSuits(m, n, k);
}

// x (m, k) w^T for w (n, k) as stored: bf16 rows on one device, of a shape
// the kernel suits (the conditions every forward epilogue shares).
bool TakesProduct(const torch::Tensor& x, const torch::Tensor& w) {
  return HopperBf16Rows(x) && HopperBf16Rows(w) && x.device() == w.device() && w.size(1) == x.size(1) &&
         Suits(x.device(), x.size(0), w.size(0), x.size(1));
}

// SwiGLU's forward's conditions on the operands (the setting aside).
bool Takes(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns) {
  return w.size(0) % 16 == 0 && h_spare_columns >= 0 && h_spare_columns % 8 == 0 && TakesProduct(x, w);
}

// Down's A's stacked for GateUpWithSwiGlu: (rank, f) rows of x's dtype on
// its device, rank 1-256 within the spare columns, rows an even stride
// apart from a 4-byte aligned start (the kernel reads pairs).
bool DownATaken(const torch::Tensor& a, const torch::Tensor& x, int64_t f, int64_t h_spare_columns) {
  return a.defined() && a.dim() == 2 && a.size(1) == f && a.size(0) >= 1 && a.size(0) <= 256 &&
         a.size(0) <= h_spare_columns && a.stride(1) == 1 && a.stride(0) >= f && a.stride(0) % 2 == 0 &&
         reinterpret_cast<uintptr_t>(a.data_ptr()) % 4 == 0 && a.scalar_type() == x.scalar_type() &&
         a.device() == x.device();
}

// The rotary's tables: positions (m) int64 and inv_freq (64) float32, contiguous on `where`.
bool RopeTables(const torch::Tensor& positions, const torch::Tensor& inv_freq, int64_t m,
                const torch::Device& where) {
  return positions.defined() && positions.scalar_type() == torch::kInt64 && positions.dim() == 1 &&
         positions.size(0) == m && positions.is_contiguous() && positions.device() == where &&
         inv_freq.defined() && inv_freq.scalar_type() == torch::kFloat32 && inv_freq.dim() == 1 &&
         inv_freq.size(0) == 64 && inv_freq.is_contiguous() && inv_freq.device() == where;
}

// The backward's: x (N, k), w (k, f), gate and up the halves of one buffer.
bool TakesBackward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& gate,
                   const torch::Tensor& up) {
  if (!HopperBf16Rows(x) || !HopperBf16Rows(w) || !HopperBf16Rows(gate) || !HopperBf16Rows(up) ||
      x.device() != w.device() || gate.device() != x.device() || up.device() != x.device() || x.size(1) != w.size(0)) {
    return false;
  }
  const int64_t n = x.size(0), f = w.size(1);
  const bool halves = up.stride(0) == gate.stride(0) && gate.stride(0) >= 2 * f &&
                      static_cast<char*>(up.data_ptr()) == static_cast<char*>(gate.data_ptr()) + f * 2;
  return halves && f % 8 == 0 && gate.size(0) == n && gate.size(1) == f && up.sizes() == gate.sizes() &&
         Suits(x.device(), n, f, x.size(1));
}

// LoRA's sums' conditions (SwiGluBackwardLora): each thin operand given is
// (n, rank) rows of x's dtype on x's device, its rank 1-256 (gate|up's
// ranks adding up to its columns), and at least one is given.
bool LoraSumsTaken(const SwiGluBackwardLora& lora, const torch::Tensor& x, int64_t n, int64_t f) {
  auto thin = [&](const torch::Tensor& t, int64_t rank) {
    return t.dim() == 2 && t.size(0) == n && t.size(1) == rank && rank >= 1 && rank <= 256 && t.stride(1) == 1 &&
           t.stride(0) >= rank && t.scalar_type() == x.scalar_type() && t.device() == x.device();
  };
  const bool t_ok = !lora.gate_up_t.defined() ||
                    (lora.rank_gate >= 0 && lora.rank_up >= 0 && lora.rank_gate <= 256 && lora.rank_up <= 256 &&
                     thin(lora.gate_up_t, lora.rank_gate + lora.rank_up));
  const bool u_ok = !lora.down_u.defined() || thin(lora.down_u, lora.down_u.size(1));
  const bool sums_ok = !lora.gate_up_t.defined() || !lora.b_sums.defined() ||
                       (lora.b_sums.scalar_type() == torch::kFloat32 && lora.b_sums.is_contiguous() &&
                        lora.b_sums.device() == x.device() &&
                        lora.b_sums.sizes() == torch::IntArrayRef({lora.rank_gate + lora.rank_up, f}));
  return (lora.gate_up_t.defined() || lora.down_u.defined()) && t_ok && u_ok && sums_ok;
}

// D = out (m, n) from x (m, k) and w ((n, k), or (k, n) transposed), on x's
// device and current stream; counted in the epilogue's runs.
void Launch(kernels::HopperGemmOperands o, kernels::HopperEpilogue epilogue, const torch::Tensor& x,
            const torch::Tensor& w, bool w_transposed, const torch::Tensor& out) {
  o.x = x.data_ptr();
  o.x_stride = x.stride(0);
  o.w = w.data_ptr();
  o.w_stride = w.stride(0);
  o.w_transposed = w_transposed;
  o.d = out.data_ptr();
  o.d_stride = out.stride(0);
  o.m = x.size(0);
  o.k = x.size(1);
  const std::string error = kernels::HopperGemm(o, epilogue, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error.empty(), error);
  (epilogue == kernels::HopperEpilogue::kSwiGluBackward ? backward_runs
   : epilogue == kernels::HopperEpilogue::kRope         ? rope_runs
                                                        : forward_runs)
      .fetch_add(1, std::memory_order_relaxed);
}
#endif

}  // namespace

torch::Tensor GateUpWithSwiGlu(const torch::Tensor& x, const torch::Tensor& w, int64_t h_spare_columns,
                               torch::Tensor* h, const torch::Tensor& down_a, bool* down_t_made) {
  if (down_t_made != nullptr) *down_t_made = false;
#ifdef TRAINERD_WITH_HOPPER_KERNELS
  if (SwiGluGemmLevel(x.device(), x.scalar_type()) < 1 || !Takes(x, w, h_spare_columns)) return {};
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t m = x.size(0), f = w.size(0) / 2;
  torch::Tensor rows = torch::empty({m, f + h_spare_columns}, x.options());
  torch::Tensor made = rows.narrow(1, 0, f);
  torch::Tensor out = torch::empty({m, 2 * f}, x.options());
  kernels::HopperGemmOperands o;
  o.h = made.data_ptr();
  o.h_stride = made.stride(0);
  o.n = 2 * f;
  const bool down_t = down_t_made != nullptr && DownLoraInGateUpEnabled(x.device(), x.scalar_type()) &&
                      DownATaken(down_a, x, f, h_spare_columns);
  torch::Tensor sums;  // (m, rank rounded up to even) float32
  if (down_t) {
    const int64_t rank = down_a.size(0);
    sums = torch::empty({m, (rank + 1) / 2 * 2}, x.options().dtype(torch::kFloat32));
    o.lora_a = down_a.data_ptr();
    o.lora_a_stride = down_a.stride(0);
    o.rank_h = rank;
    o.lora_h_sums = sums.data_ptr<float>();
    o.lora_h_sums_stride = sums.stride(0);
  }
  Launch(o, kernels::HopperEpilogue::kSwiGlu, x, w, /*w_transposed=*/false, out);
  if (down_t) {
    rows.narrow(1, f, down_a.size(0)).copy_(sums.narrow(1, 0, down_a.size(0)));
    *down_t_made = true;
    down_lora_runs.fetch_add(1, std::memory_order_relaxed);
  }
  *h = made;
  return out;
#else
  (void)x, (void)w, (void)h_spare_columns, (void)h, (void)down_a;
  return {};
#endif
}

torch::Tensor DownInputGradientWithSwiGlu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& gate,
                                          const torch::Tensor& up, SwiGluBackwardLora* lora) {
  if (lora != nullptr) lora->done = false;
#ifdef TRAINERD_WITH_HOPPER_KERNELS
  const int level = SwiGluGemmLevel(x.device(), x.scalar_type());
  if (level < 2 || !TakesBackward(x, w, gate, up)) return {};
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(0), f = w.size(1);
  torch::Tensor out = torch::empty({n, 2 * f}, x.options());
  kernels::HopperGemmOperands o;
  o.gate_up = gate.data_ptr();
  o.gate_up_stride = gate.stride(0);
  o.n = f;
  if (level >= 3 && lora != nullptr && LoraSumsTaken(*lora, x, n, f)) {
    const auto f32 = x.options().dtype(torch::kFloat32);
    if (lora->gate_up_t.defined()) {
      if (!lora->b_sums.defined()) lora->b_sums = torch::empty({lora->rank_gate + lora->rank_up, f}, f32);
      o.lora_t = lora->gate_up_t.data_ptr();
      o.lora_t_stride = lora->gate_up_t.stride(0);
      o.rank_gate = lora->rank_gate;
      o.rank_up = lora->rank_up;
      o.lora_b_sums = lora->b_sums.data_ptr<float>();
    }
    if (lora->down_u.defined()) {
      lora->a_sums = torch::empty({lora->down_u.size(1), f}, f32);
      o.lora_u = lora->down_u.data_ptr();
      o.lora_u_stride = lora->down_u.stride(0);
      o.rank_h = lora->down_u.size(1);
      o.lora_a_sums = lora->a_sums.data_ptr<float>();
    }
    lora->done = true;
  }
  Launch(o, kernels::HopperEpilogue::kSwiGluBackward, x, w, /*w_transposed=*/true, out);
  return out;
#else
  (void)x;
  (void)w;
  (void)gate;
  (void)up;
  return {};
#endif
}

torch::Tensor ProductWithRope(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& positions,
                              const torch::Tensor& inv_freq, int64_t head_dim, int64_t rotate_columns) {
#ifdef TRAINERD_WITH_HOPPER_KERNELS
  if (!RopeGemmEnabled(x.device(), x.scalar_type()) || head_dim != 128 || rotate_columns <= 0 ||
      rotate_columns % 128 != 0 || rotate_columns > w.size(0) ||
      !RopeTables(positions, inv_freq, x.size(0), x.device()) || !TakesProduct(x, w)) {
    return {};
  }
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty({x.size(0), w.size(0)}, x.options());
  kernels::HopperGemmOperands o;
  o.positions = positions.data_ptr<int64_t>();
  o.inv_freq = inv_freq.data_ptr<float>();
  o.rotate_columns = rotate_columns;
  o.n = w.size(0);
  Launch(o, kernels::HopperEpilogue::kRope, x, w, /*w_transposed=*/false, out);
  return out;
#else
  (void)x, (void)w, (void)positions, (void)inv_freq, (void)head_dim, (void)rotate_columns;
  return {};
#endif
}

void SetSwiGluGemm(int level) { Setting().store(level); }

int SwiGluGemmLevel(const torch::Device& device, torch::ScalarType dtype) {
  const int level = Setting().load(std::memory_order_relaxed);
  return level != kAutomaticLevel ? level : AutoOn(device, dtype) ? 2 : 0;
}

EpilogueGemmCounts EpilogueGemmRuns() {
  return {forward_runs.load(), down_lora_runs.load(), backward_runs.load(), rope_runs.load()};
}

void SetRopeGemm(bool on) { RopeSetting().store(on ? 1 : 0); }

bool RopeGemmEnabled(const torch::Device& device, torch::ScalarType dtype) {
  const int on = RopeSetting().load(std::memory_order_relaxed);
  return on != kAutomaticLevel ? on == 1 : AutoOn(device, dtype);
}

void SetDownLoraInGateUp(bool on) { DownLoraSetting().store(on ? 1 : 0); }

bool DownLoraInGateUpEnabled(const torch::Device& device, torch::ScalarType dtype) {
  // Unset: off everywhere until the step has measured it.
  return DownLoraSetting().load(std::memory_order_relaxed) == 1 && SwiGluGemmLevel(device, dtype) >= 2;
}

bool SwiGluGemmLevelIsAutomatic() { return Setting().load(std::memory_order_relaxed) == kAutomaticLevel; }
bool RopeGemmIsAutomatic() { return RopeSetting().load(std::memory_order_relaxed) == kAutomaticLevel; }

bool EpilogueGemmSettingsGiven() {
  return std::getenv("TRAINERD_HOPPER_GEMM") != nullptr || std::getenv("TRAINERD_HOPPER_ROPE") != nullptr ||
         std::getenv("TRAINERD_HOPPER_DOWN_LORA") != nullptr;
}

}  // namespace trainerd::engine
