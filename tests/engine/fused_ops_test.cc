// engine/fused_ops.h: the fused RMSNorm (with and without the residual add),
// SwiGLU, RoPE and softmax cross-entropy rows against the plain LibTorch
// formulas.
//  - CPU (CI): Fused* is Plain* bit for bit, forward and gradients, and the
//    Plain* formulas match independent float64 computations.
//  - CUDA with the kernels built: for each dtype and shape, fresh random
//    inputs, the kernels' outputs and gradients against Plain* on the inputs
//    upcast to float64, by ||out - ref|| / ||ref|| within 1e-2 (bf16), 2e-3
//    (fp16), 1e-5 (fp32), nothing non-finite; the launchers write every
//    element of NaN-poisoned outputs, and dweight is the same bits twice.
//    The cross-entropy is held to per-element bounds instead (its gradient
//    spans many magnitudes, which a norm would hide): CrossEntropyBounds.
// The seed is printed; TRAINERD_TEST_SEED replays one. TRAINERD_FUSED_TEST_QUICK=1
// shrinks the largest shapes (scripts/gpu-sanitize.sh: tools run slowly).
#include "engine/fused_ops.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <tuple>
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

// ---- softmax cross-entropy rows

constexpr int64_t kIgnoreIndex = -100;

// (rows) int64 targets in [0, vocab): row 0 takes class 0, the last row class
// vocab - 1, rows r % 5 == 2 are ignored (kIgnoreIndex).
torch::Tensor CrossEntropyTargets(int64_t rows, int64_t vocab, const torch::Device& device) {
  torch::Tensor t = torch::randint(vocab, {rows}, torch::kInt64);
  t[0] = 0;
  if (rows > 1) t[rows - 1] = vocab - 1;
  for (int64_t r = 2; r < rows; r += 5) t[r] = kIgnoreIndex;
  return t.to(device);
}

// (rows, vocab) logits of `dtype`: Normal(0, scale), plus a spike of +10 in
// each row, at vocab - 1 (rows r % 4 == 0), 0 (r % 4 == 1), the target
// (r % 4 == 2, when not ignored) or a random column: a kernel that misses
// an edge of the row, or reads the wrong target, is off by far more than
// rounding. offset > 0: `offset` elements into a larger allocation (a data
// pointer off 16-byte alignment: the kernel's scalar path).
torch::Tensor CrossEntropyLogits(int64_t rows, int64_t vocab, const torch::Tensor& targets, torch::ScalarType dtype,
                                 const torch::Device& device, double scale, int64_t offset = 0) {
  const torch::Tensor t = targets.cpu();
  std::vector<int64_t> spike(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t target = t[r].item<int64_t>();
    if (r % 4 == 0) {
      spike[r] = vocab - 1;
    } else if (r % 4 == 1) {
      spike[r] = 0;
    } else if (r % 4 == 2 && target >= 0 && target < vocab) {
      spike[r] = target;
    } else {
      spike[r] = torch::randint(vocab, {1}, torch::kInt64).item<int64_t>();
    }
  }
  torch::Tensor base = torch::randn({rows * vocab + offset}, torch::TensorOptions().device(device)) * scale;
  base.narrow(0, offset, rows * vocab)
      .view({rows, vocab})
      .scatter_add_(1, torch::tensor(spike, torch::kInt64).to(device).unsqueeze(1),
                    torch::full({rows, 1}, 10.0, base.options()));
  return base.to(dtype).narrow(0, offset, rows * vocab).view({rows, vocab});
}

// A contiguous copy of x, `offset` elements into its allocation (clone()
// would start it at offset 0: 16-byte aligned).
torch::Tensor CopyAt(const torch::Tensor& x, int64_t offset) {
  return torch::empty({x.numel() + offset}, x.options()).narrow(0, offset, x.numel()).view(x.sizes()).copy_(x);
}

// Per-element bounds for the cross-entropy of the stored logits x (rows, V),
// against float64 from the same stored values, on x's device:
//  - loss, labelled rows: |loss - ref| <= 1e-5 + 2^-22 (|lse| + |ref|): the
//    float32 sum of exps (relative error ~1e-6 for ~250 terms a thread, then
//    the tree) and a few roundings of values of lse's size;
//  - ignored rows: loss exactly 0 and a zero gradient row; a target outside
//    [0, V) that is not ignored: loss NaN, gradient softmax alone;
//  - gradient: |g - ref| <= u |ref| + E p + a, with p the float64 softmax,
//    u twice the relative error of the single rounding to the dtype (at most
//    half an ulp: 2^-8 of the value in bf16, 2^-11 fp16, 2^-24 fp32), so
//    u = 2^-7, 2^-10, 2^-23: one ulp; E = 4e-6 + 2^-22 (|lse| + |x - lse|)
//    the relative error of the float32 exp(x - lse) (lse's error, the
//    rounding of x - lse, expf's 2 ulp), a the dtype's absolute floor
//    (fp16 subnormals 2^-24, else 1e-37: exp underflow).
// A missed element or vector, a wrong target, a stale or wrong lse, or an
// unwritten element is off by far more than these.
// grad undefined: only the loss is checked. Appends the worst error / bound
// ratios (must be <= 1) to `figures`.
// The gradient part of the bounds above, u |ref| + E p + a, per element, for
// the reference ref (float64, (rows, V)) of the stored logits x in dtype
// `dtype` with targets `targets`: labelled rows' p and onehot, ignored rows 0.
torch::Tensor CrossEntropyGradientBound(const torch::Tensor& x, const torch::Tensor& targets, torch::ScalarType dtype,
                                        torch::Tensor* ref_out = nullptr) {
  const int64_t vocab = x.size(1);
  const torch::Tensor x64 = x.to(torch::kFloat64);
  const torch::Tensor ignored = targets == kIgnoreIndex;
  const torch::Tensor labelled = targets.ge(0).logical_and(targets.lt(vocab)).logical_and(ignored.logical_not());
  const torch::Tensor index = torch::where(labelled, targets, torch::zeros_like(targets)).unsqueeze(1);
  const torch::Tensor lse = torch::logsumexp(x64, 1);
  const torch::Tensor shifted = x64 - lse.unsqueeze(1);
  const torch::Tensor p = shifted.exp() * ignored.logical_not().unsqueeze(1);  // zero rows where ignored
  const torch::Tensor onehot = torch::zeros_like(x64).scatter_(1, index, 1.0) * labelled.unsqueeze(1);
  const torch::Tensor ref = p - onehot;
  const double u = dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                   : dtype == torch::kFloat16 ? std::ldexp(1.0, -10)
                                              : std::ldexp(1.0, -23);
  const double a = dtype == torch::kFloat16 ? std::ldexp(1.0, -24) : 1e-37;
  const torch::Tensor e = 4e-6 + std::ldexp(1.0, -22) * (lse.abs().unsqueeze(1) + shifted.abs());
  if (ref_out != nullptr) *ref_out = ref;
  return u * ref.abs() + e * p + a;
}

