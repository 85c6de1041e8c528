#!/usr/bin/env python3
"""Where a step's GPU time goes, from a Chrome trace that `trainerd-worker run --profile` (or
torch.profiler's export_chrome_trace) wrote.

    python3 bench/speed/trace_summary.py TRACE.json [--top 30] [--steps N]

Prints the span of GPU activity, the time kernels ran (and so the time the GPU sat idle), the
time by kind of kernel (matmul, attention, trainerd's fused kernels, the rest), and the kernels
that took the most time, in total and per step (--steps: how many steps the trace holds).
--ops N also prints the N operators (name and input shapes, as the profiler recorded them) whose
kernels took the most GPU time: which matmul shapes cost what. --gaps N prints the N longest
stretches in which the GPU sat idle, with the kernels on either side: where the idle time is."""
import argparse
import collections
import json
import re
import sys

KINDS = [  # first match wins; names as CUDA reports them
    ("attention", re.compile(r"flash|fmha|attention|cudnn", re.I)),  # before matmul: names hold "cutlass"
    ("matmul", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|s16816|s1688", re.I)),
    ("trainerd fused", re.compile(r"trainerd|RmsNorm|SwiGlu|Rope", re.I)),
    ("reduction", re.compile(r"reduce|norm|softmax|logsumexp|sum_", re.I)),
    ("optimizer", re.compile(r"adam|foreach|multi_tensor", re.I)),
    ("copy/cast", re.compile(r"copy|cast|convert|cat_|index|gather|scatter|fill", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def short(name, width=110):
    return name if len(name) <= width else name[: width - 1] + "…"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--steps", type=int, default=1, help="steps in the trace (per-step figures divide by it)")
    ap.add_argument("--ops", type=int, default=0, help="also the operators (with input shapes) taking the most GPU time")
    ap.add_argument("--gaps", type=int, default=0, help="also the longest idle stretches and the kernels around them")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        sys.exit("no GPU events in %s (a CPU run, or the profiler saw no CUDA activity)" % args.trace)
    start = min(e["ts"] for e in gpu)
    end = max(e["ts"] + e.get("dur", 0) for e in gpu)
    span_ms = (end - start) / 1000
    busy = collections.Counter()
    count = collections.Counter()
    by_kind = collections.Counter()
    for e in gpu:
        name = e.get("name", "?")
        dur = e.get("dur", 0) / 1000
        busy[name] += dur
        count[name] += 1
        by_kind[kind_of(name) if e["cat"] == "kernel" else e["cat"]] += dur
    total = sum(busy.values())
    # Idle time: the span minus the union of the GPU intervals (one stream in practice; the union
    # keeps overlapping streams honest).
    intervals = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in gpu)
    covered, cur_s, cur_e = 0.0, *intervals[0]
    for s, t in intervals[1:]:
        if s > cur_e:
            covered += cur_e - cur_s
            cur_s, cur_e = s, t
        else:
            cur_e = max(cur_e, t)
    covered = (covered + cur_e - cur_s) / 1000
    n = max(args.steps, 1)
    print(f"GPU span {span_ms:.1f} ms ({span_ms / n:.1f} ms a step over {n}); kernels and copies "
          f"{covered:.1f} ms busy, idle {span_ms - covered:.1f} ms ({100 * (1 - covered / span_ms):.1f}%); "
          f"{len(gpu)} GPU events ({len(gpu) / n:.0f} a step)")
    print("\nby kind (ms a step, share of busy time):")
    for kind, ms in by_kind.most_common():
        print(f"  {kind:16s} {ms / n:9.2f}  {100 * ms / total:5.1f}%")
    print(f"\ntop {args.top} (ms a step, calls a step, share):")
    for name, ms in busy.most_common(args.top):
        print(f"  {ms / n:8.2f} {count[name] / n:6.0f}  {100 * ms / total:5.1f}%  {short(name)}")
    if args.ops:
        print_ops(events, gpu, args.ops, n, total)
    if args.gaps:
        print_gaps(gpu, args.gaps)


def print_gaps(gpu, top):
    """The longest idle stretches: from the end of all GPU work so far to the next event's start."""
    ordered = sorted(gpu, key=lambda e: e["ts"])
    gaps, busy_until, last = [], ordered[0]["ts"], ordered[0]
    for e in ordered:
        if e["ts"] > busy_until:
            gaps.append((e["ts"] - busy_until, last.get("name", "?"), e.get("name", "?")))
        end = e["ts"] + e.get("dur", 0)
        if end >= busy_until:
            busy_until, last = end, e
    gaps.sort(reverse=True)
    print(f"\nlongest {top} idle stretches (µs; the kernel before -> the one after):")
    for us, before, after in gaps[:top]:
        print(f"  {us:9.1f}  {short(before, 70)} -> {short(after, 70)}")


def print_ops(events, gpu, top, n, total):
    """GPU time by the CPU operator that launched each kernel (the kernel's "External id" names
    the innermost operator), keyed by operator name and input shapes."""
    ops = {}
    for e in events:
        a = e.get("args", {})
        if e.get("cat") == "cpu_op" and "External id" in a:
            dims = a.get("Input Dims") or a.get("Input dims") or []
            ops[a["External id"]] = "%s %s" % (e.get("name", "?"), [d for d in dims if d])
    busy, count = collections.Counter(), collections.Counter()
    for e in gpu:
        key = ops.get(e.get("args", {}).get("External id"), "(no operator)")
        busy[key] += e.get("dur", 0) / 1000
        count[key] += 1
    print(f"\ntop {top} operators by GPU time (ms a step, kernels a step, share):")
    for key, ms in busy.most_common(top):
        print(f"  {ms / n:8.2f} {count[key] / n:6.0f}  {100 * ms / total:5.1f}%  {short(key, 160)}")


if __name__ == "__main__":
    main()
