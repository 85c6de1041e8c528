// Fused CUDA kernels for the Llama decoder's memory-bound steps: RMSNorm,
// SwiGLU and rotary embeddings (RoPE), forward and backward, the softmax
// cross-entropy of rows of logits with its gradient, in place, many small
// scaled copies in one launch (LoRA's parameter and gradient casts), and LoRA
// dropout with masks made again from the generator's state (philox.h).
//
// Torch-free on purpose: the launchers take raw device pointers, sizes, a
// dtype and a cudaStream_t passed as `void*`, so this header can be included
// by nvcc-compiled files and by the LibTorch wrapper (engine/fused_ops.h)
// alike. Every launcher returns "" on success or a message naming the
// launcher and the problem (bad arguments, or the CUDA error of the launch,
// checked with cudaGetLastError after each kernel). Launches are
// asynchronous on `stream`; errors of the running kernel surface later, at
// the next synchronising CUDA call.
//
// Numerics (all ops): elements are read in the model dtype, all math is
// float32, and each output is rounded once to the dtype at the end; the
// exceptions mirror transformers' rounding points and are named per op.
//
// Memory: every pointer is device memory on the current CUDA device.
// Tensors are dense unless a stride argument says otherwise. Rows of 16-byte
// aligned pointers whose length is a multiple of 16 bytes take 16-byte
// vector loads; any other layout takes a scalar path with the same results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trainerd::kernels {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// ---- RMSNorm (transformers' LlamaRMSNorm) ----------------------------------
// y = T(w * T(x * rstd)) with rstd = 1 / sqrt(mean(x^2) + eps) per row:
// the normalised value is rounded to the dtype before the multiply by the
// weight, as transformers does (`weight * hidden.to(input_dtype)`).
//   x:      (rows, hidden) dtype, dense
//   weight: (hidden) dtype
//   y:      (rows, hidden) dtype, rows y_stride >= hidden elements apart
//           (room a consumer widens, engine/linear_group.h); may not alias x
//   rstd:   (rows) float32, saved for the backward
// One block per row; hidden of any size (the vector path covers up to 16384
// for 16-bit dtypes, 8192 for float32; larger rows take the scalar path).
[[nodiscard]] std::string RmsNormForward(const void* x, const void* weight, void* y, int64_t y_stride, float* rstd,
                                         int64_t rows, int64_t hidden, float eps, DType dtype, void* stream);

// Bytes of float32 scratch RmsNormBackward needs when it computes dweight:
// one partial row of `hidden` sums per block of the backward grid (at most
// 512 blocks, fewer for fewer rows). 0 when rows == 0.
[[nodiscard]] size_t RmsNormBackwardWorkspaceBytes(int64_t rows, int64_t hidden);

// The gradients of RmsNormForward, straight through the dtype roundings:
//   dx_j = rstd * g_j - rstd^3 / hidden * x_j * sum_i(g_i * x_i),  g = dy * w
//   dweight = sum over rows of dy * T(x * rstd)
//   dy:    (rows, hidden) dtype, rows dy_stride >= hidden elements apart
//   x:     (rows, hidden) dtype, dense; weight: (hidden); rstd: (rows) float32
//   dx:    (rows, hidden) dtype, rows dx_stride >= hidden elements apart
//          (the columns in between are not written)
//   dweight: (hidden) float32, or nullptr when the weight needs no gradient;
//            then `workspace` (RmsNormBackwardWorkspaceBytes) must be given.
//            Summed per block into the workspace, then over blocks in a fixed
//            order by a second kernel: no atomics, the same bits every run.
[[nodiscard]] std::string RmsNormBackward(const void* dy, int64_t dy_stride, const void* x, const void* weight,
                                          const float* rstd, void* dx, int64_t dx_stride, float* dweight,
                                          void* workspace, size_t workspace_bytes, int64_t rows, int64_t hidden,
                                          DType dtype, void* stream);

// RMSNorm of a residual sum, the add inside the kernel (no pass of its own):
// sum = T(residual + delta) (one rounding, as an add in the dtype), written to
// `sum`, then y and rstd of sum exactly as RmsNormForward(sum, ...) gives them.
//   residual, delta, sum: (rows, hidden) dtype, dense; sum may not alias either
//   weight, y, y_stride, rstd: as RmsNormForward
[[nodiscard]] std::string AddRmsNormForward(const void* residual, const void* delta, void* sum, const void* weight,
                                            void* y, int64_t y_stride, float* rstd, int64_t rows, int64_t hidden,
                                            float eps, DType dtype, void* stream);

// The backward of AddRmsNormForward: residual and delta share one gradient,
//   dx = T(T(RMSNorm's dx) + dsum)
// with dsum the gradient that reaches `sum` from its other consumers
// ((rows, hidden) dtype, rows dsum_stride >= hidden elements apart): what
// autograd gives for the norm's backward followed by the add of the two
// gradients, rounding for rounding. dx's rows are dx_stride >= hidden
// elements apart, as RmsNormBackward's. The other arguments as
// RmsNormBackward, with x the saved sum.
[[nodiscard]] std::string AddRmsNormBackward(const void* dy, int64_t dy_stride, const void* dsum, int64_t dsum_stride,
                                             const void* sum, const void* weight, const float* rstd, void* dx,
                                             int64_t dx_stride, float* dweight, void* workspace,
                                             size_t workspace_bytes, int64_t rows, int64_t hidden, DType dtype,
                                             void* stream);