void ExpectCrossEntropyWithinBounds(const std::string& what, const torch::Tensor& x, const torch::Tensor& targets,
                                    const torch::Tensor& loss, const torch::Tensor& grad, std::string& figures) {
  const torch::ScalarType dtype = x.scalar_type();
  const int64_t vocab = x.size(1);
  const torch::Tensor x64 = x.to(torch::kFloat64);
  const torch::Tensor ignored = targets == kIgnoreIndex;
  const torch::Tensor in_range = targets.ge(0).logical_and(targets.lt(vocab));
  const torch::Tensor labelled = in_range.logical_and(ignored.logical_not());
  const torch::Tensor stray = in_range.logical_not().logical_and(ignored.logical_not());
  const torch::Tensor index = torch::where(labelled, targets, torch::zeros_like(targets)).unsqueeze(1);
  const torch::Tensor lse = torch::logsumexp(x64, 1);
  const torch::Tensor ref_loss = lse - x64.gather(1, index).squeeze(1);

  ASSERT_EQ(loss.sizes(), targets.sizes()) << what;
  ASSERT_EQ(loss.scalar_type(), torch::kFloat32) << what;
  const torch::Tensor l64 = loss.to(torch::kFloat64);
  EXPECT_TRUE((l64.masked_select(ignored) == 0).all().item<bool>()) << what << ": ignored rows' loss not 0";
  EXPECT_TRUE(torch::isnan(l64.masked_select(stray)).all().item<bool>()) << what << ": stray target, loss not NaN";
  double loss_ratio = 0;
  if (labelled.any().item<bool>()) {
    const torch::Tensor bound = 1e-5 + std::ldexp(1.0, -22) * (lse.abs() + ref_loss.abs());
    loss_ratio = ((l64 - ref_loss).abs() / bound).masked_select(labelled).max().item<double>();
    EXPECT_TRUE(AllFinite(loss.masked_select(labelled))) << what << ": non-finite loss";
    EXPECT_LE(loss_ratio, 1.0) << what << ": loss";
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), " loss err/bound %.2f", loss_ratio);
  figures += buf;
  if (!grad.defined()) return;

  ASSERT_EQ(grad.sizes(), x.sizes()) << what;
  ASSERT_EQ(grad.scalar_type(), dtype) << what;
  EXPECT_TRUE(AllFinite(grad)) << what << ": non-finite gradient";
  torch::Tensor ref;
  const torch::Tensor bound = CrossEntropyGradientBound(x, targets, dtype, &ref);
  const double grad_ratio = ((grad.to(torch::kFloat64) - ref).abs() / bound).max().item<double>();
  EXPECT_LE(grad_ratio, 1.0) << what << ": gradient";
  std::snprintf(buf, sizeof(buf), " grad err/bound %.2f", grad_ratio);
  figures += buf;
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

TEST(FusedOpsCpuTest, QkvRopeIsThePlainRopesAndACopyOfV) {
  SeedForTest();
  const int64_t tokens = 9, heads = 4, kv_heads = 2, d = 16, width = (heads + 2 * kv_heads) * d;
  const torch::Tensor pos = Positions(tokens, 0, torch::kCPU), inv = InvFreq(d, torch::kCPU);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor wide0 = Random({tokens, width}, dtype, torch::kCPU);
    const torch::Tensor gq = Random({tokens, heads, d}, dtype, torch::kCPU);
    const torch::Tensor gk = Random({tokens, kv_heads, d}, dtype, torch::kCPU);
    const torch::Tensor gv = Random({tokens, kv_heads, d}, dtype, torch::kCPU);
    torch::Tensor wa = wide0.clone().requires_grad_(), wb = wide0.clone().requires_grad_();
    auto split = [&](const torch::Tensor& w) {
      const int64_t kv = kv_heads * d;
      return std::array<torch::Tensor, 3>{w.narrow(1, 0, heads * d).view({tokens, heads, d}),
                                          w.narrow(1, heads * d, kv).view({tokens, kv_heads, d}),
                                          w.narrow(1, heads * d + kv, kv).view({tokens, kv_heads, d})};
    };
    const auto a = split(wa), b = split(wb);
    const std::array<torch::Tensor, 3> oa = FusedQkvRope(a[0], a[1], a[2], pos, inv);
    const std::array<torch::Tensor, 3> ob = {PlainRope(b[0], pos, inv), PlainRope(b[1], pos, inv), b[2]};
    torch::autograd::backward({oa[0], oa[1], oa[2]}, {gq, gk, gv});
    torch::autograd::backward({ob[0], ob[1], ob[2]}, {gq, gk, gv});
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(oa[i], ob[i])) << DTypeName(dtype) << " output " << i;
    EXPECT_TRUE(oa[2].is_contiguous()) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(wa.grad(), wb.grad())) << DTypeName(dtype);
  }
}

