#!/usr/bin/env python3
"""Helpers of bench/speed/run.sh (run on the GPU machine; see bench/speed/README.md).

  speed_util.py versions --out F [--commit C]      GPU, driver, torch/transformers/peft, trainerd commit -> JSON
  speed_util.py ceiling --out F                    bf16 8192^3 matmul (median of 30) and a device copy -> JSON
  speed_util.py tokens --micro-batch N --seq S --out F [--seed K]   N rows of S random ids (< 128000), JSONL
  speed_util.py result {trainerd,hf,hf-compile} --out F ...        one (row, system) result -> JSON
  speed_util.py ok F                               exit 0 if F is a result with status "ok"
  speed_util.py stale --results DIR --row R ...    remove R's results measured with other settings than these
  speed_util.py bundle --results DIR --out F       every JSON of DIR in one file (what comes back from $OUT)

MFU is always computed here, against the one ceiling measured in the run, with the reference's own
lora_flops_per_token (imported from hf_peft_baseline.py beside this file, never copied); what each
system says of itself is kept as mfu_self (the reference's own; the mean of trainerd's "mfu" key
over the timed steps, where metrics.jsonl has it).
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cmd_versions(a):
    v = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "trainerd_commit": a.commit or "unknown"}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,memory.used",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        first = q.stdout.strip().splitlines()[0] if q.stdout.strip() else ""
        parts = [p.strip() for p in first.split(",")]
        keys = ["gpu", "driver", "gpu_memory", "power_limit", "gpu_memory_used_at_start"]
        v.update({k: p for k, p in zip(keys, parts)})
        if q.returncode != 0 or not first:
            v["nvidia_smi_error"] = (q.stderr or q.stdout).strip()[-300:]
    except (OSError, subprocess.SubprocessError) as e:
        v["nvidia_smi_error"] = str(e)
    for mod in ("torch", "transformers", "peft"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 -- record whatever broke the import
            v[mod] = "unavailable (%s)" % type(e).__name__
    try:
        import torch
        v["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            v["gpu_torch"] = p.name
            v["sm_count"] = p.multi_processor_count
    except Exception:  # noqa: BLE001
        pass
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
        v["nvcc"] = next((l.split("release", 1)[1].strip() for l in out.splitlines() if "release" in l), "unknown")
    except (OSError, subprocess.SubprocessError):
        v["nvcc"] = "not found"
    write_json(a.out, v)
    print(json.dumps(v))


def cmd_ceiling(a):
    import torch
    n = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)  # random data: zeros run faster
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    z = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        torch.matmul(x, y, out=z)
    torch.cuda.synchronize()
    reps = 30
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        torch.matmul(x, y, out=z)
        e.record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ev]
    if not torch.isfinite(z.float().abs().max()):
        sys.exit("matmul produced non-finite values")
    med = statistics.median(ms)
    tflops = 2 * n ** 3 / (med / 1e3) / 1e12
    del x, y, z
    # A device-to-device copy of 2 GiB, counting bytes read plus bytes written.
    src = torch.randint(0, 255, (2 << 30,), device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    cev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
    for s, e in cev:
        s.record()
        dst.copy_(src)
        e.record()
    torch.cuda.synchronize()
    cms = statistics.median(s.elapsed_time(e) for s, e in cev)
    copy_tbs = 2 * src.numel() / (cms / 1e3) / 1e12
    out = dict(matmul_tflops=round(tflops, 1), matmul_ms_median=round(med, 4), matmul_ms_min=round(min(ms), 4),
               matmul_ms_max=round(max(ms), 4), matmul_reps=reps, matmul_shape="8192x8192x8192 bf16 random",
               copy_tb_s=round(copy_tbs, 3), copy_bytes=2 * src.numel(), gpu=torch.cuda.get_device_name(0),
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_json(a.out, out)
    print(json.dumps(out))


def cmd_tokens(a):
    import random
    rng = random.Random(a.seed)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        for _ in range(a.micro_batch):
            f.write(json.dumps({"input_ids": [rng.randrange(128000) for _ in range(a.seq)]}) + "\n")
    os.replace(tmp, a.out)


def cmd_save_model(a):
    """Random weights of a SHAPES entry with config.json keys overridden (the custom row), written the
    way the reference's --save-model writes its shapes (same config defaults, seed and dtype)."""
    import torch
    sys.path.insert(0, HERE)
    from hf_peft_baseline import SHAPES
    from transformers import LlamaConfig, LlamaForCausalLM
    overrides = json.loads(a.config)
    if not isinstance(overrides, dict):
        raise SystemExit("--config: expected a JSON object of config.json keys, got %r" % a.config)
    keys = dict(max_position_embeddings=8192, rope_theta=500000.0, **SHAPES[a.shape])
    keys.update(overrides)
    torch.manual_seed(0)
    cfg = LlamaConfig(**keys)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True)
    print(json.dumps({"saved": a.out, "config": keys}))