// ---- SwiGLU ----------------------------------------------------------------
// Over (rows, cols) matrices of one dtype whose rows are a stride (in
// elements, >= cols) apart, so that gate and up can be the two column halves
// of one gate|up product and out the left part of a wider buffer:
// out = silu(gate) * up; gate and up share in_stride.
[[nodiscard]] std::string SwiGluForward(const void* gate, const void* up, int64_t in_stride, void* out,
                                        int64_t out_stride, int64_t rows, int64_t cols, DType dtype, void* stream);
// dgate = dout * up * silu'(gate), dup = dout * silu(gate); silu recomputed
// from gate (nothing else saved). dgate and dup share grad_stride (one
// buffer's halves when it is 2 * cols).
[[nodiscard]] std::string SwiGluBackward(const void* dout, int64_t dout_stride, const void* gate, const void* up,
                                         int64_t in_stride, void* dgate, void* dup, int64_t grad_stride, int64_t rows,
                                         int64_t cols, DType dtype, void* stream);

// ---- Rotary embedding (rotate_half convention) -----------------------------
// out = x * cos + rotate_half(x) * sin over each head's d = head_dim values,
// pairing element i with i + d/2. Per token t and i < d/2:
//   f = float(position[t]) * inv_freq[i] (float32), c = T(cosf(f)), s = T(sinf(f))
// (accurate cosf/sinf, rounded to the dtype as transformers rounds its cos/sin
// tables), then in float32: out_i = x_i*c - x_{i+d/2}*s, out_{i+d/2} = x_{i+d/2}*c + x_i*s.
// inverse = true applies the transposed rotation (sin negated): the backward.
// Up to kMaxRopeSegments (x, out) pairs of the same tokens and head_dim go in
// one launch, each rotated (rotate) or copied unchanged: attention's q and k
// rotated and v copied, or their gradients written into the columns of one
// q|k|v buffer. Per segment:
//   x:   (tokens, heads, head_dim) dtype; token t, head h, element i at
//        x + t * token_stride + h * head_dim + i (token_stride in elements,
//        >= heads * head_dim: a narrow of a fused q|k|v projection works)
//   out: (tokens, heads, head_dim) dtype at out + t * out_token_stride + h * head_dim + i
//        (out_token_stride >= heads * head_dim: heads * head_dim for a dense
//        result, wider to write into columns of a q|k|v gradient)
// No output may alias any input or another output.
//   position: (tokens) int64; inv_freq: (head_dim / 2) float32
// head_dim must be even and at most 8192.
struct RopeSegment {
  const void* x = nullptr;
  int64_t token_stride = 0;
  void* out = nullptr;
  int64_t out_token_stride = 0;
  int64_t heads = 0;
  bool rotate = true;  // false: out = x
};
constexpr int kMaxRopeSegments = 3;
[[nodiscard]] std::string RopeSegments(const RopeSegment* segments, int count, const int64_t* position,
                                       const float* inv_freq, int64_t tokens, int64_t head_dim, bool inverse,
                                       DType dtype, void* stream);

// ---- Softmax cross-entropy, in place ---------------------------------------
// Softmax cross-entropy of each row of logits (rows, vocab), dtype T, dense:
//   loss[r] = logsumexp(row r) - row r[target[r]]  (float32, natural log), 0 where target[r] == ignore_index
// all in float32 from the stored values. When write_grad, the row is then overwritten in place with
// d loss[r] / d logits = softmax(row) - onehot(target[r]), rounded once to T; rows whose target is
// ignore_index become zeros. targets: (rows) int64 device memory. A target outside [0, vocab) that is not
// ignore_index gives loss NaN for that row (and, with write_grad, a gradient of softmax alone).
//   logits:  (rows, vocab) dtype, dense; read, and written only when write_grad
//   loss:    (rows) float32 (may not alias logits or targets)
// One block per row, two reads and one write of the logits (one read without
// write_grad); the same bits every run (fixed-order block reductions).
// A labelled row with a non-finite logit gets a non-finite loss (a +inf logit: NaN, not inf).
// 0 < vocab < 2^30; rows of any count (grid-strided beyond 2^31 - 1).
[[nodiscard]] std::string SoftmaxCrossEntropyRows(void* logits, const int64_t* targets, float* loss, int64_t rows,
                                                  int64_t vocab, int64_t ignore_index, bool write_grad,
                                                  DType dtype, void* stream);

