#!/usr/bin/env python3
"""The matmuls of one LoRA decoder layer (the seven projections, forward and input/LoRA gradients,
frozen weights), timed in several arrangements, to choose how engine/linear.cc orders and groups
its GEMMs. Plain torch ops mirror the C++ (no autograd), bf16, on the GPU.

    python3 bench/speed/linear_variants.py [--tokens 8192] [--hidden 4096] [--kv 1024]
        [--inter 14336] [--rank 16] [--reps 20]

Arrangements (each a full layer, forward + backward):
  separate     one GEMM per projection, the LoRA term added after it (addmm_ into y: reads and
               writes y again); the input gradient built base GEMM first, LoRA term last.
  lora_first   the same products, the cheap rank-r product written first and the frozen GEMM
               accumulated onto it (beta 1: its epilogue reads what the cheap one wrote), so no
               pass re-reads a full output; same for the input gradient.
  stacked      q|k|v and gate|up as one frozen GEMM each (weights stacked by rows), their LoRA
               B's as one block-diagonal product; LoRA-first order.
  extended     stacked, and the LoRA term inside the frozen GEMM: y = [x | xA^T] [W | sB]^T, the
               input widened by the group's ranks (padded to --pad columns) and the weight by its
               scaled B's, block-diagonal; the input gradient's GEMM g [W | sB] gives the LoRA
               term's u = s g B beside it. Costs a copy of x into the widened input.
Prints ms per layer for each and the big GEMMs' TFLOP/s, against an 8192^3 product's."""
import argparse