def model_cfg(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return SimpleNamespace(**json.load(f))


def flops_per_token(model_dir, seq):
    sys.path.insert(0, HERE)
    from hf_peft_baseline import lora_flops_per_token  # the reference's formula, not a copy of it
    return lora_flops_per_token(model_cfg(model_dir), seq)


def log_tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip("\n") for l in f if l.strip()]
    except OSError:
        return []
    return [l[-400:] for l in lines[-n:]]


def classify_failure(rc, tail):
    text = "\n".join(tail)
    if rc == 124:
        return "timeout"
    if rc == 137:
        return "killed"  # RUN_TIMEOUT_S's second signal, or the host's memory
    if "out of memory" in text.lower() or "OutOfMemoryError" in text:
        return "oom"
    return "failed"


def error_line(tail):
    keys = ("error", "Error", "ERROR", "out of memory", "Traceback", "failed", "unknown key")
    for l in reversed(tail):
        if any(k in l for k in keys):
            return l.strip()
    return tail[-1].strip() if tail else "no output"


def parse_trainerd(metrics, warmup, steps):
    lines = []
    with open(metrics) as f:
        for l in f:
            if l.strip():
                j = json.loads(l)
                if "loss" in j:
                    lines.append(j)
    by_step = {j["step"]: j for j in lines}
    last = warmup + steps
    if 1 not in by_step or warmup not in by_step or last not in by_step:
        raise ValueError("metrics.jsonl has steps %s; need 1, %d and %d (log_every must be 1)"
                         % (sorted(by_step)[:3] + ["..."] + sorted(by_step)[-2:], warmup, last))
    w, e = by_step[warmup], by_step[last]
    # Each step's time is the one its progress event reports (tokens / tokens_per_s): on CUDA the
    # device time between the ends of consecutive steps (CUDA events). Wall-clock differences of
    # elapsed_s would be skewed: the host learns of a step's end only when the next one is queued.
    timed = [by_step[s] for s in range(warmup + 1, last + 1) if s in by_step]
    if len(timed) != steps:
        raise ValueError("metrics.jsonl lacks some of steps %d..%d (log_every must be 1)" % (warmup + 1, last))
    tokens = e["tokens"] - w["tokens"]
    dt = 0.0
    for prev, j in zip([w] + timed[:-1], timed):
        if not j.get("tokens_per_s"):
            raise ValueError("step %d has no tokens_per_s" % j["step"])
        dt += (j["tokens"] - prev["tokens"]) / j["tokens_per_s"]
    if dt <= 0 or tokens <= 0:
        raise ValueError("no time or tokens between steps %d and %d" % (warmup, last))
    own_mfu = [j["mfu"] for j in timed if isinstance(j.get("mfu"), (int, float))]
    return dict(first_loss=by_step[1]["loss"], step_s=dt / steps, tokens_per_s=tokens / dt,
                mfu_self=sum(own_mfu) / len(own_mfu) if own_mfu else None,
                tokens_per_step=tokens / steps, timed_tokens=tokens, timed_s=dt,
                peak_mem_gib=max(j.get("peak_memory_bytes", 0) for j in lines) / 2 ** 30,
                last_loss=e["loss"], steps_logged=len(lines))


