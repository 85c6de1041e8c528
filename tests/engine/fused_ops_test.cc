// engine/fused_ops.h: the fused RMSNorm, SwiGLU and RoPE against the plain
// LibTorch formulas.
//  - CPU (CI): Fused* is Plain* bit for bit, forward and gradients, and the
//    Plain* formulas match independent float64 computations.
//  - CUDA with the kernels built: for each dtype and shape, fresh random
//    inputs, the kernels' outputs and gradients against Plain* on the inputs
//    upcast to float64, by ||out - ref|| / ||ref|| within 1e-2 (bf16), 2e-3
//    (fp16), 1e-5 (fp32), nothing non-finite; the launchers write every
//    element of NaN-poisoned outputs, and dweight is the same bits twice.
// The seed is printed; TRAINERD_TEST_SEED replays one. TRAINERD_FUSED_TEST_QUICK=1
// shrinks the largest shapes (scripts/gpu-sanitize.sh: tools run slowly).
#include "engine/fused_ops.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#ifdef TRAINERD_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/fused_kernels.h"
#endif

namespace trainerd::engine {
namespace {

constexpr double kEps = 1e-5;

// Seeds torch's generators once per test: fresh inputs every run, replayable.
void SeedForTest() {
  const char* env = std::getenv("TRAINERD_TEST_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  torch::manual_seed(seed);
  std::printf("[  seed    ] TRAINERD_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
}

bool Quick() { return std::getenv("TRAINERD_FUSED_TEST_QUICK") != nullptr; }

// ||a - b|| / ||b|| (Frobenius), in float64.
double NormRelError(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.detach().to(torch::kFloat64), y = b.detach().to(torch::kFloat64);
  return (x - y).norm().item<double>() / y.norm().item<double>();
}

bool AllFinite(const torch::Tensor& t) { return torch::isfinite(t.detach()).all().item<bool>(); }

double Tolerance(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return 1e-2;
  if (dtype == torch::kFloat16) return 2e-3;
  return 1e-5;
}

std::string DTypeName(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return "bf16";
  if (dtype == torch::kFloat16) return "fp16";
  return "fp32";
}

// Normal(mean, scale) values of `dtype` on `device`, never all zero. offset > 0
// places the tensor `offset` elements into a larger allocation, so its data
// pointer is not 16-byte aligned (the kernels' scalar path).
torch::Tensor Random(std::vector<int64_t> sizes, torch::ScalarType dtype, const torch::Device& device,
                     double scale = 1.0, double mean = 0.0, int64_t offset = 0) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  torch::Tensor base = (torch::randn({n + offset}, torch::TensorOptions().device(device)) * scale + mean).to(dtype);
  return base.narrow(0, offset, n).view(sizes);
}

// Llama's rotary inverse frequencies for head_dim d (theta 500000), (d/2) float32.
torch::Tensor InvFreq(int64_t d, const torch::Device& device) {
  torch::Tensor e = torch::arange(0, d, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(d);
  return (1.0 / torch::pow(torch::tensor(500000.0, torch::kFloat32), e)).to(device);
}

// (tokens) int64 positions: packed examples restarting at 0 (random lengths),
// or start + 0..tokens-1 when start > 0 (long contexts).
torch::Tensor Positions(int64_t tokens, int64_t start, const torch::Device& device) {
  if (start > 0) return torch::arange(start, start + tokens, torch::kInt64).to(device);
  std::vector<int64_t> p;
  std::mt19937 rng(static_cast<uint32_t>(torch::randint(1 << 30, {1}, torch::kInt64).item<int64_t>()));
  while (static_cast<int64_t>(p.size()) < tokens) {
    const int64_t len = 1 + rng() % 700;
    for (int64_t i = 0; i < len && static_cast<int64_t>(p.size()) < tokens; ++i) p.push_back(i);
  }
  return torch::tensor(p, torch::kInt64).to(device);
}

// ---------------------------------------------------------------- CPU

TEST(FusedOpsCpuTest, RmsNormIsPlainForwardAndBackward) {
  SeedForTest();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor x0 = Random({3, 5, 64}, dtype, torch::kCPU, 2.0, 0.5);
    const torch::Tensor w0 = Random({64}, dtype, torch::kCPU, 0.2, 1.0);
    const torch::Tensor g = Random({3, 5, 64}, dtype, torch::kCPU);
    torch::Tensor xa = x0.clone().requires_grad_(), wa = w0.clone().requires_grad_();
    torch::Tensor xb = x0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
    const torch::Tensor ya = FusedRmsNorm(xa, wa, kEps), yb = PlainRmsNorm(xb, wb, kEps);
    ya.backward(g);
    yb.backward(g);
    EXPECT_TRUE(torch::equal(ya, yb)) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(xa.grad(), xb.grad())) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(wa.grad(), wb.grad())) << DTypeName(dtype);
  }
}

TEST(FusedOpsCpuTest, SwiGluIsPlainForwardAndBackward) {
  SeedForTest();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor g0 = Random({2, 3, 40}, dtype, torch::kCPU, 3.0);
    const torch::Tensor u0 = Random({2, 3, 40}, dtype, torch::kCPU);
    const torch::Tensor d = Random({2, 3, 40}, dtype, torch::kCPU);
    torch::Tensor ga = g0.clone().requires_grad_(), ua = u0.clone().requires_grad_();
    torch::Tensor gb = g0.clone().requires_grad_(), ub = u0.clone().requires_grad_();
    const torch::Tensor oa = FusedSwiGlu(ga, ua), ob = PlainSwiGlu(gb, ub);
    oa.backward(d);
    ob.backward(d);
    EXPECT_TRUE(torch::equal(oa, ob)) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(ga.grad(), gb.grad())) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(ua.grad(), ub.grad())) << DTypeName(dtype);
  }
}

