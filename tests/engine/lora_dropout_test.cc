// LoRA dropout's masks (engine/lora_dropout.h, engine/kernels/philox.h): the
// generator is Philox4x32-10 as LibTorch's own philox_engine computes it; a
// mask keeps 1 - p of the elements, is a function of its draw and number
// alone, differs between numbers and draws, and repeats after the same seed;
// the dropped rows are x * mask * (1 / (1 - p)) bit for bit, in place or added;
// a module's backward makes its dropped input and input gradient term through one mask.
// Runs on TRAINERD_TEST_DEVICE / TRAINERD_TEST_DTYPE (CPU float32 in CI); on
// CUDA the masks come from the kernel and must equal the host's.
#include <cmath>

#include <ATen/core/PhiloxRNGEngine.h>

#include "engine/kernels/philox.h"
#include "engine/lora_dropout.h"
#include "tests/engine/test_support.h"

namespace trainerd::testing {
namespace {

// LibTorch's philox_engine(seed, subsequence, offset) returns, in its first
// four calls, the words of counter (offset, subsequence) under key seed.
TEST(Philox, IsLibTorchsPhiloxEngine) {
  const uint64_t cases[][3] = {{0, 0, 0}, {42, 7, 3}, {0x0123456789abcdefULL, 0xfedcba9876543210ULL, 1ULL << 40},
                               {~0ULL, ~0ULL, ~0ULL}};
  for (const auto& c : cases) {
    at::philox_engine engine(c[0], c[1], c[2]);
    const kernels::Philox4 words = kernels::DropoutWords(c[0], c[1], c[2]);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(words.v[j], engine()) << "seed " << c[0] << " word " << j;
  }
}

// Each element draws 16 bits: p in steps of 2^-16, two elements a word.
TEST(Philox, ThresholdsAreTheProbability) {
  EXPECT_EQ(kernels::DropoutThreshold(0.0), 0u);
  EXPECT_EQ(kernels::DropoutThreshold(0.5), 0x8000u);
  EXPECT_EQ(kernels::DropoutThreshold(0.25), 0x4000u);
  EXPECT_EQ(kernels::DropoutThreshold(0.05), 3277u);  // 0.050003
  EXPECT_EQ(kernels::DropoutThreshold(1.0), 0xFFFFu);
  EXPECT_TRUE(kernels::DropoutKeeps(0x8000u, 0x8000u));
  EXPECT_FALSE(kernels::DropoutKeeps(0x7FFFu, 0x8000u));
  const kernels::Philox4 words{{0x11112222u, 0x33334444u, 0x55556666u, 0x77778888u}};
  EXPECT_EQ(kernels::DropoutDraw16(words, 0), 0x2222u);
  EXPECT_EQ(kernels::DropoutDraw16(words, 1), 0x1111u);
  EXPECT_EQ(kernels::DropoutDraw16(words, 6), 0x8888u);
  EXPECT_EQ(kernels::DropoutDraw16(words, 7), 0x7777u);
}

// A draw with a fixed seed and offset, as the CUDA generator would give it.
engine::DropoutDraw FixedDraw(uint64_t seed, uint64_t offset, int64_t masks) {
  engine::DropoutDraw d;
  d.philox.seed = seed;
  d.philox.offset = offset;
  d.masks = masks;
  return d;
}

TEST(LoraDropout, MasksKeepOneMinusPAndDifferByNumber) {
  const engine::DropoutDraw draw = FixedDraw(1234, 8, 4);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  const int64_t rows = 1000, cols = 1003;  // not a multiple of 8: groups of eight span rows
  const double n = double(rows * cols);
  for (double p : {0.1, 0.5}) {
    const torch::Tensor m0 = engine::DropoutKeepMask({&draw, 0, p}, rows, cols, opts).to(torch::kFloat64).cpu();
    const torch::Tensor m1 = engine::DropoutKeepMask({&draw, 1, p}, rows, cols, opts).to(torch::kFloat64).cpu();
    EXPECT_TRUE(torch::equal(m0, engine::DropoutKeepMask({&draw, 0, p}, rows, cols, opts).to(torch::kFloat64).cpu()))
        << "a mask is a function of its draw and number";
    EXPECT_TRUE(((m0 == 0) | (m0 == 1)).all().item<bool>());
    // Within 5 standard deviations of a binomial count.
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(m0.mean().item<double>(), 1 - p, 5 * sd) << "p " << p;
    EXPECT_NEAR(m1.mean().item<double>(), 1 - p, 5 * sd) << "p " << p;
    // Independent masks agree on p^2 + (1 - p)^2 of the elements.
    const double agree = (m0 == m1).to(torch::kFloat64).mean().item<double>();
    EXPECT_NEAR(agree, p * p + (1 - p) * (1 - p), 6 * std::sqrt(0.25 / n)) << "p " << p;
    // Rows are not repeats of one another (the element index runs on across rows).
    EXPECT_FALSE(torch::equal(m0[0], m0[1]));
  }
  // The same numbers from another draw's offset: another mask.
  const engine::DropoutDraw later = FixedDraw(1234, 12, 4);
  EXPECT_FALSE(torch::equal(engine::DropoutKeepMask({&draw, 0, 0.5}, 8, 8, opts),
                            engine::DropoutKeepMask({&later, 0, 0.5}, 8, 8, opts)));
  // Mask 4 of the first draw is mask 0 of the one at offset + 4 (no two draws share a number).
  EXPECT_TRUE(torch::equal(engine::DropoutKeepMask({&draw, 4, 0.5}, 8, 8, opts),
                           engine::DropoutKeepMask({&later, 0, 0.5}, 8, 8, opts)));
}

// On the test device the kernel (CUDA) or the host loop (CPU) makes the mask;
// either way it is the host's, element for element.
TEST(LoraDropout, DeviceMaskIsTheHostMask) {
  const engine::DropoutDraw draw = FixedDraw(99, 40, 2);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{33, 64}, {7, 13}, {1, 3}}) {
    const torch::Tensor device = engine::DropoutKeepMask({&draw, 1, 0.3}, rows, cols, opts).cpu();
    const torch::Tensor host = engine::DropoutKeepMask({&draw, 1, 0.3}, rows, cols, torch::kFloat32);
    EXPECT_TRUE(torch::equal(device.to(torch::kFloat32), host)) << rows << "x" << cols;
  }
}

