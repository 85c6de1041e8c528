#!/usr/bin/env python3
"""The 8b LoRA step's GEMMs alone, each in the eight storage orders of its operands and result, and
cuDNN's causal attention on (B, T, heads, d) rows against (B, heads, T, d) tensors: what the layout
alone changes, before trying it in the step (bench/speed/NOTES.md, "The 8b row: what is left").

    python3 bench/speed/gemm_layouts.py [--reps 20]

For C (M, N) = A (M, K) B (K, N): A stored as is (An) or transposed (AT), B likewise, and C made
directly (Cn) or as (B^T A^T)^T (CT). trainerd's forward is "An BT Cn" (x W^T, W stored (out, in)),
its input gradient "An Bn Cn" (g W). Random bf16, median of --reps CUDA-event timings after 3
warm-ups. Isolated GEMMs on an H200 run cooler than a step of back-to-back ones at the 700 W limit:
a gain here is a candidate, not a result."""
import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from linear_variants import timed  # median ms of CUDA-event timings after 3 warm-ups

# (M, K, N) of the step's products at llama3-8b, 4×2048 tokens, LoRA r 16 (widened groups).
SHAPES = {"q|k|v forward": (8192, 4144, 6144), "q|k|v input grad": (8192, 6144, 4144),
          "o forward": (8192, 4112, 4096), "o input grad": (8192, 4096, 4096),
          "gate|up forward": (8192, 4128, 28672), "gate|up input grad": (8192, 28672, 4128),
          "down forward": (8192, 14352, 4096), "down input grad": (8192, 4112, 14336),
          "lm_head chunk": (2092, 4096, 128256)}


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    a, b = rand(8192, 8192), rand(8192, 8192)
    print("ceiling 8192^3: %.1f TFLOP/s" % (2 * 8192**3 / timed(lambda: torch.mm(a, b), 30) / 1e9))
    del a, b
    for name, (m, k, n) in SHAPES.items():
        rates = []
        for at, bt, ct in itertools.product([0, 1], repeat=3):
            lhs = rand(k, m).t() if at else rand(m, k)
            rhs = rand(n, k).t() if bt else rand(k, n)
            fn = (lambda: torch.mm(rhs.t(), lhs.t())) if ct else (lambda: torch.mm(lhs, rhs))
            rate = 2 * m * n * k / timed(fn, args.reps) / 1e9
            rates.append((rate, "A%s B%s C%s" % ("T" if at else "n", "T" if bt else "n", "T" if ct else "n")))
        rates.sort(reverse=True)
        print("%-18s M %5d K %5d N %6d: " % (name, m, k, n) + "  ".join("%s %.0f" % (o, r) for r, o in rates))

    batch, heads, kv_heads, seq, d = 4, 32, 8, 2048, 128
    flops = 4 * batch * heads * seq * seq * d / 2  # causal forward; the backward counted as 2.5x
    for layout in ("B, T, heads, d rows", "B, heads, T, d"):
        def make(h):
            t = rand(batch, seq, h, d).transpose(1, 2) if layout.startswith("B, T") else rand(batch, h, seq, d)
            return t.requires_grad_()
        q, k, v = make(heads), make(kv_heads), make(kv_heads)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            def forward():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            grad = torch.randn_like(forward())
            fwd = timed(forward, args.reps)
            both = timed(lambda: torch.autograd.grad(forward(), (q, k, v), grad), args.reps)
        print("cuDNN attention on (%s): forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)"
              % (layout, fwd, flops / fwd / 1e9, both - fwd, 2.5 * flops / (both - fwd) / 1e9))


if __name__ == "__main__":
    main()