TEST(FusedOpsCpuTest, RopeIsPlainForwardAndBackward) {
  SeedForTest();
  const int64_t tokens = 11, heads = 3, d = 16;
  const torch::Tensor pos = Positions(tokens, 0, torch::kCPU), inv = InvFreq(d, torch::kCPU);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    // x: the first heads of a wider (q|k|v-like) row, so its token stride is 2 * heads * d.
    const torch::Tensor wide0 = Random({tokens, 2 * heads * d}, dtype, torch::kCPU);
    const torch::Tensor g = Random({tokens, heads, d}, dtype, torch::kCPU);
    torch::Tensor wa = wide0.clone().requires_grad_(), wb = wide0.clone().requires_grad_();
    const torch::Tensor oa = FusedRope(wa.narrow(1, 0, heads * d).view({tokens, heads, d}), pos, inv);
    const torch::Tensor ob = PlainRope(wb.narrow(1, 0, heads * d).view({tokens, heads, d}), pos, inv);
    oa.backward(g);
    ob.backward(g);
    EXPECT_TRUE(torch::equal(oa, ob)) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(wa.grad(), wb.grad())) << DTypeName(dtype);
  }
}

TEST(PlainOpsTest, RmsNormMatchesFloat64) {
  SeedForTest();
  const torch::Tensor x = Random({7, 96}, torch::kFloat32, torch::kCPU, 2.0, 0.5);
  const torch::Tensor w = Random({96}, torch::kFloat32, torch::kCPU, 0.2, 1.0);
  const torch::Tensor x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64);
  const torch::Tensor ref = w64 * x64 * torch::rsqrt(x64.pow(2).mean(-1, true) + kEps);
  EXPECT_LT(NormRelError(PlainRmsNorm(x, w, kEps), ref), 1e-6);
}

// The rotation written out pair by pair, (i, i + d/2), in float64 from the
// float32 angles float(position) * inv_freq.
TEST(PlainOpsTest, RopeMatchesPairRotationInFloat64) {
  SeedForTest();
  const int64_t tokens = 9, heads = 3, d = 16, half = d / 2;
  for (int64_t start : {0, 8000}) {
    const torch::Tensor pos = Positions(tokens, start, torch::kCPU), inv = InvFreq(d, torch::kCPU);
    const torch::Tensor x = Random({tokens, heads, d}, torch::kFloat32, torch::kCPU);
    const torch::Tensor out = PlainRope(x, pos, inv);
    torch::Tensor ref = torch::empty({tokens, heads, d}, torch::kFloat64);
    const auto xa = x.accessor<float, 3>();
    auto ra = ref.accessor<double, 3>();
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[t].item<int64_t>()) * inv[i].item<float>();
        const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
        for (int64_t h = 0; h < heads; ++h) {
          const double a = xa[t][h][i], b = xa[t][h][i + half];
          ra[t][h][i] = a * c - b * s;
          ra[t][h][i + half] = b * c + a * s;
        }
      }
    }
    EXPECT_LT(NormRelError(out, ref), 1e-5) << "positions from " << start;
  }
}

