#!/usr/bin/env python3
"""The table of bench/speed/run.sh: trainerd against HF PEFT, plain and compiled (see README.md).

  python3 bench/speed/report.py [RESULTS]

RESULTS is the results folder of a run (default $WORK_DIR/results, else /tmp/trainerd-speed/results:
one JSON per row and system, versions.json, ceiling.json) or the results.json bundle that run.sh
writes to $OUT. Prints one markdown table and the targets of the issue, met / NOT met / not run;
also writes it to $OUT/speed.md when OUT is set. Standard library only: runs anywhere.
"""
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speed_util import settings_of, settings_text  # noqa: E402  (standard library only, beside this file)

# The rows run.sh knows, in its order (run.sh's row_def is the authority; other rows found are added).
ROWS = [("1b", "llama3-1b", 8, 2048, False), ("8b", "llama3-8b", 4, 2048, False), ("8b-ckpt", "llama3-8b", 8, 2048, True)]
SYSTEMS = [("trainerd", "trainerd"), ("hf", "HF PEFT"), ("hf-compile", "HF PEFT + compile")]
# The targets of the issue.
TOK_VS_PLAIN, TOK_VS_COMPILED = 2.0, 1.5
MEM_VS_PLAIN_8B, MEM_8B_ROW = 0.6, "8b"
LOSS_TOL = 0.01
DASH = "—"


def load(path):
    """-> (versions, ceiling, {"row.system": result})"""
    if os.path.isfile(path):
        with open(path) as f:
            b = json.load(f)
        return b.get("versions") or {}, b.get("ceiling") or {}, b.get("results") or {}
    versions, ceiling, results = {}, {}, {}
    for p in sorted(glob.glob(os.path.join(path, "*.json"))):
        name = os.path.basename(p)[:-5]
        try:
            with open(p) as f:
                j = json.load(f)
        except (OSError, ValueError) as e:
            print("warning: skipping %s: %s" % (p, e), file=sys.stderr)
            continue
        if name == "versions":
            versions = j
        elif name == "ceiling":
            ceiling = j
        else:
            results[name] = j
    return versions, ceiling, results


def num(x, fmt):
    return DASH if x is None else format(x, fmt)


def ok(r):
    return r is not None and r.get("status") == "ok"


def verdict(good):
    return "met" if good else "NOT met"


def row_label(row_id, results):
    for rid, shape, mb, seq, ckpt in ROWS:
        if rid == row_id:
            return "%s %d×%d%s (%s)" % (shape, mb, seq, ", ckpt" if ckpt else "", rid)
    r = next((v for k, v in results.items() if k.split(".", 1)[0] == row_id), {})
    return "%s %s×%s%s (%s)" % (r.get("shape", row_id), r.get("micro_batch", "?"), r.get("seq", "?"),
                                ", ckpt" if r.get("grad_ckpt") else "", row_id)


def checks_for_row(row_id, t, h, c):
    """-> {check: (state, text)}; state is 'met', 'NOT met' or 'not run'."""
    out = {}

    def ratio(check, a, b, key, limit, higher_is_better):
        if not (ok(a) and ok(b)) or not b.get(key) or a.get(key) is None:
            out[check] = ("not run", None)
            return
        x = a[key] / b[key]
        good = x >= limit if higher_is_better else x <= limit
        out[check] = (verdict(good), x)

    ratio("tok_plain", t, h, "tokens_per_s", TOK_VS_PLAIN, True)
    ratio("tok_compiled", t, c, "tokens_per_s", TOK_VS_COMPILED, True)
    ratio("mem_plain", t, h, "peak_mem_gib", 1.0, False)
    ratio("mem_compiled", t, c, "peak_mem_gib", 1.0, False)
    if row_id == MEM_8B_ROW:
        ratio("mem_plain_0.6", t, h, "peak_mem_gib", MEM_VS_PLAIN_8B, False)
    for check, ref in (("loss_plain", h), ("loss_compiled", c)):
        if ok(t) and ok(ref) and ref.get("first_loss"):
            d = (t["first_loss"] - ref["first_loss"]) / abs(ref["first_loss"])
            out[check] = (verdict(abs(d) <= LOSS_TOL), d)
        else:
            out[check] = ("not run", None)
    return out


def cell_ratio(state_x, limit_text):
    state, x = state_x
    if x is None:
        return DASH
    return "%.2f× %s" % (x, state) + (" (%s)" % limit_text if limit_text else "")


