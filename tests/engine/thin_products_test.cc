// LoRA's side products (engine/thin_products.h): on the CPU, ThinMm is
// LibTorch's product bit for bit; on CUDA the thin-product kernels agree with
// a float32 product of the same 16-bit inputs, write nothing outside their
// output, give the same bits twice, and their launchers refuse what they
// cannot do by name. Run on CUDA with TRAINERD_TEST_DEVICE=cuda or wherever a
// device is present; the CUDA tests skip without one. TRAINERD_FUSED_TEST_QUICK=1
// keeps the cases of up to about 5 M elements (for compute-sanitizer).
#include "engine/thin_products.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/fused_ops.h"

#ifdef TRAINERD_WITH_CUDA_KERNELS
#include "engine/kernels/thin_products.h"
#endif

namespace trainerd::engine {
namespace {

// A (rows, cols) view into a NaN-filled buffer `extra` columns wider (starting
// at column `offset`, 0 or a multiple of 8): the neighbours show any stray write.
torch::Tensor ViewInWider(int64_t rows, int64_t cols, int64_t extra, int64_t offset, const torch::TensorOptions& o) {
  const torch::Tensor buffer = torch::full({rows, cols + extra}, std::numeric_limits<float>::quiet_NaN(), o);
  return buffer.narrow(1, offset, cols);
}

// The buffer around a ViewInWider view, outside the view: all NaN.
bool NeighboursUntouched(const torch::Tensor& view, int64_t extra, int64_t offset) {
  const torch::Tensor buffer = view.as_strided({view.size(0), view.size(1) + extra}, {view.stride(0), 1},
                                               view.storage_offset() - offset);
  bool untouched = true;
  if (offset > 0) untouched = untouched && buffer.narrow(1, 0, offset).isnan().all().item<bool>();
  const int64_t after = extra - offset;
  if (after > 0) untouched = untouched && buffer.narrow(1, offset + view.size(1), after).isnan().all().item<bool>();
  return untouched;
}

TEST(ThinProductsCpuTest, IsLibTorchsProductBitForBit) {
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({70, 48});
  const torch::Tensor a = torch::randn({16, 48});
  const torch::Tensor g = torch::randn({70, 96});
  // x A^T into the columns of a wider buffer, t^T g as a new tensor.
  const torch::Tensor t = ViewInWider(70, 16, 8, 0, x.options());
  EXPECT_FALSE(ThinMmUsesKernel(t, x, a.t()));
  ThinMmOut(t, x, a.t());
  EXPECT_TRUE(torch::equal(t, torch::mm(x, a.t())));
  EXPECT_TRUE(NeighboursUntouched(t, 8, 0));
  EXPECT_TRUE(torch::equal(ThinMm(t.t(), g), torch::mm(t.t(), g)));
}

#ifdef TRAINERD_WITH_CUDA_KERNELS

// A case of `elements` in its large operand runs unless the run is quick and it is large.
bool Runs(int64_t elements) { return std::getenv("TRAINERD_FUSED_TEST_QUICK") == nullptr || elements <= 5000000; }

class ThinProductsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    if (!FusedKernelsBuilt()) GTEST_SKIP() << "this build has no fused CUDA kernels";
    torch::manual_seed(5);
  }
  const torch::Device cuda_{torch::kCUDA};
};

// out against the float32 product of the same rounded inputs: within one
// rounding to the dtype of each element, plus float32 reordering of the sum
// (relative to the largest magnitude of the result).
void ExpectMatchesFloat32(const std::string& what, const torch::Tensor& out, const torch::Tensor& a,
                          const torch::Tensor& b) {
  const torch::Tensor ref = torch::mm(a.to(torch::kFloat32), b.to(torch::kFloat32));
  const torch::Tensor got = out.to(torch::kFloat32);
  const double scale = ref.abs().max().item<double>();
  const double unit = out.scalar_type() == torch::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  const torch::Tensor bound = ref.abs() * unit + 1e-5 * scale;
  const double worst = ((got - ref).abs() - bound).max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": an element off by more than a rounding (excess " << worst << ", scale "
                        << scale << ")";
  const double rel = ((got - ref).abs().max() / scale).item<double>();
  std::printf("[  figure  ] %s: max |error| / max |result| = %.2e\n", what.c_str(), rel);
}