// ---------------------------------------------------------------- CUDA

class FusedOpsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    if (!FusedKernelsBuilt()) GTEST_SKIP() << "this build has no fused CUDA kernels";
    SeedForTest();
  }
  const torch::Device cuda_{torch::kCUDA};
  const std::vector<torch::ScalarType> dtypes_{torch::kBFloat16, torch::kFloat16, torch::kFloat32};
};

// Checks one output or gradient against its float64 reference; appends
// "name error" to `figures`, printed once per case.
void ExpectClose(const std::string& what, const std::string& name, const torch::Tensor& out,
                 const torch::Tensor& ref, torch::ScalarType dtype, std::string& figures) {
  ASSERT_TRUE(out.defined()) << what << " " << name << ": undefined";
  EXPECT_TRUE(AllFinite(out)) << what << " " << name << ": non-finite values";
  const double err = NormRelError(out, ref);
  EXPECT_LT(err, Tolerance(dtype)) << what << " " << name;
  char buf[64];
  std::snprintf(buf, sizeof(buf), " %s %.2e", name.c_str(), err);
  figures += buf;
}

void PrintFigures(const std::string& what, const std::string& figures) {
  std::printf("[  figure  ] %s:%s\n", what.c_str(), figures.c_str());
}

TEST_F(FusedOpsCudaTest, RmsNormMatchesFloat64Reference) {
  const int64_t many = Quick() ? 1030 : 4096;
  for (auto dtype : dtypes_) {
    for (int64_t hidden : {2048, 4096, 8192, 1000, 2050, 16384}) {
      for (int64_t rows : {int64_t{1}, int64_t{7}, hidden == 16384 ? int64_t{1030} : many}) {
        // rows == 7: a frozen weight (LoRA), x given as (1, 7, H) and, for
        // H = 4096, one element off 16-byte alignment (the scalar path).
        const bool weight_grad = rows != 7;
        const std::vector<int64_t> shape = rows == 7 ? std::vector<int64_t>{1, rows, hidden}
                                                     : std::vector<int64_t>{rows, hidden};
        const std::string what = DTypeName(dtype) + " rows=" + std::to_string(rows) + " H=" + std::to_string(hidden);
        torch::Tensor x = Random(shape, dtype, cuda_, 2.0, 0.5, rows == 7 && hidden == 4096 ? 1 : 0)
                              .detach().requires_grad_();
        torch::Tensor w = Random({hidden}, dtype, cuda_, 0.2, 1.0).detach().requires_grad_(weight_grad);
        const torch::Tensor g = Random(shape, dtype, cuda_);
        torch::Tensor y = FusedRmsNorm(x, w, kEps);
        y.backward(g);

        torch::Tensor x64 = x.detach().to(torch::kFloat64).requires_grad_();
        torch::Tensor w64 = w.detach().to(torch::kFloat64).requires_grad_(weight_grad);
        torch::Tensor ref = PlainRmsNorm(x64, w64, kEps);
        ref.backward(g.to(torch::kFloat64));

        std::string figures;
        ExpectClose(what, "y", y, ref, dtype, figures);
        ExpectClose(what, "dx", x.grad(), x64.grad(), dtype, figures);
        if (weight_grad) ExpectClose(what, "dweight", w.grad(), w64.grad(), dtype, figures);
        PrintFigures(what, figures);
      }
    }
  }
}

TEST_F(FusedOpsCudaTest, SwiGluMatchesFloat64Reference) {
  const std::vector<std::vector<int64_t>> shapes = {
      {Quick() ? 256 : 2048, 14336}, {7, 1000}, {1, 2050}, {3, 1001}, {2, 5, 4096}};
  for (auto dtype : dtypes_) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& shape = shapes[i];
      const int64_t offset = i == 3 ? 1 : 0;  // {3, 1001}: unaligned, the scalar path
      std::string what = DTypeName(dtype) + " shape";
      for (int64_t n : shape) what += " " + std::to_string(n);
      if (offset) what += " unaligned";
      torch::Tensor gate = Random(shape, dtype, cuda_, 3.0, 0.0, offset).detach().requires_grad_();
      torch::Tensor up = Random(shape, dtype, cuda_, 1.0, 0.0, offset).detach().requires_grad_();
      const torch::Tensor d = Random(shape, dtype, cuda_);
      torch::Tensor out = FusedSwiGlu(gate, up);
      out.backward(d);

      torch::Tensor g64 = gate.detach().to(torch::kFloat64).requires_grad_();
      torch::Tensor u64 = up.detach().to(torch::kFloat64).requires_grad_();
      torch::Tensor ref = PlainSwiGlu(g64, u64);
      ref.backward(d.to(torch::kFloat64));

      std::string figures;
      ExpectClose(what, "out", out, ref, dtype, figures);
      ExpectClose(what, "dgate", gate.grad(), g64.grad(), dtype, figures);
      ExpectClose(what, "dup", up.grad(), u64.grad(), dtype, figures);
      PrintFigures(what, figures);
    }
  }
}