// A q|k|v product rotated in place and its gradient rotated back into one
// buffer (what q|k|v's node does when asked to rotate, engine/linear_group.h):
// FusedRope's rotations of q's and k's heads, v's columns untouched; and the
// gradients autograd gives through FusedRope's, to the bit. Also with the
// rotated heads ending inside a part (k's first head rotated, its second not),
// and with a part's gradient missing (zeros).
void ExpectProductRotations(torch::Device device) {
  const int64_t tokens = 9, heads = 4, kv_heads = 2, d = 16, width = (heads + 2 * kv_heads) * d;
  const torch::Tensor pos = Positions(tokens, 0, device), inv = InvFreq(d, device);
  const std::vector<int64_t> parts = {heads, kv_heads, kv_heads};
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (int64_t rotated : {heads + kv_heads, heads + 1}) {
      for (bool all_gradients : {true, false}) {
        const std::string what = DTypeName(dtype) + ", " + std::to_string(rotated) + " heads rotated" +
                                 (all_gradients ? "" : ", k's gradient missing");
        const torch::Tensor y0 = Random({tokens, width}, dtype, device);
        torch::Tensor y = y0.clone();
        RotateHeadsInPlace(y, rotated, d, pos, inv);
        // The reference: each head rotated alone by FusedRope (the kernel on
        // CUDA, PlainRope on the CPU), with autograd.
        const torch::Tensor leaf = y0.view({tokens, width / d, d}).clone().requires_grad_();
        std::vector<torch::Tensor> heads_out;
        for (int64_t h = 0; h < width / d; ++h) {
          const torch::Tensor head = leaf.narrow(1, h, 1);
          heads_out.push_back(h < rotated ? FusedRope(head, pos, inv) : head * 1);
        }
        const torch::Tensor expected = torch::cat(heads_out, 1);
        EXPECT_TRUE(torch::equal(y, expected.detach().reshape({tokens, width}))) << what;
        std::vector<torch::Tensor> grads;
        int64_t first = 0;
        const torch::Tensor g = Random({tokens, width / d, d}, dtype, device);
        torch::Tensor used = g.clone();
        for (size_t i = 0; i < parts.size(); ++i) {
          const bool missing = !all_gradients && i == 1;
          grads.push_back(missing ? torch::Tensor() : g.narrow(1, first, parts[i]));
          if (missing) used.narrow(1, first, parts[i]).zero_();
          first += parts[i];
        }
        expected.backward(used);
        const torch::Tensor buffer = QkvRopeGradient(grads, parts, rotated, pos, inv);
        EXPECT_EQ(buffer.sizes(), (std::vector<int64_t>{tokens, width})) << what;
        EXPECT_TRUE(torch::equal(buffer, leaf.grad().reshape({tokens, width}))) << what;
      }
    }
  }
}

TEST(FusedOpsCpuTest, ProductRotatedInPlaceAndItsGradientRotatedBack) {
  SeedForTest();
  ExpectProductRotations(torch::kCPU);
}

TEST(FusedOpsCpuTest, SoftmaxCrossEntropyRowsIsPlain) {
  SeedForTest();
  const int64_t rows = 7, vocab = 37;
  const torch::Tensor t = CrossEntropyTargets(rows, vocab, torch::kCPU);  // row 2 ignored
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const torch::Tensor x = CrossEntropyLogits(rows, vocab, t, dtype, torch::kCPU, 3.0);
    for (bool write_grad : {false, true}) {
      const std::string what = DTypeName(dtype) + (write_grad ? " write_grad" : "");
      torch::Tensor a = x.clone(), b = x.clone();
      const torch::Tensor la = FusedSoftmaxCrossEntropyRows(a, t, kIgnoreIndex, write_grad);
      const torch::Tensor lb = PlainSoftmaxCrossEntropyRows(b, t, kIgnoreIndex, write_grad);
      EXPECT_TRUE(torch::equal(la, lb)) << what;
      EXPECT_TRUE(torch::equal(a, b)) << what;
      EXPECT_EQ(la.scalar_type(), torch::kFloat32) << what;
      EXPECT_TRUE(AllFinite(la)) << what;
      if (write_grad) {
        EXPECT_TRUE((a[2] == 0).all().item<bool>()) << what << ": ignored row not zero";
      } else {
        EXPECT_TRUE(torch::equal(a, x)) << what << ": logits written without write_grad";
      }
    }
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

// The loss against float64 log_softmax, the written gradient against
// autograd of the float64 cross_entropy (sum, ignore_index), float32 logits.
TEST(PlainOpsTest, SoftmaxCrossEntropyRowsMatchesFloat64Autograd) {
  SeedForTest();
  const int64_t rows = 9, vocab = 50;
  const torch::Tensor t = CrossEntropyTargets(rows, vocab, torch::kCPU);  // rows 2 and 7 ignored
  const torch::Tensor x = CrossEntropyLogits(rows, vocab, t, torch::kFloat32, torch::kCPU, 3.0);
  torch::Tensor logits = x.clone();
  const torch::Tensor loss = PlainSoftmaxCrossEntropyRows(logits, t, kIgnoreIndex, /*write_grad=*/true);

  torch::Tensor x64 = x.to(torch::kFloat64).requires_grad_();
  const torch::Tensor valid = t != kIgnoreIndex;
  const torch::Tensor index = torch::where(valid, t, torch::zeros_like(t)).unsqueeze(1);
  const torch::Tensor ref_loss =
      -torch::log_softmax(x64.detach(), 1).gather(1, index).squeeze(1) * valid.to(torch::kFloat64);
  EXPECT_LT((loss.to(torch::kFloat64) - ref_loss).abs().max().item<double>(), 1e-5);
  const torch::Tensor total = torch::nn::functional::cross_entropy(
      x64, t, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnoreIndex));
  total.backward();
  EXPECT_NEAR(loss.sum().item<double>(), total.item<double>(), 1e-5 * std::abs(total.item<double>()));
  // Within float32's error of the formula (CrossEntropyGradientBound), not an
  // absolute 1e-6: where p is near 1 the float32 x - lse of an lse near 20
  // already rounds by about 1e-6 (seed 1279439021: 1.13e-6).
  const torch::Tensor bound = CrossEntropyGradientBound(x, t, torch::kFloat32);
  EXPECT_LE(((logits.to(torch::kFloat64) - x64.grad()).abs() / bound).max().item<double>(), 1.0);
}