struct RightCase {
  int64_t m, k, r;
  bool w_rows;       // w (r, k) rows contiguous (A), else columns ((k, r) rows: sB)
  int64_t x_extra;   // x's rows this much wider than k
  int64_t y_extra;   // y's buffer this much wider than r
};

TEST_F(ThinProductsCudaTest, RightProductMatchesFloat32Product) {
  // The 8b shapes (one split; several), tails of m and k (k not a multiple of 8),
  // every rank tile count, both layouts of w, strided x and y.
  const std::vector<RightCase> cases = {
      {8192, 4096, 48, true, 48, 0},  {8192, 14336, 16, true, 0, 16}, {8192, 4096, 16, false, 0, 8},
      {1000, 4096, 64, false, 8, 8},  {3000, 200, 24, true, 16, 8},   {77, 203, 8, true, 5, 24},
      {4133, 1024, 40, false, 0, 24}, {65, 4096, 32, true, 0, 0},
  };
  for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat16}) {
    const auto o = torch::TensorOptions().device(cuda_).dtype(dtype);
    for (const RightCase& c : cases) {
      if (!Runs(c.m * c.k)) continue;
      const std::string what = std::string(dtype == torch::kBFloat16 ? "bf16" : "fp16") + " right m " +
                               std::to_string(c.m) + " k " + std::to_string(c.k) + " r " + std::to_string(c.r) +
                               (c.w_rows ? " w rows" : " w columns");
      const int64_t x_width = (c.k + c.x_extra + 7) / 8 * 8;  // rows a multiple of 8 apart
      const torch::Tensor x = torch::randn({c.m, x_width}, o).narrow(1, 0, c.k);
      // A (r, k), rows a multiple of 8 apart; or sB read in place: the (k, r)
      // columns of a wider (k, r + 40) matrix, as in the widened matrix.
      const torch::Tensor w = c.w_rows ? torch::randn({c.r, (c.k + 7) / 8 * 8}, o).narrow(1, 0, c.k).t()
                                       : torch::randn({c.k, c.r + 40}, o).narrow(1, 8, c.r);
      const int64_t offset = c.y_extra >= 8 ? 8 : 0;
      const torch::Tensor y = ViewInWider(c.m, c.r, c.y_extra, offset, o);
      ASSERT_TRUE(ThinMmUsesKernel(y, x, w)) << what;
      ThinMmOut(y, x, w);
      ExpectMatchesFloat32(what, y, x, w);
      EXPECT_TRUE(NeighboursUntouched(y, c.y_extra, offset)) << what << ": wrote outside y";
      // The same bits again (fixed summation order, splits included).
      const torch::Tensor again = ThinMm(x, w);
      EXPECT_TRUE(torch::equal(again, y)) << what << ": not reproducible";
    }
  }
}

struct LeftCase {
  int64_t m, r, n;
  int64_t t_extra;  // t's rows this much wider than r (t a narrow of wider rows)
  int64_t g_extra;
};

TEST_F(ThinProductsCudaTest, LeftProductMatchesFloat32Product) {
  const std::vector<LeftCase> cases = {
      {8192, 48, 6144, 8, 0},   {8192, 32, 28672, 0, 32}, {8192, 16, 4096, 16, 16}, {8192, 16, 14336, 0, 0},
      {512, 16, 34816, 0, 0},   {1000, 64, 200, 0, 8},    {77, 24, 4100, 8, 4},     {4133, 8, 1000, 0, 24},
  };
  for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat16}) {
    const auto o = torch::TensorOptions().device(cuda_).dtype(dtype);
    for (const LeftCase& c : cases) {
      if (!Runs(c.m * c.n)) continue;
      const std::string what = std::string(dtype == torch::kBFloat16 ? "bf16" : "fp16") + " left m " +
                               std::to_string(c.m) + " r " + std::to_string(c.r) + " n " + std::to_string(c.n);
      const torch::Tensor t = torch::randn({c.m, c.r + c.t_extra}, o).narrow(1, 0, c.r);
      const int64_t g_width = (c.n + c.g_extra + 7) / 8 * 8;
      const torch::Tensor g = torch::randn({c.m, g_width}, o).narrow(1, 0, c.n);
      const int64_t z_extra = (c.n + 7) / 8 * 8 - c.n + 8;
      const torch::Tensor z = ViewInWider(c.r, c.n, z_extra, 0, o);
      ASSERT_TRUE(ThinMmUsesKernel(z, t.t(), g)) << what;
      ThinMmOut(z, t.t(), g);
      ExpectMatchesFloat32(what, z, t.t(), g);
      EXPECT_TRUE(NeighboursUntouched(z, z_extra, 0)) << what << ": wrote outside z";
      EXPECT_TRUE(torch::equal(ThinMm(t.t(), g), z)) << what << ": not reproducible";
    }
  }
}