TEST(LoraDropout, DroppedRowsAreTheMaskTimesTheScale) {
  const engine::DropoutDraw draw = FixedDraw(5, 0, 3);
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  torch::manual_seed(3);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{24, 40}, {5, 7}}) {
    const engine::LoraDropoutMask m{&draw, 2, 0.3};
    const torch::Tensor wide = torch::randn({rows, cols + 8}, opts);
    const torch::Tensor x = wide.narrow(1, 0, cols);  // rows cols + 8 apart
    const torch::Tensor want = x * engine::DropoutKeepMask(m, rows, cols, opts) * (1.0 / (1.0 - 0.3));
    EXPECT_TRUE(torch::equal(engine::DropoutRows(x, m), want)) << rows << "x" << cols;
    EXPECT_TRUE(torch::equal(engine::DropoutRows(x.contiguous(), m), want));
    // Added into a strided accumulator, in place: acc + dropped, as LibTorch
    // adds (rows 4 and 8 elements wider: the kernel's scalar and vector paths).
    for (int64_t extra : {4, 8}) {
      torch::Tensor acc_rows = torch::randn({rows, cols + extra}, opts);
      torch::Tensor acc = acc_rows.narrow(1, 0, cols);
      const torch::Tensor expected = acc + want;
      const torch::Tensor right = acc_rows.narrow(1, cols, extra).clone();
      engine::AddDropoutRows(acc, x, m);
      EXPECT_TRUE(torch::equal(acc, expected)) << rows << "x" << cols << " in rows of " << cols + extra;
      EXPECT_TRUE(torch::equal(acc_rows.narrow(1, cols, extra), right)) << "columns beyond the matrix were written";
    }
  }
}