// The bounds the CUDA kernel is held to (ExpectCrossEntropyWithinBounds) hold
// for the plain float32 formula too: they are not tighter than float32
// arithmetic allows, so a failure on the GPU is the kernel's.
TEST(PlainOpsTest, SoftmaxCrossEntropyRowsWithinKernelBounds) {
  SeedForTest();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (double scale : {1.0, 30.0}) {
      const int64_t rows = 6, vocab = 5000;
      const std::string what = DTypeName(dtype) + " scale=" + std::to_string(static_cast<int>(scale));
      const torch::Tensor t = CrossEntropyTargets(rows, vocab, torch::kCPU);
      const torch::Tensor x = CrossEntropyLogits(rows, vocab, t, dtype, torch::kCPU, scale);
      torch::Tensor g = x.clone();
      const torch::Tensor loss = PlainSoftmaxCrossEntropyRows(g, t, kIgnoreIndex, /*write_grad=*/true);
      std::string figures;
      ExpectCrossEntropyWithinBounds(what, x, t, loss, g, figures);
      std::printf("[  figure  ] %s:%s\n", what.c_str(), figures.c_str());
    }
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

// The residual add inside the norm's kernels (FusedAddRmsNorm) gives the bits
// of the add followed by the fused RMSNorm, forward and backward, whichever
// outputs get a gradient: both (a decoder layer's norms), y alone, sum alone.
// With gradient spare columns (H 4096) the gradient it hands back has rows
// that much wider (y's gradient, zeros where y is unused, goes through the
// norm's kernel every time); the sum's incoming gradient comes in wider rows
// too (read in place).
TEST_F(FusedOpsCudaTest, AddRmsNormIsTheAddThenTheNormBitForBit) {
  enum Used { kBoth, kNormOnly, kSumOnly };
  for (auto dtype : dtypes_) {
    for (int64_t hidden : {4096, 2048, 2050}) {  // 2050: rows off 16-byte alignment, the scalar path
      for (int64_t rows : {int64_t{7}, int64_t{1030}}) {
        for (Used used : {kBoth, kNormOnly, kSumOnly}) {
          const bool weight_grad = rows != 7;
          const int64_t spare = hidden == 4096 ? 24 : 0, gradient_spare = hidden == 4096 ? 16 : 0;
          const std::string what = DTypeName(dtype) + " rows=" + std::to_string(rows) + " H=" +
                                   std::to_string(hidden) + " used=" + std::to_string(used);
          const torch::Tensor r0 = Random({1, rows, hidden}, dtype, cuda_, 2.0, 0.5);
          const torch::Tensor d0 = Random({1, rows, hidden}, dtype, cuda_, 0.5);
          const torch::Tensor w0 = Random({hidden}, dtype, cuda_, 0.2, 1.0);
          const torch::Tensor gs = Random({1, rows, hidden + 8}, dtype, cuda_).narrow(2, 0, hidden);
          const torch::Tensor gy = Random({1, rows, hidden}, dtype, cuda_);
          std::vector<torch::Tensor> sums, ys, grads;
          torch::Tensor handed;  // the gradient the fused node gives delta
          for (bool fused : {true, false}) {
            torch::Tensor r = r0.clone().requires_grad_(), d = d0.clone().requires_grad_();
            torch::Tensor w = w0.clone().requires_grad_(weight_grad);
            torch::Tensor sum, y;
            if (fused) {
              d.register_hook([&handed](const torch::Tensor& g) { handed = g; });
              std::tie(sum, y) = FusedAddRmsNorm(r, d, w, kEps, spare, nullptr, gradient_spare);
            } else {
              sum = r + d;
              y = FusedRmsNorm(sum, w, kEps, spare);
            }
            std::vector<torch::Tensor> outs, gouts;
            if (used != kSumOnly) {
              outs.push_back(y);
              gouts.push_back(gy);
            }
            if (used != kNormOnly) {
              outs.push_back(sum);
              gouts.push_back(gs);
            }
            torch::autograd::backward(outs, gouts);
            sums.push_back(sum);
            ys.push_back(y);
            grads.insert(grads.end(), {r.grad(), d.grad(), weight_grad ? w.grad() : torch::Tensor()});
          }
          EXPECT_EQ(ys[0].stride(1), hidden + spare) << what;
          ASSERT_TRUE(handed.defined()) << what;
          EXPECT_EQ(handed.stride(1), hidden + gradient_spare) << what;
          EXPECT_TRUE(torch::equal(sums[0], sums[1])) << what << ": sum";
          EXPECT_TRUE(torch::equal(ys[0], ys[1])) << what << ": y";
          EXPECT_TRUE(torch::equal(grads[0], grads[3])) << what << ": residual's gradient";
          EXPECT_TRUE(torch::equal(grads[1], grads[4])) << what << ": delta's gradient";
          if (weight_grad && used != kSumOnly) {
            EXPECT_TRUE(torch::equal(grads[2], grads[5])) << what << ": weight's gradient";
          }
        }
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

// Wide rows (engine/linear_group.h): RMSNorm and SwiGLU leave spare columns
// after their outputs, SwiGLU reads gate and up as the halves of one gate|up
// matrix and writes their gradients as the halves of one buffer, and both read
// incoming gradients whose rows are wider. The same bits as dense operands;
// odd strides take the scalar path.
TEST_F(FusedOpsCudaTest, WideRowsGiveTheDenseResults) {
  for (auto dtype : dtypes_) {
    for (int64_t spare : {int64_t{24}, int64_t{1}}) {
      const std::string what = DTypeName(dtype) + " spare " + std::to_string(spare);
      const int64_t rows = 37, hidden = 4096, f = 1024;
      // RMSNorm.
      torch::Tensor x = Random({rows, hidden}, dtype, cuda_, 2.0, 0.5).detach().requires_grad_();
      const torch::Tensor w = Random({hidden}, dtype, cuda_, 0.2, 1.0);
      const torch::Tensor dy_wide = Random({rows, hidden + spare + 8}, dtype, cuda_);
      const torch::Tensor dy = dy_wide.narrow(1, 0, hidden);
      torch::Tensor y = FusedRmsNorm(x, w, kEps, spare);
      EXPECT_EQ(y.stride(0), hidden + spare) << what;
      y.backward(dy);
      torch::Tensor x2 = x.detach().clone().requires_grad_();
      torch::Tensor y2 = FusedRmsNorm(x2, w, kEps);
      y2.backward(dy.contiguous());
      if (spare % 8 == 0) {  // the same (vector) path: the same bits
        EXPECT_TRUE(torch::equal(y, y2)) << what;
        EXPECT_TRUE(torch::equal(x.grad(), x2.grad())) << what;
      } else {  // the scalar path sums in another order
        EXPECT_LT(NormRelError(y, y2), Tolerance(dtype)) << what;
        EXPECT_LT(NormRelError(x.grad(), x2.grad()), Tolerance(dtype)) << what;
      }
      // SwiGLU on the halves of one gate|up matrix.
      torch::Tensor both = Random({rows, 2 * f}, dtype, cuda_, 3.0).detach().requires_grad_();
      const torch::Tensor gate = both.narrow(1, 0, f), up = both.narrow(1, f, f);
      const torch::Tensor d_wide = Random({rows, f + spare}, dtype, cuda_);
      const torch::Tensor d = d_wide.narrow(1, 0, f);
      torch::Tensor out = FusedSwiGlu(gate, up, spare);
      EXPECT_EQ(out.stride(0), f + spare) << what;
      const auto grads = torch::autograd::grad({out}, {gate, up}, {d});
      EXPECT_EQ(static_cast<char*>(grads[1].data_ptr()),
                static_cast<char*>(grads[0].data_ptr()) + f * grads[0].element_size())
          << what << ": the gradients are not the halves of one buffer";
      torch::Tensor g2 = gate.detach().contiguous().requires_grad_(), u2 = up.detach().contiguous().requires_grad_();
      torch::Tensor out2 = FusedSwiGlu(g2, u2);
      out2.backward(d.contiguous());
      EXPECT_TRUE(torch::equal(out, out2)) << what;
      EXPECT_TRUE(torch::equal(grads[0], g2.grad())) << what;
      EXPECT_TRUE(torch::equal(grads[1], u2.grad())) << what;
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

// Every dtype and path of the kernel: vocab 128256 (a Llama 3 head: whole
// 16-byte vectors), 1000 (vectors, a block of fewer than 512 threads), 8 (one
// or two vectors), 262144, 1001 (odd: the scalar path) and 32000 one element
// into its allocation (unaligned: the scalar path); logits of scale 30 for the
// online maximum. Without write_grad the logits stay untouched and the loss is
// the same bits as with it (pass 1 is the same code).
// The q|k|v node computes FusedRope(q), FusedRope(k) and v's copy, forward
// and backward, to the bit; its input gradients are the columns of one
// (tokens, width) buffer in q|k|v order (what lets the q|k|v group skip its
// concatenation). Gradients for all three outputs, and for some only (the
// missing ones zero). The projection's rows one element wider (odd strides):
// the kernel's scalar path.
TEST_F(FusedOpsCudaTest, QkvRopeIsTheRopesAndACopyOfVBitForBit) {
  const int64_t tokens = Quick() ? 300 : 2048, heads = 8, kv_heads = 2, d = 128;
  const int64_t width = (heads + 2 * kv_heads) * d;
  const torch::Tensor pos = Positions(tokens, 0, cuda_), inv = InvFreq(d, cuda_);
  const int64_t widths[3] = {heads * d, kv_heads * d, kv_heads * d};
  for (auto dtype : dtypes_) {
    for (int64_t pad : {0, 1}) {
      const torch::Tensor wide0 = Random({tokens, width + pad}, dtype, cuda_);
      const std::array<torch::Tensor, 3> g = {Random({tokens, heads, d}, dtype, cuda_),
                                              Random({tokens, kv_heads, d}, dtype, cuda_),
                                              Random({tokens, kv_heads, d}, dtype, cuda_)};
      auto split = [&](const torch::Tensor& w) {
        std::array<torch::Tensor, 3> parts;
        int64_t column = pad;
        for (size_t i = 0; i < 3; ++i) {
          parts[i] = w.narrow(1, column, widths[i]).view({tokens, widths[i] / d, d});
          column += widths[i];
        }
        return parts;
      };
      for (const std::array<bool, 3>& used : {std::array<bool, 3>{true, true, true}, {true, false, true},
                                             {false, true, false}}) {
        const std::string what = DTypeName(dtype) + " pad " + std::to_string(pad) + " used " +
                                 std::to_string(used[0]) + std::to_string(used[1]) + std::to_string(used[2]);
        torch::Tensor wa = wide0.clone().requires_grad_(), wb = wide0.clone().requires_grad_();
        const std::array<torch::Tensor, 3> a = split(wa), b = split(wb);
        std::array<torch::Tensor, 3> seen;  // the gradients the node hands back
        for (size_t i = 0; i < 3; ++i) {
          a[i].register_hook([&seen, i](torch::Tensor grad) { seen[i] = grad; });
        }
        const std::array<torch::Tensor, 3> oa = FusedQkvRope(a[0], a[1], a[2], pos, inv);
        const std::array<torch::Tensor, 3> ob = {FusedRope(b[0], pos, inv), FusedRope(b[1], pos, inv),
                                                 b[2].contiguous()};
        std::vector<torch::Tensor> outs_a, outs_b, grads;
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_TRUE(torch::equal(oa[i], ob[i])) << what << " output " << i;
          if (!used[i]) continue;
          outs_a.push_back(oa[i]);
          outs_b.push_back(ob[i]);
          grads.push_back(g[i]);
        }
        torch::autograd::backward(outs_a, grads);
        torch::autograd::backward(outs_b, grads);
        EXPECT_TRUE(torch::equal(wa.grad(), wb.grad())) << what;
        // One buffer, columns in order, rows `width` apart.
        int64_t column = 0;
        for (size_t i = 0; i < 3; ++i) {
          ASSERT_TRUE(seen[i].defined()) << what << " gradient " << i;
          EXPECT_TRUE(seen[i].storage().is_alias_of(seen[0].storage())) << what << " gradient " << i;
          EXPECT_EQ(seen[i].storage_offset(), seen[0].storage_offset() + column) << what << " gradient " << i;
          EXPECT_EQ(seen[i].stride(0), width) << what << " gradient " << i;
          column += widths[i];
        }
      }
    }
  }
}

// The same on the kernel: RotateHeadsInPlace is the kernel rotating the
// product's rows in place, QkvRopeGradient its inverse into one buffer (four
// parts, two launches, where the rotated heads end inside k).
TEST_F(FusedOpsCudaTest, ProductRotatedInPlaceAndItsGradientRotatedBack) {
  ExpectProductRotations(cuda_);
}

// FusedScaledCasts is mul_out(dst, src, scale) per copy, to the bit, for
// every pair of dtypes: LoRA-shaped sources (dense, and transposed views of a
// wider product, as the dB casts read them) into blocks of NaN-poisoned wider
// matrices (as the B blocks of a widened group), more copies than one launch
// takes; nothing outside the blocks is touched. Every fifth copy adds onto a
// block of random values instead (accumulate: dst.add_ of the cast copy, as
// the LoRA gradients are added into .grad).
TEST_F(FusedOpsCudaTest, ScaledCastsAreMulOutBitForBit) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 16}, {16, 4096}, {1024, 16}, {14336, 16},
                                                           {7, 3},     {1, 1},     {0, 5},     {333, 8}};
  for (auto src_dtype : dtypes_) {
    for (auto dst_dtype : dtypes_) {
      const std::string what = DTypeName(src_dtype) + " -> " + DTypeName(dst_dtype);
      std::vector<ScaledCast> fused, plain;
      std::vector<torch::Tensor> wide_fused, wide_plain;
      for (int i = 0; i < 100; ++i) {  // 100 > 48: three launches
        const auto [rows, cols] = shapes[i % shapes.size()];
        const double scale = i % 3 == 0 ? 1.0 : 0.37 * (i + 1);
        torch::Tensor src;
        if (i % 2 == 0) {
          src = Random({rows, cols}, src_dtype, cuda_, 2.0);
        } else {  // a transposed block of a wider product
          src = Random({cols, rows + 5}, src_dtype, cuda_, 2.0).narrow(1, 2, rows).t();
        }
        const bool accumulate = i % 5 == 3;
        const torch::Tensor wide =
            torch::full({rows + 3, cols + 9}, std::numeric_limits<double>::quiet_NaN(), cuda_).to(dst_dtype);
        if (accumulate) wide.narrow(0, 1, rows).narrow(1, 4, cols).copy_(Random({rows, cols}, dst_dtype, cuda_, 3.0));
        wide_fused.push_back(wide.clone());
        wide_plain.push_back(wide.clone());
        fused.push_back({src, wide_fused.back().narrow(0, 1, rows).narrow(1, 4, cols), scale, accumulate});
        plain.push_back({src, wide_plain.back().narrow(0, 1, rows).narrow(1, 4, cols), scale, accumulate});
      }
      FusedScaledCasts(fused);
      PlainScaledCasts(plain);
      for (size_t i = 0; i < wide_fused.size(); ++i) {
        // NaNs stay where nothing was written, in both: compare with NaN == NaN.
        const torch::Tensor a = wide_fused[i].to(torch::kFloat64), b = wide_plain[i].to(torch::kFloat64);
        EXPECT_TRUE(torch::equal(torch::isnan(a), torch::isnan(b))) << what << " copy " << i;
        EXPECT_TRUE(torch::equal(torch::nan_to_num(a, 0.0), torch::nan_to_num(b, 0.0))) << what << " copy " << i;
        EXPECT_TRUE(AllFinite(fused[i].dst)) << what << " copy " << i;
      }
    }
  }
}

TEST_F(FusedOpsCudaTest, SoftmaxCrossEntropyRowsMatchesFloat64Reference) {
  struct Case {
    int64_t rows, vocab, offset;
    double scale;
  };
  const std::vector<Case> cases = {{Quick() ? 64 : 512, 128256, 0, 2.0},
                                   {64, 128256, 0, 30.0},
                                   {5, 1000, 0, 1.0},
                                   {2, 8, 0, 1.0},
                                   {3, 262144, 0, 2.0},
                                   {33, 1001, 0, 3.0},
                                   {9, 32000, 1, 2.0}};
  for (auto dtype : dtypes_) {
    for (const Case& c : cases) {
      const std::string what = DTypeName(dtype) + " rows=" + std::to_string(c.rows) +
                               " V=" + std::to_string(c.vocab) + (c.offset ? " unaligned" : "") +
                               " scale=" + std::to_string(static_cast<int>(c.scale));
      const torch::Tensor t = CrossEntropyTargets(c.rows, c.vocab, cuda_);
      const torch::Tensor x = CrossEntropyLogits(c.rows, c.vocab, t, dtype, cuda_, c.scale, c.offset);
      ASSERT_EQ(x.storage_offset(), c.offset) << what;
      torch::Tensor untouched = CopyAt(x, c.offset);
      const torch::Tensor loss_only = FusedSoftmaxCrossEntropyRows(untouched, t, kIgnoreIndex, /*write_grad=*/false);
      EXPECT_TRUE(torch::equal(untouched, x)) << what << ": logits written without write_grad";
      torch::Tensor g = CopyAt(x, c.offset);
      const torch::Tensor loss = FusedSoftmaxCrossEntropyRows(g, t, kIgnoreIndex, /*write_grad=*/true);
      EXPECT_TRUE(torch::equal(loss, loss_only)) << what << ": loss differs with write_grad";

      std::string figures;
      ExpectCrossEntropyWithinBounds(what, x, t, loss_only, torch::Tensor(), figures);
      ExpectCrossEntropyWithinBounds(what, x, t, loss, g, figures);
      PrintFigures(what, figures);
    }
  }
}

// A target outside [0, V) that is not ignore_index (V, -1): loss NaN, the
// gradient softmax alone; the other rows as usual.
TEST_F(FusedOpsCudaTest, SoftmaxCrossEntropyRowsStrayTarget) {
  for (auto dtype : dtypes_) {
    for (int64_t vocab : {4096, 1001}) {
      const std::string what = DTypeName(dtype) + " V=" + std::to_string(vocab);
      torch::Tensor t = CrossEntropyTargets(6, vocab, torch::kCPU);
      t[1] = vocab;
      t[3] = -1;
      t = t.to(cuda_);
      const torch::Tensor x = CrossEntropyLogits(6, vocab, t, dtype, cuda_, 2.0);
      torch::Tensor g = x.clone();
      const torch::Tensor loss = FusedSoftmaxCrossEntropyRows(g, t, kIgnoreIndex, /*write_grad=*/true);
      std::string figures;
      ExpectCrossEntropyWithinBounds(what, x, t, loss, g, figures);
      PrintFigures(what, figures);
    }
  }
}

// Logits that are not contiguous (a narrow of wider rows) take Plain, which
// writes through the view: the same bits as Plain itself.
TEST_F(FusedOpsCudaTest, SoftmaxCrossEntropyRowsStridedIsPlain) {
  for (auto dtype : dtypes_) {
    const torch::Tensor t = CrossEntropyTargets(7, 1000, cuda_);
    const torch::Tensor wide = Random({7, 1003}, dtype, cuda_, 2.0);
    torch::Tensor a = wide.clone(), b = wide.clone();
    torch::Tensor va = a.narrow(1, 0, 1000), vb = b.narrow(1, 0, 1000);
    const torch::Tensor la = FusedSoftmaxCrossEntropyRows(va, t, kIgnoreIndex, /*write_grad=*/true);
    const torch::Tensor lb = PlainSoftmaxCrossEntropyRows(vb, t, kIgnoreIndex, /*write_grad=*/true);
    EXPECT_TRUE(torch::equal(la, lb)) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(a, b)) << DTypeName(dtype);
    EXPECT_TRUE(torch::equal(a.narrow(1, 1000, 3), wide.narrow(1, 1000, 3))) << DTypeName(dtype);
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
        ASSERT_EQ(k::RmsNormForward(x.data_ptr(), w.data_ptr(), y.data_ptr(), hidden, rstd.data_ptr<float>(), rows,
                                    hidden, kEps, kdtype(dtype), stream), "");
        EXPECT_TRUE(AllFinite(y) && AllFinite(rstd)) << what;
        EXPECT_TRUE(torch::equal(y, FusedRmsNorm(x, w, kEps))) << what;

        const size_t bytes = k::RmsNormBackwardWorkspaceBytes(rows, hidden);
        std::vector<torch::Tensor> dws;
        for (int run = 0; run < 2; ++run) {
          torch::Tensor dx = poisoned({rows, hidden}, o), dw = poisoned({hidden}, of);
          torch::Tensor scratch = poisoned({static_cast<int64_t>(bytes / sizeof(float))}, of);
          ASSERT_EQ(k::RmsNormBackward(dy.data_ptr(), hidden, x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                                       dx.data_ptr(), hidden, dw.data_ptr<float>(), scratch.data_ptr(), bytes, rows,
                                       hidden, kdtype(dtype), stream), "");
          EXPECT_TRUE(AllFinite(dx) && AllFinite(dw)) << what;
          dws.push_back(dw);
        }
        EXPECT_TRUE(torch::equal(dws[0], dws[1])) << what << ": dweight differs between runs";

        // With the residual add: x = T(residual + delta) with delta = dy, its
        // gradient adding dsum = dy.
        torch::Tensor sum = poisoned({rows, hidden}, o), y2 = poisoned({rows, hidden}, o);
        ASSERT_EQ(k::AddRmsNormForward(x.data_ptr(), dy.data_ptr(), sum.data_ptr(), w.data_ptr(), y2.data_ptr(),
                                       hidden, rstd.data_ptr<float>(), rows, hidden, kEps, kdtype(dtype), stream), "");
        EXPECT_TRUE(AllFinite(sum) && AllFinite(y2) && AllFinite(rstd)) << what;
        EXPECT_TRUE(torch::equal(sum, x + dy)) << what;
        EXPECT_TRUE(torch::equal(y2, FusedRmsNorm(x + dy, w, kEps))) << what;
        torch::Tensor dx = poisoned({rows, hidden}, o), dw = poisoned({hidden}, of);
        torch::Tensor scratch = poisoned({static_cast<int64_t>(bytes / sizeof(float))}, of);
        ASSERT_EQ(k::AddRmsNormBackward(dy.data_ptr(), hidden, dy.data_ptr(), hidden, sum.data_ptr(), w.data_ptr(),
                                        rstd.data_ptr<float>(), dx.data_ptr(), hidden, dw.data_ptr<float>(),
                                        scratch.data_ptr(), bytes, rows, hidden, kdtype(dtype), stream), "");
        EXPECT_TRUE(AllFinite(dx) && AllFinite(dw)) << what;
      }
    }
    for (int64_t n : {int64_t{1001}, int64_t{4096 * 7}}) {
      const torch::Tensor gate = Random({n}, dtype, cuda_, 3.0), up = Random({n}, dtype, cuda_);
      const torch::Tensor d = Random({n}, dtype, cuda_);
      torch::Tensor out = poisoned({n}, o), dg = poisoned({n}, o), du = poisoned({n}, o);
      // One row of n: the dense case.
      ASSERT_EQ(k::SwiGluForward(gate.data_ptr(), up.data_ptr(), n, out.data_ptr(), n, /*rows=*/1, n, kdtype(dtype),
                                 stream), "");
      ASSERT_EQ(k::SwiGluBackward(d.data_ptr(), n, gate.data_ptr(), up.data_ptr(), n, dg.data_ptr(), du.data_ptr(), n,
                                  /*rows=*/1, n, kdtype(dtype), stream), "");
      EXPECT_TRUE(AllFinite(out) && AllFinite(dg) && AllFinite(du)) << DTypeName(dtype) << " n=" << n;
      EXPECT_TRUE(torch::equal(out, FusedSwiGlu(gate, up))) << DTypeName(dtype) << " n=" << n;
    }
    for (int64_t pad : {0, 1}) {
      const int64_t tokens = 37, heads = 8, d = 128;
      const torch::Tensor wide = Random({tokens, heads * d + pad}, dtype, cuda_);
      const torch::Tensor x = wide.narrow(1, pad, heads * d).view({tokens, heads, d});
      const torch::Tensor pos = Positions(tokens, 0, cuda_), inv = InvFreq(d, cuda_);
      torch::Tensor out = poisoned({tokens, heads, d}, o), back = poisoned({tokens, heads, d}, o);
      const k::RopeSegment forward{x.data_ptr(), x.stride(0), out.data_ptr(), heads * d, heads, true};
      const k::RopeSegment inverse{out.data_ptr(), heads * d, back.data_ptr(), heads * d, heads, true};
      ASSERT_EQ(k::RopeSegments(&forward, 1, pos.data_ptr<int64_t>(), inv.data_ptr<float>(), tokens, d,
                                /*inverse=*/false, kdtype(dtype), stream),
                "");
      ASSERT_EQ(k::RopeSegments(&inverse, 1, pos.data_ptr<int64_t>(), inv.data_ptr<float>(), tokens, d,
                                /*inverse=*/true, kdtype(dtype), stream),
                "");
      EXPECT_TRUE(AllFinite(out) && AllFinite(back)) << DTypeName(dtype) << " pad=" << pad;
      EXPECT_TRUE(torch::equal(out, FusedRope(x, pos, inv))) << DTypeName(dtype) << " pad=" << pad;
      // The inverse rotation undoes the forward one up to the dtype's rounding.
      EXPECT_LT(NormRelError(back, x), 4 * Tolerance(dtype)) << DTypeName(dtype) << " pad=" << pad;
    }
    // The cross-entropy writes its loss (NaN-poisoned) and, in place, every
    // element of the gradient: ignored rows are NaN logits, which must come
    // back as zeros without being read. Twice: the same bits.
    for (int64_t vocab : {int64_t{128256}, int64_t{4096}, int64_t{1001}}) {
      for (int64_t rows : {int64_t{7}, Quick() ? int64_t{70} : int64_t{1030}}) {
        const std::string what = DTypeName(dtype) + " rows=" + std::to_string(rows) + " V=" + std::to_string(vocab);
        const torch::Tensor t = CrossEntropyTargets(rows, vocab, cuda_);
        torch::Tensor x = CrossEntropyLogits(rows, vocab, t, dtype, cuda_, 2.0);
        x.masked_fill_((t == kIgnoreIndex).unsqueeze(1), std::numeric_limits<float>::quiet_NaN());
        std::vector<torch::Tensor> losses, grads;
        for (int run = 0; run < 2; ++run) {
          torch::Tensor g = x.clone(), loss = poisoned({rows}, of);
          ASSERT_EQ(k::SoftmaxCrossEntropyRows(g.data_ptr(), t.data_ptr<int64_t>(), loss.data_ptr<float>(), rows,
                                               vocab, kIgnoreIndex, /*write_grad=*/true, kdtype(dtype), stream), "");
          EXPECT_TRUE(AllFinite(loss) && AllFinite(g)) << what;
          losses.push_back(loss);
          grads.push_back(g);
        }
        EXPECT_TRUE(torch::equal(losses[0], losses[1]) && torch::equal(grads[0], grads[1]))
            << what << ": not the same bits twice";
        torch::Tensor g = x.clone();
        EXPECT_TRUE(torch::equal(FusedSoftmaxCrossEntropyRows(g, t, kIgnoreIndex, true), losses[0])) << what;
        EXPECT_TRUE(torch::equal(g, grads[0])) << what;
      }
    }
  }
}

// Bad arguments come back as messages naming the launcher, before any launch;
// rows == 0 is nothing to do.
TEST_F(FusedOpsCudaTest, SoftmaxCrossEntropyRowsChecksArguments) {
  namespace k = trainerd::kernels;
  void* stream = c10::cuda::getCurrentCUDAStream().stream();
  const torch::Tensor x = Random({3, 64}, torch::kBFloat16, cuda_);
  const torch::Tensor t = torch::zeros({3}, torch::TensorOptions().dtype(torch::kInt64).device(cuda_));
  torch::Tensor loss = torch::zeros({3}, torch::TensorOptions().dtype(torch::kFloat32).device(cuda_));
  const auto call = [&](void* logits, const int64_t* targets, float* l, int64_t rows, int64_t vocab) {
    return k::SoftmaxCrossEntropyRows(logits, targets, l, rows, vocab, kIgnoreIndex, true, k::DType::kBFloat16,
                                      stream);
  };
  const int64_t* tp = t.data_ptr<int64_t>();
  float* lp = loss.data_ptr<float>();
  for (const std::string& e : {call(nullptr, tp, lp, 3, 64), call(x.data_ptr(), nullptr, lp, 3, 64),
                               call(x.data_ptr(), tp, nullptr, 3, 64), call(x.data_ptr(), tp, lp, -1, 64),
                               call(x.data_ptr(), tp, lp, 3, 0), call(x.data_ptr(), tp, lp, 3, -64),
                               call(x.data_ptr(), tp, lp, 3, int64_t{1} << 30)}) {
    EXPECT_EQ(e.rfind("SoftmaxCrossEntropyRows: ", 0), 0u) << e;
  }
  EXPECT_EQ(call(nullptr, nullptr, nullptr, 0, 64), "");
  EXPECT_TRUE(torch::equal(loss, torch::zeros_like(loss)));
}

// RopeSegments refuses what it cannot do, naming itself, and writes nothing
// then: too few or too many segments, a segment without heads or with token
// strides shorter than its heads, an odd or oversized head_dim, a null
// pointer; no tokens is fine.
TEST_F(FusedOpsCudaTest, RopeSegmentsChecksArguments) {
  namespace k = trainerd::kernels;
  void* stream = c10::cuda::getCurrentCUDAStream().stream();
  const int64_t tokens = 5, d = 8;
  const torch::Tensor x = Random({tokens, 3, d}, torch::kBFloat16, cuda_);
  torch::Tensor out = torch::zeros({tokens, 3, d}, x.options());
  const torch::Tensor pos = Positions(tokens, 0, cuda_), inv = InvFreq(d, cuda_);
  const k::RopeSegment good{x.data_ptr(), 3 * d, out.data_ptr(), 3 * d, 3, true};
  const auto call = [&](std::vector<k::RopeSegment> segments, int64_t head_dim, const int64_t* position,
                        int64_t n = 5) {  // n: tokens
    return k::RopeSegments(segments.data(), static_cast<int>(segments.size()), position, inv.data_ptr<float>(), n,
                           head_dim, false, k::DType::kBFloat16, stream);
  };
  const int64_t* pp = pos.data_ptr<int64_t>();
  k::RopeSegment no_heads = good, short_stride = good, short_out = good, null_x = good, null_out = good;
  no_heads.heads = 0;
  short_stride.token_stride = 3 * d - 1;
  short_out.out_token_stride = 2 * d;
  null_x.x = nullptr;
  null_out.out = nullptr;
  for (const std::string& e :
       {call({}, d, pp), call({good, good, good, good}, d, pp), call({good, no_heads}, d, pp),
        call({short_stride}, d, pp), call({good, short_out}, d, pp), call({good}, 7, pp), call({good}, 0, pp),
        call({good}, 8194, pp), call({good, null_x}, d, pp), call({null_out}, d, pp), call({good}, d, nullptr),
        call({good}, d, pp, -1)}) {
    EXPECT_EQ(e.rfind("RopeSegments: ", 0), 0u) << e;
  }
  EXPECT_EQ(call({null_x}, d, nullptr, 0), "");
  EXPECT_TRUE(torch::equal(out, torch::zeros_like(out)));
}
#endif  // TRAINERD_WITH_CUDA_KERNELS

}  // namespace
}  // namespace trainerd::engine