TEST_F(FusedOpsCudaTest, RopeMatchesFloat64Reference) {
  struct Case {
    int64_t tokens, heads, kv_heads, d, first_position;  // first_position 0: packed, restarting
    int64_t pad;  // extra values per token row: an odd pad breaks alignment (the scalar path)
  };
  const int64_t many = Quick() ? 600 : 4096;
  const std::vector<Case> cases = {
      {many, 32, 8, 128, 0, 0}, {many, 32, 8, 64, 8000, 0}, {7, 32, 8, 128, 8000, 0},
      {1, 8, 8, 64, 0, 0},      {33, 8, 4, 128, 7990, 3},   {5, 4, 2, 64, 0, 1}};
  for (auto dtype : dtypes_) {
    for (const Case& c : cases) {
      // x: the q or k heads of a fused (tokens, (heads + 2 kv_heads) d + pad) projection.
      const int64_t width = (c.heads + 2 * c.kv_heads) * c.d + c.pad;
      const torch::Tensor pos = Positions(c.tokens, c.first_position, cuda_), inv = InvFreq(c.d, cuda_);
      const torch::Tensor wide0 = Random({c.tokens, width}, dtype, cuda_);
      for (bool is_q : {true, false}) {
        const int64_t heads = is_q ? c.heads : c.kv_heads;
        const int64_t begin = (is_q ? 0 : c.heads * c.d) + c.pad % 2;
        const std::string what = DTypeName(dtype) + " tokens=" + std::to_string(c.tokens) +
                                 " heads=" + std::to_string(heads) + " d=" + std::to_string(c.d) +
                                 " pos0=" + std::to_string(c.first_position) + " pad=" + std::to_string(c.pad);
        const torch::Tensor g = Random({c.tokens, heads, c.d}, dtype, cuda_);
        torch::Tensor wide = wide0.clone().requires_grad_();
        torch::Tensor out = FusedRope(wide.narrow(1, begin, heads * c.d).view({c.tokens, heads, c.d}), pos, inv);
        out.backward(g);

        torch::Tensor wide64 = wide0.to(torch::kFloat64).requires_grad_();
        torch::Tensor ref =
            PlainRope(wide64.narrow(1, begin, heads * c.d).view({c.tokens, heads, c.d}), pos, inv);
        ref.backward(g.to(torch::kFloat64));

        std::string figures;
        ExpectClose(what, "out", out, ref, dtype, figures);
        ExpectClose(what, "dx", wide.grad(), wide64.grad(), dtype, figures);
        PrintFigures(what, figures);
      }
    }
  }
}