def parse_hf(log):
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    for l in reversed(lines):
        l = l.strip()
        if l.startswith("{") and '"tokens_per_s"' in l:
            return json.loads(l)
    raise ValueError("no result line in the reference's output")


def parse_power(path, busy_pct=90):
    """The card while it was busy: nvidia-smi's samples ("power W, SM MHz, utilisation %" a line, run.sh's
    sampler) at busy_pct% utilisation or more, i.e. the steps rather than loading, compiling or saving.
    -> {power_w, sm_mhz, power_samples} (medians), or {} when there are fewer than 3 such samples or no file."""
    busy = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                fields = [x.strip() for x in line.split(",")]
                if len(fields) != 3:
                    continue
                try:
                    watts, mhz, util = float(fields[0]), float(fields[1]), float(fields[2])
                except ValueError:  # "[N/A]", "[Not Supported]", a line cut short when the sampler was stopped
                    continue
                if util >= busy_pct:
                    busy.append((watts, mhz))
    except OSError:
        return {}
    if len(busy) < 3:
        return {}
    return dict(power_w=statistics.median(w for w, _ in busy), sm_mhz=statistics.median(m for _, m in busy),
                power_samples=len(busy))


# What a row's systems must share for their figures to be compared (report.py pairs a row's results
# only when these agree); the defaults stand for results written before a key was recorded.
SETTINGS = (("shape", None), ("micro_batch", None), ("seq", None), ("grad_ckpt", False), ("lora_r", 16),
            ("lora_alpha", 32), ("lora_dropout", 0.0))


def settings_of(r):
    """-> the comparable settings of a result (or of a row being run), as a dict."""
    return {k: (bool(r.get(k, d)) if k == "grad_ckpt" else r.get(k, d)) for k, d in SETTINGS}


def settings_text(s):
    return "%s, %s×%s%s, LoRA r %s alpha %s dropout %s" % (s["shape"], s["micro_batch"], s["seq"],
                                                            ", checkpointing" if s["grad_ckpt"] else "",
                                                            s["lora_r"], s["lora_alpha"], s["lora_dropout"])


def settings_args(a):
    return dict(shape=a.shape, micro_batch=a.micro_batch, seq=a.seq, grad_ckpt=bool(a.grad_ckpt), lora_r=a.lora_r,
                lora_alpha=a.lora_alpha, lora_dropout=a.lora_dropout)