// ---- Scaled, casting copies of small 2-D tensors, many per launch ----------
// For each copy: dst[r, c] = D(S(float(src[r, c]) * scale)) over rows x cols,
// element (r, c) at base + r * row_stride + c * col_stride (in elements, any
// strides: transposes and blocks of wider matrices). The product is float32,
// rounded to the source's dtype S, then cast to the destination's D (exact
// unless D is narrower): LibTorch's mul_out(dst, src, scalar) for these
// dtypes, bit for bit. Copies may not overlap one another's
// destinations, nor a destination its source. Every copy of one call has the
// same source and destination dtypes; at most kMaxScaledCopies a call (they
// travel in the kernel's parameters); empty copies are skipped. With
// `accumulate` the copy is added instead: dst[r, c] = D(float(dst[r, c]) +
// float(D(S(float(src[r, c]) * scale)))), what adding the cast copy into dst
// gives (LibTorch's dst.add_(copy), bit for bit).
// What it is for: LoRA's float32 parameters into their model-dtype copies, and
// model-dtype gradients into (or onto) float32 ones, dozens a layer, in one
// launch instead of one each.
struct ScaledCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t src_row_stride = 0, src_col_stride = 0;
  int64_t dst_row_stride = 0, dst_col_stride = 0;
  float scale = 1.f;
  bool accumulate = false;
};
constexpr int kMaxScaledCopies = 48;
[[nodiscard]] std::string ScaledCopies(const ScaledCopy* copies, int count, DType src_dtype, DType dst_dtype,
                                       void* stream);

// ---- LoRA dropout ----------------------------------------------------------
// The generator state a dropout launch reads: seed and offset as values, or,
// for a launch recorded in a CUDA graph, read from device memory each time the
// graph runs (LibTorch's graph-safe generator state: *seed_ptr, and
// *offset_ptr + offset_intragraph).
struct PhiloxState {
  uint64_t seed = 0, offset = 0;
  const int64_t* seed_ptr = nullptr;    // non-null: the seed is *seed_ptr
  const int64_t* offset_ptr = nullptr;  // non-null: the offset is *offset_ptr + offset_intragraph
  uint64_t offset_intragraph = 0;
};
// Dropout mask number offset + mask_index (philox.h) applied to x:
//   y = T(float(x) * scale) where element e = r * cols + c is kept, 0 where it is dropped;
//   with accumulate, y = T(float(y) + float(T(float(x) * scale))) where kept, y unchanged where dropped
// (LibTorch's x * mask * scale, and y.add_() of it, bit for bit, mask being 0/1 in the dtype).
//   x: (rows, cols) dtype, rows x_stride >= cols elements apart
//   y: (rows, cols) dtype, rows y_stride >= cols apart; may be x itself (same stride), else may not overlap it
// drop_below: DropoutThreshold(p) (philox.h); scale: 1 / (1 - p) for dropout, 1 for the 0/1 mask itself.
[[nodiscard]] std::string DropoutRows(const void* x, int64_t x_stride, void* y, int64_t y_stride, int64_t rows,
                                      int64_t cols, const PhiloxState& philox, uint64_t mask_index,
                                      uint32_t drop_below, float scale, bool accumulate, DType dtype, void* stream);

// The backward of a LoRA module's dropout_i(x) A^T through mask number
// offset + mask_index, both terms in one pass (one Philox call per 8 elements):
//   dropped = DropoutRows(x)                    (what the A gradient u^T dropout(x) multiplies)
//   acc    += DropoutRows(T(u a)), accumulating  (the input gradient's term dropout(u A))
// T(u a)[r][c] = T(sum over k in order of float(u[r][k]) * float(a[k][c]), float32 FMAs): the thin
// product rounded to the dtype as a GEMM writes it (its sum order may differ in the last float32 bit).
//   x, dropped, acc: (rows, cols) dtype, rows *_stride apart; dropped overlaps nothing else; acc may not be x
//   u: (rows, rank), rows u_stride apart, unit column stride; a: (rank, cols), rows a_stride apart;
//   u and a are only read and may share a buffer with acc outside acc's elements (u beside the input
//   gradient in the columns of one GEMM's product, as the widened groups lay them out)
// Only for layouts LoraDropoutBackwardFits accepts (else an error, nothing written).
[[nodiscard]] std::string LoraDropoutBackward(const void* x, int64_t x_stride, void* dropped, int64_t dropped_stride,
                                              const void* u, int64_t u_stride, const void* a, int64_t a_stride,
                                              int64_t rank, void* acc, int64_t acc_stride, int64_t rows, int64_t cols,
                                              const PhiloxState& philox, uint64_t mask_index, uint32_t drop_below,
                                              float scale, DType dtype, void* stream);

// Whether LoraDropoutBackward takes this layout: non-null pointers, cols and
// the row strides of x, dropped, a and acc multiples of 8 elements (and at
// least cols), x, dropped, a and acc 16-byte aligned, 0 < rank <= 256 and
// u_stride >= rank.
bool LoraDropoutBackwardFits(const void* x, int64_t x_stride, const void* dropped, int64_t dropped_stride,
                             const void* u, int64_t u_stride, const void* a, int64_t a_stride, int64_t rank,
                             const void* acc, int64_t acc_stride, int64_t cols);

}  // namespace trainerd::kernels
