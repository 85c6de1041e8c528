#!/usr/bin/env python3
"""Causal attention at the 8b row's shape: milliseconds, joules, power and SM clock a call, for cuDNN's
kernels (what trainerd runs on unpacked batches, engine/cudnn_attention.h) and the flash kernels LibTorch
bundles, forward and forward + backward, beside a bf16 GEMM of the same card as the yardstick.

The question it answers (bench/speed/NOTES.md, "The GEMMs at the power cap"): the 8b step runs at the card's
power limit, where time is energy over the limit; the frozen GEMMs there spend the least energy a FLOP the
card allows, so attention is worth a kernel of our own only if it spends more joules a FLOP than they do.

Each case runs back to back for some seconds after a warm-up (as a training step runs it), reading NVML's
energy counter before and after and sampling power and SM clock; cases alternate over rounds so that drift
shows. On the GPU machine, from the repository root:

  python3 bench/attention/attention_energy.py                 # the 8b shape: 4 x 2048, 32 heads, 8 kv, d 128
  python3 bench/attention/attention_energy.py --batch 8 --heads 32 --kv-heads 8 --head-dim 64   # the 1b shape

FLOPs by the bench's formula (bench/speed/NOTES.md): a causal forward 2 * b * h * s^2 * d (QK^T and PV over
half the square), the backward 2.5 times that (S again, dV, dP, dQ, dK). The GEMM's: 2 * n^3.
"""
import argparse
import ctypes
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Nvml:
    """The driver's NVML through ctypes (no Python package needed): energy, power and SM clock of one GPU."""

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
            raise RuntimeError("no NVML device %d" % index)

    def joules(self):
        mj = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(mj)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed (a GPU before Volta?)")
        return mj.value / 1000.0

    def watts(self):
        mw = ctypes.c_uint()
        self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw))
        return mw.value / 1000.0

    def sm_mhz(self):
        mhz = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz))  # NVML_CLOCK_SM
        return mhz.value


def measure(nvml, call, seconds, warmup=20, batch=10):
    """-> (ms a call, J a call, mean W, mean SM MHz, calls), the calls back to back for `seconds`."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    j0, t0 = nvml.joules(), time.perf_counter()
    calls, watts, mhz, samples, elapsed = 0, 0.0, 0.0, 0, 0.0
    while elapsed < seconds:
        for _ in range(batch):
            call()
        calls += batch
        torch.cuda.synchronize()
        watts += nvml.watts()
        mhz += nvml.sm_mhz()
        samples += 1
        elapsed = time.perf_counter() - t0
    joules = nvml.joules() - j0
    return 1e3 * elapsed / calls, joules / calls, watts / samples, mhz / samples, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=3.0, help="each case's measured time a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nvml-index", type=int, default=0, help="NVML's index of the GPU torch uses (device 0)")
    a = ap.parse_args()

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    b, s, h, kv, d = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    # (B, T, heads, d) projections viewed as (B, heads, T, d), as the engine hands them over.
    q = torch.randn(b, s, h, d, device=dev, dtype=dt).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, kv, d, device=dev, dtype=dt).transpose(1, 2).requires_grad_()
    v = torch.randn(b, s, kv, d, device=dev, dtype=dt).transpose(1, 2).requires_grad_()
    dout = torch.randn(b, h, s, d, device=dev, dtype=dt)
    n = 8192
    x = torch.randn(n, n, device=dev, dtype=dt)
    w = torch.randn(n, n, device=dev, dtype=dt)

    def attention(backend, backward):
        def call():
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(h != kv))
            if backward:
                q.grad = k.grad = v.grad = None
                out.backward(dout)
        return call

    forward_flops = 2.0 * b * h * s * s * d
    cases = [("gemm 8192^3", lambda: torch.mm(x, w), 2.0 * n ** 3)]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            attention(backend, True)()
            torch.cuda.synchronize()
        except RuntimeError as e:  # a backend this LibTorch or card lacks, or that refuses the layout
            print("%s: not available here (%s)" % (name, str(e).splitlines()[0][:160]))
            continue
        cases.append(("%s forward" % name, attention(backend, False), forward_flops))
        cases.append(("%s forward+backward" % name, attention(backend, True), 3.5 * forward_flops))

    nvml = Nvml(a.nvml_index)
    print("%s; torch %s; b %d, s %d, heads %d, kv heads %d, d %d, causal; %.1f s a case, %d rounds" % (
        torch.cuda.get_device_name(), torch.__version__, b, s, h, kv, d, a.seconds, a.rounds))
    for r in range(a.rounds):
        for name, call, flops in cases:
            ms, joules, watts, mhz, calls = measure(nvml, call, a.seconds)
            print("round %d  %-26s %8.3f ms %8.4f J %5.0f W %5.0f MHz %6.0f TFLOP/s %6.3f J/PFLOP (%d calls)" % (
                r, name, ms, joules, watts, mhz, flops / ms / 1e9, joules / flops * 1e15, calls))


if __name__ == "__main__":
    main()