def cmd_result(a):
    r = dict(row=a.row, system=a.system, **settings_args(a), warmup=a.warmup, steps=a.steps, rc=a.rc, wall_s=a.wall_s,
             log=a.log, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if a.settings:
        r["settings"] = a.settings
    v = read_json(a.versions) if a.versions else None
    if v:
        r["gpu"] = v.get("gpu", "unknown")
        r["trainerd_commit"] = v.get("trainerd_commit", "unknown")
    tail = log_tail(a.log)
    try:
        if a.system == "trainerd":
            if not os.path.exists(a.metrics or ""):
                raise ValueError("no metrics.jsonl written")
            r.update(parse_trainerd(a.metrics, a.warmup, a.steps))
        else:
            ref = parse_hf(a.log)
            r.update(first_loss=ref["first_loss"], step_s=ref["step_s"], tokens_per_s=ref["tokens_per_s"],
                     peak_mem_gib=ref["peak_mem_gib"], mfu_self=ref.get("mfu"),
                     matmul_tflops_self=ref.get("matmul_tflops"), torch=ref.get("torch"))
        r["status"] = "ok"
        if a.rc != 0:
            r["status"] = classify_failure(a.rc, tail)
            r["error"] = "exit status %d after the timed steps: %s" % (a.rc, error_line(tail))
    except (OSError, ValueError, KeyError) as e:
        r["status"] = classify_failure(a.rc, tail) if a.rc != 0 else "failed"
        r["error"] = "%s (exit status %d): %s" % (e, a.rc, error_line(tail))
    if r["status"] != "ok":
        r["log_tail"] = tail
    if a.power:
        r.update(parse_power(a.power))
    if "tokens_per_s" in r:
        try:
            fpt = flops_per_token(a.model_dir, a.seq)
            r["flops_per_token"] = fpt
            c = read_json(a.ceiling) if a.ceiling else None
            if c and c.get("matmul_tflops"):
                r["ceiling_tflops"] = c["matmul_tflops"]
                r["mfu"] = r["tokens_per_s"] * fpt / 1e12 / c["matmul_tflops"]
        except Exception as e:  # noqa: BLE001 -- a figure without MFU is still worth keeping
            r["mfu_error"] = str(e)
    write_json(a.out, r)
    brief = {k: (round(r[k], 4) if isinstance(r.get(k), float) else r.get(k))
             for k in ("row", "system", "status", "tokens_per_s", "step_s", "peak_mem_gib", "mfu", "first_loss", "error")
             if k in r}
    print(json.dumps(brief))
    return 0 if r["status"] == "ok" else 1


def cmd_ok(a):
    r = read_json(a.file)
    return 0 if r and r.get("status") == "ok" else 1


def cmd_stale(a):
    """Removes the results of row a.row (every system) measured with other settings than a's: a row run
    again with another shape, batch, rank or dropout must not be compared with what stays of the old one."""
    want = settings_of(settings_args(a))
    for path in sorted(glob.glob(os.path.join(a.results, glob.escape(a.row) + ".*.json"))):
        r = read_json(path)
        if r is None or r.get("row") != a.row:
            continue
        have = settings_of(r)
        if have != want:
            os.remove(path)
            print("removed %s: measured with %s, the row now runs %s" % (os.path.basename(path), settings_text(have),
                                                                         settings_text(want)))
    return 0


def cmd_bundle(a):
    b = {"results": {}}
    for path in sorted(glob.glob(os.path.join(a.results, "*.json"))):
        name = os.path.basename(path)[:-5]
        j = read_json(path)
        if j is None:
            continue
        if name in ("versions", "ceiling"):
            b[name] = j
        else:
            b["results"][name] = j
    write_json(a.out, b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("versions")
    p.add_argument("--out", required=True)
    p.add_argument("--commit")
    p = sub.add_parser("ceiling")
    p.add_argument("--out", required=True)
    p = sub.add_parser("tokens")
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    def row_settings(p):
        p.add_argument("--row", required=True)
        p.add_argument("--shape", required=True)
        p.add_argument("--micro-batch", type=int, required=True)
        p.add_argument("--seq", type=int, required=True)
        p.add_argument("--grad-ckpt", type=int, default=0)
        p.add_argument("--lora-r", type=int, default=16)
        p.add_argument("--lora-alpha", type=int, default=32)
        p.add_argument("--lora-dropout", type=float, default=0.0)
    p = sub.add_parser("result")
    p.add_argument("system", choices=["trainerd", "hf", "hf-compile"])
    row_settings(p)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--metrics", help="trainerd's metrics.jsonl")
    p.add_argument("--settings", help="the system's own choices on this row (micro-batches, memory savers)")
    p.add_argument("--log", required=True)
    p.add_argument("--power", help="nvidia-smi's samples while it ran (run.sh's run_timed)")
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--wall-s", type=float, default=None)
    p.add_argument("--ceiling")
    p.add_argument("--versions")
    p.add_argument("--out", required=True)
    p = sub.add_parser("save-model")
    p.add_argument("--shape", required=True)
    p.add_argument("--config", required=True, help="JSON object of config.json keys over the shape")
    p.add_argument("--out", required=True)
    p = sub.add_parser("ok")
    p.add_argument("file")
    p = sub.add_parser("stale")
    p.add_argument("--results", required=True)
    row_settings(p)
    p = sub.add_parser("bundle")
    p.add_argument("--results", required=True)
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    return {"versions": cmd_versions, "ceiling": cmd_ceiling, "tokens": cmd_tokens, "result": cmd_result,
            "save-model": cmd_save_model,
            "ok": cmd_ok, "stale": cmd_stale, "bundle": cmd_bundle}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