#ifdef TRAINERD_WITH_CUDA_KERNELS
// The launchers directly, on outputs (and scratch) filled with NaN: every
// element must be written, the results must be those of the autograd
// wrappers, and dweight the same bits on a second run.
TEST_F(FusedOpsCudaTest, LaunchersWriteEveryElement) {
  namespace k = trainerd::kernels;
  void* stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto kdtype = [](torch::ScalarType t) {
    return t == torch::kBFloat16 ? k::DType::kBFloat16 : t == torch::kFloat16 ? k::DType::kFloat16 : k::DType::kFloat32;
  };
  const auto poisoned = [](std::vector<int64_t> sizes, const torch::TensorOptions& o) {
    return torch::full(sizes, std::numeric_limits<float>::quiet_NaN(), o);
  };
  for (auto dtype : dtypes_) {
    const auto o = torch::TensorOptions().dtype(dtype).device(cuda_);
    const auto of = o.dtype(torch::kFloat32);
    for (int64_t hidden : {4096, 2050}) {
      for (int64_t rows : {7, 1030}) {
        const std::string what = DTypeName(dtype) + " rows=" + std::to_string(rows) + " H=" + std::to_string(hidden);
        const torch::Tensor x = Random({rows, hidden}, dtype, cuda_, 2.0, 0.5);
        const torch::Tensor w = Random({hidden}, dtype, cuda_, 0.2, 1.0);
        const torch::Tensor dy = Random({rows, hidden}, dtype, cuda_);
        torch::Tensor y = poisoned({rows, hidden}, o), rstd = poisoned({rows}, of);
        ASSERT_EQ(k::RmsNormForward(x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), rows, hidden,
                                    kEps, kdtype(dtype), stream), "");
        EXPECT_TRUE(AllFinite(y) && AllFinite(rstd)) << what;
        EXPECT_TRUE(torch::equal(y, FusedRmsNorm(x, w, kEps))) << what;

        const size_t bytes = k::RmsNormBackwardWorkspaceBytes(rows, hidden);
        std::vector<torch::Tensor> dws;
        for (int run = 0; run < 2; ++run) {
          torch::Tensor dx = poisoned({rows, hidden}, o), dw = poisoned({hidden}, of);
          torch::Tensor scratch = poisoned({static_cast<int64_t>(bytes / sizeof(float))}, of);
          ASSERT_EQ(k::RmsNormBackward(dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                                       dx.data_ptr(), dw.data_ptr<float>(), scratch.data_ptr(), bytes, rows, hidden,
                                       kdtype(dtype), stream), "");
          EXPECT_TRUE(AllFinite(dx) && AllFinite(dw)) << what;
          dws.push_back(dw);
        }
        EXPECT_TRUE(torch::equal(dws[0], dws[1])) << what << ": dweight differs between runs";
      }
    }
    for (int64_t n : {int64_t{1001}, int64_t{4096 * 7}}) {
      const torch::Tensor gate = Random({n}, dtype, cuda_, 3.0), up = Random({n}, dtype, cuda_);
      const torch::Tensor d = Random({n}, dtype, cuda_);
      torch::Tensor out = poisoned({n}, o), dg = poisoned({n}, o), du = poisoned({n}, o);
      ASSERT_EQ(k::SwiGluForward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, kdtype(dtype), stream), "");
      ASSERT_EQ(k::SwiGluBackward(d.data_ptr(), gate.data_ptr(), up.data_ptr(), dg.data_ptr(), du.data_ptr(), n,
                                  kdtype(dtype), stream), "");
      EXPECT_TRUE(AllFinite(out) && AllFinite(dg) && AllFinite(du)) << DTypeName(dtype) << " n=" << n;
      EXPECT_TRUE(torch::equal(out, FusedSwiGlu(gate, up))) << DTypeName(dtype) << " n=" << n;
    }
    for (int64_t pad : {0, 1}) {
      const int64_t tokens = 37, heads = 8, d = 128;
      const torch::Tensor wide = Random({tokens, heads * d + pad}, dtype, cuda_);
      const torch::Tensor x = wide.narrow(1, pad, heads * d).view({tokens, heads, d});
      const torch::Tensor pos = Positions(tokens, 0, cuda_), inv = InvFreq(d, cuda_);
      torch::Tensor out = poisoned({tokens, heads, d}, o), back = poisoned({tokens, heads, d}, o);
      ASSERT_EQ(k::RopeForward(x.data_ptr(), x.stride(0), pos.data_ptr<int64_t>(), inv.data_ptr<float>(),
                               out.data_ptr(), tokens, heads, d, /*inverse=*/false, kdtype(dtype), stream), "");
      ASSERT_EQ(k::RopeForward(out.data_ptr(), heads * d, pos.data_ptr<int64_t>(), inv.data_ptr<float>(),
                               back.data_ptr(), tokens, heads, d, /*inverse=*/true, kdtype(dtype), stream), "");
      EXPECT_TRUE(AllFinite(out) && AllFinite(back)) << DTypeName(dtype) << " pad=" << pad;
      EXPECT_TRUE(torch::equal(out, FusedRope(x, pos, inv))) << DTypeName(dtype) << " pad=" << pad;
      // The inverse rotation undoes the forward one up to the dtype's rounding.
      EXPECT_LT(NormRelError(back, x), 4 * Tolerance(dtype)) << DTypeName(dtype) << " pad=" << pad;
    }
  }
}
#endif  // TRAINERD_WITH_CUDA_KERNELS

}  // namespace
}  // namespace trainerd::engine