TEST_F(ThinProductsCudaTest, OtherShapesAndLayoutsTakeLibTorchsProduct) {
  const auto o = torch::TensorOptions().device(cuda_).dtype(torch::kBFloat16);
  const torch::Tensor x = torch::randn({256, 512}, o);
  // Too wide a thin side, float32, a column-major x, a row distance not a multiple of 8.
  const std::vector<std::pair<torch::Tensor, torch::Tensor>> products = {
      {x, torch::randn({512, 65}, o)},
      {x.to(torch::kFloat32), torch::randn({512, 16}, o.dtype(torch::kFloat32))},
      {torch::randn({512, 256}, o).t(), torch::randn({512, 16}, o)},
      {torch::randn({256, 517}, o).narrow(1, 0, 512), torch::randn({512, 16}, o)},
  };
  for (const auto& [a, b] : products) {
    const torch::Tensor out = torch::empty({a.size(0), b.size(1)}, a.options());
    EXPECT_FALSE(ThinMmUsesKernel(out, a, b)) << a.sizes() << " x " << b.sizes();
    ThinMmOut(out, a, b);
    EXPECT_TRUE(torch::equal(out, torch::mm(a, b)));
  }
}

TEST_F(ThinProductsCudaTest, LaunchersRefuseWhatTheyCannotDo) {
  const auto o = torch::TensorOptions().device(cuda_).dtype(torch::kBFloat16);
  const torch::Tensor x = torch::randn({128, 1024}, o), w = torch::randn({16, 1024}, o);
  const torch::Tensor y = torch::zeros({128, 16}, o);
  using kernels::DType;
  auto right = [&](const void* xp, int64_t x_ld, int64_t r, DType dtype, size_t ws) {
    return kernels::ThinRightProduct(xp, x_ld, w.data_ptr(), 1024, 1, y.data_ptr(), 16, 128, 1024, r, nullptr, ws,
                                     dtype, nullptr);
  };
  EXPECT_NE(right(x.data_ptr(), 1024, 16, DType::kFloat32, 0).find("float16 or bfloat16"), std::string::npos);
  EXPECT_NE(right(x.data_ptr(), 1024, 65, DType::kBFloat16, 0).find("wider than 64"), std::string::npos);
  EXPECT_NE(right(x.data_ptr(), 1020, 16, DType::kBFloat16, 0).find("laid out"), std::string::npos);
  EXPECT_NE(right(static_cast<const char*>(x.data_ptr()) + 2, 1024, 16, DType::kBFloat16, 0).find("laid out"),
            std::string::npos);
  // 128 rows give two blocks: the sum over 1024 is split, and needs a workspace.
  ASSERT_GT(kernels::ThinRightProductWorkspaceBytes(128, 1024, 16), 0u);
  EXPECT_NE(right(x.data_ptr(), 1024, 16, DType::kBFloat16, 0).find("workspace"), std::string::npos);
  const std::string left = kernels::ThinLeftProduct(x.data_ptr(), 1024, x.data_ptr(), 1024, y.data_ptr(), 8, 128,
                                                    16, 64, nullptr, 0, DType::kBFloat16, nullptr);
  EXPECT_NE(left.find("ThinLeftProduct"), std::string::npos) << left;
  // Nothing was launched: y is still zeros.
  EXPECT_TRUE(y.eq(0).all().item<bool>());
}

#endif  // TRAINERD_WITH_CUDA_KERNELS

}  // namespace
}  // namespace trainerd::engine