import torch


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pad", type=int, nargs="*", default=[8, 64], help="widths the extension is padded to")
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    N, d, kv, f, r = args.tokens, args.hidden, args.kv, args.inter, args.rank
    s = 2.0
    torch.manual_seed(0)

    def w(o, i):
        return torch.randn(o, i, device=dev, dtype=dt) * 0.02

    groups = [  # (input width, [output widths]) of q|k|v, o, gate|up, down
        (d, [d, kv, kv]), (d, [d]), (d, [f, f]), (f, [d])]
    W = [[w(o, i) for o in outs] for i, outs in groups]
    A = [[w(r, i) for _ in outs] for i, outs in groups]
    B = [[w(o, r) for o in outs] for i, outs in groups]
    X = [torch.randn(N, i, device=dev, dtype=dt) for i, _ in groups]
    G = [[torch.randn(N, o, device=dev, dtype=dt) * 0.01 for o in outs] for _, outs in groups]
    Wst = [torch.cat(ws, 0) for ws in W]
    Acat = [torch.cat(a, 0) for a in A]
    Bblock = [torch.block_diag(*b) for b in B]  # (sum out, sum r)
    Gst = [torch.cat(g, 1) for g in G]

    def separate(lora_first, stacked):
        for gi, (i, outs) in enumerate(groups):
            x = X[gi]
            t = x @ Acat[gi].t()  # (N, sum r)
            # forward
            if stacked and len(outs) > 1:
                if lora_first:
                    y = torch.mm(t, Bblock[gi].t() * s)
                    y.addmm_(x, Wst[gi].t())
                else:
                    y = torch.mm(x, Wst[gi].t())
                    y.addmm_(t, Bblock[gi].t(), alpha=s)
            else:
                for j, o in enumerate(outs):
                    tj = t[:, j * r:(j + 1) * r]
                    if lora_first:
                        y = torch.mm(tj, B[gi][j].t() * s)
                        y.addmm_(x, W[gi][j].t())
                    else:
                        y = torch.mm(x, W[gi][j].t())
                        y.addmm_(tj, B[gi][j].t(), alpha=s)
            # backward: dB, u, dA, grad_x
            if stacked and len(outs) > 1:
                g = Gst[gi]
                _dB = torch.mm(g.t(), t).mul_(s)  # (sum out, sum r): the diagonal blocks are the dB's
                u = torch.mm(g, Bblock[gi]).mul_(s)
            else:
                us = []
                for j, o in enumerate(outs):
                    g = G[gi][j]
                    tj = t[:, j * r:(j + 1) * r]
                    _dB = torch.mm(g.t(), tj).mul_(s)
                    us.append(torch.mm(g, B[gi][j]).mul_(s))
                u = us[0] if len(us) == 1 else torch.cat(us, 1)
            _dA = torch.mm(u.t(), x)
            if lora_first:
                gx = torch.mm(u, Acat[gi])
                if stacked and len(outs) > 1:
                    gx.addmm_(Gst[gi], Wst[gi])
                else:
                    for j in range(len(outs)):
                        gx.addmm_(G[gi][j], W[gi][j])
            else:
                gx = None
                if stacked and len(outs) > 1:
                    gx = torch.mm(Gst[gi], Wst[gi])
                else:
                    for j in range(len(outs)):
                        gx = torch.mm(G[gi][j], W[gi][j]) if gx is None else gx.addmm_(G[gi][j], W[gi][j])
                gx.addmm_(u, Acat[gi])

    def frozen_only():
        for gi, (i, outs) in enumerate(groups):
            for j in range(len(outs)):
                torch.mm(X[gi], W[gi][j].t())
                torch.mm(G[gi][j], W[gi][j])

    def extended_setup(pad):
        """Per group: the widened input buffer and the widened weight [W | sB] (block-diagonal B)."""
        out = []
        for gi, (i, outs) in enumerate(groups):
            R = len(outs) * r
            Rp = (R + pad - 1) // pad * pad
            x_ext = torch.zeros(N, i + Rp, device=dev, dtype=dt)
            w_ext = torch.zeros(sum(outs), i + Rp, device=dev, dtype=dt)
            w_ext[:, :i] = Wst[gi]
            w_ext[:, i:i + R] = Bblock[gi] * s
            out.append((x_ext, w_ext, R))
        return out

    def extended(ext):
        for gi, (i, outs) in enumerate(groups):
            x_ext, w_ext, R = ext[gi]
            x = X[gi]
            x_ext[:, :i].copy_(x)
            torch.mm(x, Acat[gi].t(), out=x_ext[:, i:i + R])
            y = torch.mm(x_ext, w_ext.t())
            g = Gst[gi] if len(outs) > 1 else G[gi][0]
            gx_ext = torch.mm(g, w_ext)  # (N, i + Rp): [g W | u]
            u = gx_ext[:, i:i + R]
            _dB = torch.mm(g.t(), x_ext[:, i:i + R]).mul_(s)
            _dA = torch.mm(u.t(), x)
            gx = gx_ext[:, :i]
            gx.addmm_(u, Acat[gi])
        return y

    m = torch.randn(8192, 8192, device=dev, dtype=dt)
    ceil_ms = timed(lambda: m @ m, args.reps)
    ceiling = 2 * 8192 ** 3 / ceil_ms / 1e9
    print(f"ceiling 8192^3: {ceiling:.1f} TFLOP/s")
    flops = sum(2 * N * i * o * 2 for i, outs in groups for o in outs)
    t = timed(frozen_only, args.reps)
    print(f"frozen GEMMs only (fwd + input grad): {t:.3f} ms/layer, {flops / t / 1e9:.1f} TFLOP/s")
    for name, lf, st in [("separate", False, False), ("lora_first", True, False), ("stacked", True, True),
                         ("stacked_base_first", False, True)]:
        t = timed(lambda: separate(lf, st), args.reps)
        print(f"{name:20s} {t:.3f} ms/layer  ({t * 32:.1f} ms for 32 layers)")
    for pad in args.pad:
        ext = extended_setup(pad)
        # The down projection's output both ways (correctness of the widened product).
        y_ext = extended(ext)
        y_ref = torch.mm(X[3], W[3][0].t()).addmm_(X[3] @ A[3][0].t(), B[3][0].t(), alpha=s)
        err = ((y_ext.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
        t = timed(lambda: extended(ext), args.reps)
        print(f"{'extended pad ' + str(pad):20s} {t:.3f} ms/layer  ({t * 32:.1f} ms for 32 layers; rel err {err:.1e})")
        for gi, (i, outs) in enumerate(groups):
            x_ext, w_ext, R = ext[gi]
            tf = timed(lambda: torch.mm(x_ext, w_ext.t()), args.reps)
            g = Gst[gi] if len(outs) > 1 else G[gi][0]
            tb = timed(lambda: torch.mm(g, w_ext), args.reps)
            tc = timed(lambda: x_ext[:, :i].copy_(X[gi]), args.reps)
            fl = 2 * N * i * sum(outs)
            print(f"  widened ({N}x{x_ext.size(1)}) x ({x_ext.size(1)}x{sum(outs)}): fwd {tf:.3f} ms "
                  f"{fl / tf / 1e9:.0f} TFLOP/s of the frozen part; input grad {tb:.3f} ms; copy of x {tc:.3f} ms")
        del ext
    for gi, (i, outs) in enumerate(groups):
        for j, o in enumerate(outs):
            tf = timed(lambda: torch.mm(X[gi], W[gi][j].t()), args.reps)
            tb = timed(lambda: torch.mm(G[gi][j], W[gi][j]), args.reps)
            fl = 2 * N * i * o
            print(f"  GEMM ({N}x{i}) x ({i}x{o}): fwd {tf:.3f} ms {fl / tf / 1e9:.0f} TFLOP/s; "
                  f"input grad {tb:.3f} ms {fl / tb / 1e9:.0f} TFLOP/s")
        if len(outs) > 1:
            o = sum(outs)
            tf = timed(lambda: torch.mm(X[gi], Wst[gi].t()), args.reps)
            tb = timed(lambda: torch.mm(Gst[gi], Wst[gi]), args.reps)
            fl = 2 * N * i * o
            print(f"  stacked ({N}x{i}) x ({i}x{o}): fwd {tf:.3f} ms {fl / tf / 1e9:.0f} TFLOP/s; "
                  f"input grad {tb:.3f} ms {fl / tb / 1e9:.0f} TFLOP/s")
    # The LoRA pieces alone, for the largest group (gate|up).
    x, g, b, tj = X[2], G[2][0], B[2][0], X[2] @ A[2][0].t()
    y = torch.mm(x, W[2][0].t())
    print("gate-sized LoRA pieces (ms):",
          "addmm_ after %.3f;" % timed(lambda: y.addmm_(tj, b.t(), alpha=s), args.reps),
          "mm first %.3f;" % timed(lambda: torch.mm(tj, b.t()), args.reps),
          "dB %.3f;" % timed(lambda: torch.mm(g.t(), tj), args.reps),
          "u %.3f;" % timed(lambda: torch.mm(g, b), args.reps),
          "cat of q|k|v grads %.3f" % timed(lambda: torch.cat(G[0], 1), args.reps))


if __name__ == "__main__":
    main()