// A module's backward through its mask (LoraDropoutBackward): the dropped
// input bit for bit, and the input gradient's term u a through the same mask
// added into acc, which stays as it was wherever the mask drops. On CUDA the
// shapes with 8-aligned columns and strides take the one-pass kernel (rows not
// a multiple of its 4-row tiles or 32-row blocks, a rank of 3, u and a as views
// of wider ones), the others the two steps it replaces.
void ExpectBackwardThroughOneMask(torch::Dtype dtype) {
  const engine::DropoutDraw draw = FixedDraw(77, 16, 4);
  const auto opts = torch::TensorOptions().dtype(dtype).device(TorchTestDevice());
  const double p = 0.25, scale = 1.0 / (1.0 - p);
  // The term's rounding to the dtype may differ by its last bit from the
  // reference's (another float32 sum order); anything else is exact.
  const double rel = dtype == torch::kFloat32 ? 1e-5 : dtype == torch::kFloat16 ? 1.0 / 1024 : 1.0 / 128;
  torch::manual_seed(11);
  struct Case {
    int64_t rows, cols, rank, extra;  // extra: acc's and x's rows are cols + extra apart
  };
  for (const Case c : {Case{37, 64, 16, 8}, Case{9, 24, 3, 0}, Case{70, 2048, 16, 16}, Case{5, 7, 2, 1},
                       Case{12, 40, 4, 4}, Case{33, 48, 20, 8}}) {
    const std::string where = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " r" + std::to_string(c.rank) +
                              " +" + std::to_string(c.extra);
    const engine::LoraDropoutMask m{&draw, 3, p};
    const torch::Tensor x = torch::randn({c.rows, c.cols + c.extra}, opts).narrow(1, 0, c.cols);
    const torch::Tensor u = torch::randn({c.rows, c.rank + 5}, opts).narrow(1, 2, c.rank);  // a member's columns
    const torch::Tensor a = torch::randn({c.rank + 4, c.cols}, opts).narrow(0, 4, c.rank);   // its rows of A
    torch::Tensor acc_rows = torch::randn({c.rows, c.cols + c.extra}, opts);
    torch::Tensor acc = acc_rows.narrow(1, 0, c.cols);
    const torch::Tensor acc0 = acc.clone();
    const torch::Tensor beyond = acc_rows.narrow(1, c.cols, c.extra).clone();
    const torch::Tensor keep = engine::DropoutKeepMask(m, c.rows, c.cols, opts);

    const torch::Tensor dropped = engine::LoraDropoutBackward(x, u, a, acc, m);
    EXPECT_TRUE(torch::equal(dropped, x * keep * scale)) << where;
    EXPECT_TRUE(torch::equal(acc_rows.narrow(1, c.cols, c.extra), beyond)) << where << ": columns beyond written";

    const torch::Tensor kept = keep.to(torch::kBool);
    EXPECT_TRUE(torch::equal(acc.masked_select(~kept), acc0.masked_select(~kept))) << where << ": dropped positions";
    const torch::Tensor term = torch::mm(u.to(torch::kFloat32), a.to(torch::kFloat32)).to(dtype);
    const torch::Tensor want = acc0 + term * keep * scale;
    const torch::Tensor err = (acc.to(torch::kFloat64) - want.to(torch::kFloat64)).abs();
    // Rounding scales with the sum's terms, sum |u_k a_k|, and acc's own size.
    const torch::Tensor magnitude = torch::mm(u.to(torch::kFloat64).abs(), a.to(torch::kFloat64).abs());
    const torch::Tensor bound = (magnitude * scale + acc0.to(torch::kFloat64).abs()) * rel;
    EXPECT_TRUE((err <= bound).all().item<bool>()) << where << ": largest error " << err.max().item<double>();

    // The two steps the kernel replaces agree within the same bound.
    torch::Tensor two_steps = acc0.clone();
    engine::AddDropoutRows(two_steps, torch::mm(u, a), m);
    const torch::Tensor step_err = (acc.to(torch::kFloat64) - two_steps.to(torch::kFloat64)).abs();
    EXPECT_TRUE((step_err <= bound).all().item<bool>())
        << where << ": against two steps " << step_err.max().item<double>();
  }
}

TEST(LoraDropout, BackwardMakesBothTermsThroughOneMask) { ExpectBackwardThroughOneMask(TorchTestDtype()); }

// model.dtype float16 takes the kernel's half instantiation, whose roundings
// are paired conversions of their own; on CUDA only (CI's CPU LibTorch has no
// float16 products).
TEST(LoraDropout, BackwardMakesBothTermsThroughOneMaskInFloat16) {
  if (!TorchTestDevice().is_cuda()) GTEST_SKIP() << "float16 runs on CUDA";
  ExpectBackwardThroughOneMask(torch::kFloat16);
}

// Draws come from the default generator: new masks each draw, the same ones
// after the same seed (what resuming from a checkpoint relies on).
TEST(LoraDropout, DrawsFollowTheGenerator) {
  const auto opts = torch::TensorOptions().dtype(TorchTestDtype()).device(TorchTestDevice());
  auto mask_of_next_draw = [&]() {
    const engine::DropoutDraw d = engine::NewDropoutDraw(TorchTestDevice(), 7);
    EXPECT_EQ(d.masks, 7);
    return engine::DropoutKeepMask({&d, 6, 0.5}, 16, 16, opts);
  };
  torch::manual_seed(8);
  const torch::Tensor first = mask_of_next_draw(), second = mask_of_next_draw();
  EXPECT_FALSE(torch::equal(first, second));
  torch::manual_seed(8);
  EXPECT_TRUE(torch::equal(mask_of_next_draw(), first));
  EXPECT_TRUE(torch::equal(mask_of_next_draw(), second));
  // A draw survives its trip through an autograd node's saved integers.
  const engine::DropoutDraw d = engine::NewDropoutDraw(TorchTestDevice(), 3);
  const engine::DropoutDraw back = engine::DropoutDrawFromInts(engine::DropoutDrawToInts(d));
  EXPECT_TRUE(torch::equal(engine::DropoutKeepMask({&d, 2, 0.5}, 9, 9, opts),
                           engine::DropoutKeepMask({&back, 2, 0.5}, 9, 9, opts)));
}

}  // namespace
}  // namespace trainerd::testing