def render(versions, ceiling, results):
    row_ids = [r[0] for r in ROWS]
    for k in results:
        rid = k.split(".", 1)[0]
        if rid not in row_ids:
            row_ids.append(rid)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    L = ["# Training speed: trainerd vs Hugging Face PEFT", ""]
    L.append("- date: measured %s; report %s" % (versions.get("date", "unknown"), now))
    gpu = versions.get("gpu") or ceiling.get("gpu") or "unknown"
    L.append("- GPU: %s%s, driver %s%s" % (gpu, " (%s)" % versions["gpu_memory"] if versions.get("gpu_memory") else "",
                                          versions.get("driver", "unknown"),
                                          ", power limit %s" % versions["power_limit"] if versions.get("power_limit") else ""))
    L.append("- versions: torch %s (CUDA %s), transformers %s, peft %s, nvcc %s; trainerd %s" % (
        versions.get("torch", "?"), versions.get("torch_cuda", "?"), versions.get("transformers", "?"),
        versions.get("peft", "?"), versions.get("nvcc", "?"), versions.get("trainerd_commit", "unknown")))
    if ceiling.get("matmul_tflops"):
        L.append("- bf16 matmul ceiling: %.1f TFLOP/s (8192³, random bf16, median of %s; min-max %.3f-%.3f ms); "
                 "device copy %.2f TB/s (read + write)" % (ceiling["matmul_tflops"], ceiling.get("matmul_reps", "?"),
                                                             ceiling.get("matmul_ms_min", 0), ceiling.get("matmul_ms_max", 0),
                                                             ceiling.get("copy_tb_s", 0)))
    else:
        L.append("- bf16 matmul ceiling: not measured (MFU missing)")
    any_r = next(iter(results.values()), {})
    L.append("- method: identical random weights and token ids on every system; %s untimed + %s timed steps of one "
             "micro-batch; LoRA r %s, alpha %s, all seven projections, bf16, AdamW; MFU = tokens/s × the reference's "
             "lora_flops_per_token / the ceiling above; trainerd's step time is the device time between step ends "
             "(CUDA events), the reference's the wall time of its timed loop; both peaks are reset after loading" % (any_r.get("warmup", 3), any_r.get("steps", 10),
                                                      any_r.get("lora_r", 16), any_r.get("lora_alpha", 32)))
    L.append("")
    head = ["row", "system", "tokens/s", "step (s)", "peak GiB", "MFU", "first loss",
            "tok/s ÷ plain (≥%.1f×)" % TOK_VS_PLAIN, "tok/s ÷ compiled (≥%.1f×)" % TOK_VS_COMPILED,
            "mem ÷ plain (≤1×; 8b ≤%.1f×)" % MEM_VS_PLAIN_8B, "mem ÷ compiled (≤1×)", "first-loss Δ vs plain / compiled (≤1%)"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    all_checks = {}
    failures, warnings, power = [], [], []
    for rid in row_ids:
        t, h, c = (results.get("%s.%s" % (rid, s)) for s, _ in SYSTEMS)
        # A reference measured with other settings than trainerd's (a results folder that mixes runs) is
        # shown but not compared.
        settings = {sid: settings_of(r) for (sid, _), r in zip(SYSTEMS, (t, h, c)) if r is not None}
        other = {sid for sid, _ in SYSTEMS[1:]
                 if sid in settings and "trainerd" in settings and settings[sid] != settings["trainerd"]}
        for sid, sname in SYSTEMS[1:]:
            if sid in other:
                warnings.append("%s: %s was measured with %s, trainerd with %s: not compared (run the row again "
                                "with every system)" % (rid, sname, settings_text(settings[sid]),
                                                        settings_text(settings["trainerd"])))
        chk = checks_for_row(rid, t, None if "hf" in other else h, None if "hf-compile" in other else c)
        all_checks[rid] = chk
        for i, (sid, sname) in enumerate(SYSTEMS):
            r = results.get("%s.%s" % (rid, sid))
            note = [r["settings"]] if r and r.get("settings") else []
            if sid in other:
                note.append("other settings: not compared")
            cells = [row_label(rid, results) if i == 0 else "", sname + (" (%s)" % "; ".join(note) if note else "")]
            if ok(r):
                mfu = r.get("mfu")
                if r.get("flops_per_token") and ceiling.get("matmul_tflops"):  # one ceiling for every line
                    mfu = r["tokens_per_s"] * r["flops_per_token"] / 1e12 / ceiling["matmul_tflops"]
                cells += ["{:,.0f}".format(r["tokens_per_s"]), num(r.get("step_s"), ".3f"), num(r.get("peak_mem_gib"), ".1f"),
                          num(mfu, ".3f"), num(r.get("first_loss"), ".4f")]
                if r.get("power_w"):
                    power.append("%s, %s: %.0f W at %.0f MHz" % (row_label(rid, results), sname, r["power_w"],
                                                                r["sm_mhz"]))
            elif r is not None:
                st = r.get("status", "failed")
                cells += [{"oom": "OOM"}.get(st, st)] + [DASH] * 4
                failures.append("%s, %s: %s" % (rid, sname, (r.get("error") or st)[:300]))
            else:
                cells += [DASH] * 5
            if sid == "trainerd":
                mem_plain = chk["mem_plain_0.6"] if rid == MEM_8B_ROW else chk["mem_plain"]
                lp, lc = chk["loss_plain"], chk["loss_compiled"]
                if lp[1] is None and lc[1] is None:
                    loss_cell = DASH
                else:
                    pct = [DASH if x is None else "%+.3f%%" % (100 * x) for x in (lp[1], lc[1])]
                    state = "NOT met" if "NOT met" in (lp[0], lc[0]) else ("not run" if "not run" in (lp[0], lc[0]) else "met")
                    loss_cell = "%s / %s %s" % (pct[0], pct[1], state)
                cells += [cell_ratio(chk["tok_plain"], ""), cell_ratio(chk["tok_compiled"], ""),
                          cell_ratio(mem_plain, ""), cell_ratio(chk["mem_compiled"], ""), loss_cell]
                if ok(r) and r.get("tokens_per_step") and r.get("micro_batch") and r.get("seq") and \
                        abs(r["tokens_per_step"] - r["micro_batch"] * r["seq"]) > 0.5:
                    warnings.append("%s: trainerd trained %.0f tokens a step, not %d × %d" % (
                        rid, r["tokens_per_step"], r["micro_batch"], r["seq"]))
            else:
                cells += [""] * 5
            L.append("| " + " | ".join(cells) + " |")
    L.append("")
    L.append("Targets (from the issue), on every row:")
    for key, text in (("tok_plain", "tokens/s ≥ %.1f× HF PEFT plain" % TOK_VS_PLAIN),
                      ("tok_compiled", "tokens/s ≥ %.1f× HF PEFT + compile" % TOK_VS_COMPILED),
                      ("mem_both", "peak memory ≤ both references"),
                      ("mem_plain_0.6", "peak memory ≤ %.1f× plain on %s" % (MEM_VS_PLAIN_8B, row_label(MEM_8B_ROW, results))),
                      ("loss", "first-step losses within %g%% of both references" % (100 * LOSS_TOL))):
        per = {}
        for rid in row_ids:
            chk = all_checks[rid]
            if key == "mem_plain_0.6":
                if rid != MEM_8B_ROW:
                    continue
                per[rid] = chk[key]
            elif key in ("mem_both", "loss"):
                a, b = (chk["mem_plain"], chk["mem_compiled"]) if key == "mem_both" else (chk["loss_plain"], chk["loss_compiled"])
                states = (a[0], b[0])
                st = "NOT met" if "NOT met" in states else ("not run" if "not run" in states else "met")
                per[rid] = (st, None)
            else:
                per[rid] = chk[key]
        bad = [r for r, (s, _) in per.items() if s == "NOT met"]
        missing = [r for r, (s, _) in per.items() if s == "not run"]
        good = [r for r, (s, _) in per.items() if s == "met"]
        overall = "NOT met" if bad else ("not run" if missing else "met")
        detail = []
        if bad:
            detail.append("NOT met on " + ", ".join(bad))
        if good and (bad or missing):
            detail.append("met on " + ", ".join(good))
        if missing and (bad or good):
            detail.append("not run on " + ", ".join(missing))
        L.append("- %s: **%s**%s" % (text, overall, " (%s)" % "; ".join(detail) if detail else ""))
    if power:
        L.append("")
        L.append("The card while busy (medians of nvidia-smi's samples every 200 ms at ≥ 90%% utilisation; "
                 "power limit %s): %s." % (versions.get("power_limit", "unknown"), "; ".join(power)))
    gpus = {r.get("gpu") for r in results.values() if r.get("gpu")}
    if len(gpus) > 1:
        warnings.append("results come from different GPUs: %s; compare within one machine only" % ", ".join(sorted(gpus)))
    commits = {r.get("trainerd_commit") for r in results.values() if r.get("system") == "trainerd" and r.get("trainerd_commit")}
    if len(commits) > 1:
        warnings.append("trainerd results from different commits: %s" % ", ".join(sorted(commits)))
    if failures:
        L.append("")
        L.append("Failed:")
        L += ["- " + f.replace("|", "/") for f in failures]
    if warnings:
        L.append("")
        L.append("Warnings:")
        L += ["- " + w for w in warnings]
    return "\n".join(L) + "\n"


def main():
    default = os.path.join(os.environ.get("WORK_DIR") or "/tmp/trainerd-speed", "results")
    path = sys.argv[1] if len(sys.argv) > 1 else default
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not os.path.exists(path):
        print("no results at %s" % path, file=sys.stderr)
        return 1
    text = render(*load(path))
    sys.stdout.write(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "speed.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
