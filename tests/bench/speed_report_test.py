#!/usr/bin/env python3
"""bench/speed's arithmetic and verdicts, on figures the bench produced on the H200 (2026-12-03):
fixtures/h200-1b-trainerd-metrics.jsonl is trainerd-worker's metrics.jsonl of the 1b row, and
fixtures/h200-results.json the results bundle run.sh wrote for the table in docs/benchmarks.md.
Standard library only; run by ctest (tests/CMakeLists.txt)."""
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import types
import unittest

sys.dont_write_bytecode = True  # nothing written into the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "speed"))
import report  # noqa: E402
import speed_util  # noqa: E402

METRICS = os.path.join(HERE, "fixtures", "h200-1b-trainerd-metrics.jsonl")
RESULTS = os.path.join(HERE, "fixtures", "h200-results.json")


def read_lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


class ParseTrainerdTest(unittest.TestCase):
    def test_timed_steps_are_the_sum_of_each_steps_own_time(self):
        got = speed_util.parse_trainerd(METRICS, warmup=3, steps=10)
        lines = {j["step"]: j for j in read_lines(METRICS)}
        # Recomputed here step by step: tokens of steps 4..13 over the sum of each step's time.
        seconds = sum((lines[s]["tokens"] - lines[s - 1]["tokens"]) / lines[s]["tokens_per_s"] for s in range(4, 14))
        tokens = lines[13]["tokens"] - lines[3]["tokens"]
        self.assertEqual(tokens, 10 * 8 * 2048)
        self.assertAlmostEqual(got["tokens_per_s"], tokens / seconds, places=6)
        self.assertAlmostEqual(got["step_s"], seconds / 10, places=9)
        self.assertEqual(got["first_loss"], lines[1]["loss"])
        self.assertEqual(got["tokens_per_step"], 16384)
        self.assertAlmostEqual(got["peak_mem_gib"], max(j["peak_memory_bytes"] for j in lines.values()) / 2 ** 30)

    def test_a_missing_step_is_an_error_not_a_figure(self):
        tmp = tempfile.mkdtemp()
        try:
            path = os.path.join(tmp, "metrics.jsonl")
            with open(path, "w") as f:
                for j in read_lines(METRICS):
                    if j["step"] != 7:  # as with log_every: 2
                        f.write(json.dumps(j) + "\n")
            with self.assertRaisesRegex(ValueError, "log_every must be 1"):
                speed_util.parse_trainerd(path, warmup=3, steps=10)
            with self.assertRaisesRegex(ValueError, "need 1, 3 and 20"):
                speed_util.parse_trainerd(METRICS, warmup=3, steps=17)
        finally:
            shutil.rmtree(tmp)


class ParsePowerTest(unittest.TestCase):
    def write(self, text):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        path = os.path.join(tmp, "run.log.power.csv")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_medians_of_the_busy_samples_only(self):
        # Loading (idle, low clocks), the steps at the power limit, a sample the card could not give, and
        # the line cut short when the sampler was stopped.
        path = self.write("71.20, 345, 0\n118.50, 1980, 35\n698.10, 1320, 100\n[N/A], 1335, 100\n"
                          "696.40, 1335, 100\n699.90, 1305, 99\n655.00, 1500, 92\n420.7")
        got = speed_util.parse_power(path)
        self.assertEqual(got["power_samples"], 4)
        self.assertAlmostEqual(got["power_w"], (696.40 + 698.10) / 2)
        self.assertAlmostEqual(got["sm_mhz"], (1320 + 1335) / 2)

    def test_too_few_busy_samples_or_no_file_give_no_figure(self):
        self.assertEqual(speed_util.parse_power(self.write("698.10, 1320, 100\n690.00, 1330, 100\n30.0, 210, 0\n")), {})
        self.assertEqual(speed_util.parse_power(os.path.join(tempfile.gettempdir(), "no-such-power.csv")), {})


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.versions, self.ceiling, self.results = report.load(RESULTS)

    def row_line(self, text, row_label, system):
        lines = text.splitlines()
        start = next(i for i, l in enumerate(lines) if l.startswith("| " + row_label))
        for l in lines[start:start + 3]:
            if ("| %s |" % system) in l:
                return l
        self.fail("no %s line under %s" % (system, row_label))

    def test_ratios_and_verdicts_of_the_h200_run(self):
        text = report.render(self.versions, self.ceiling, self.results)
        r = self.results
        ratio = r["1b.trainerd"]["tokens_per_s"] / r["1b.hf"]["tokens_per_s"]
        self.assertAlmostEqual(ratio, 2.274, places=3)
        one_b = self.row_line(text, "llama3-1b 8×2048 (1b)", "trainerd")
        self.assertIn("%.2f× met" % ratio, one_b)
        compiled = r["1b.trainerd"]["tokens_per_s"] / r["1b.hf-compile"]["tokens_per_s"]
        self.assertIn("%.2f× met" % compiled, one_b)
        self.assertIn("%.2f× met" % (r["1b.trainerd"]["peak_mem_gib"] / r["1b.hf"]["peak_mem_gib"]), one_b)
        eight_b = self.row_line(text, "llama3-8b 4×2048 (8b)", "trainerd")
        self.assertIn("%.2f× NOT met" % (r["8b.trainerd"]["tokens_per_s"] / r["8b.hf"]["tokens_per_s"]), eight_b)
        # The 8b memory cell is the 0.6× target: 50.2 / 99.4 = 0.51 is met.
        self.assertIn("%.2f× met" % (r["8b.trainerd"]["peak_mem_gib"] / r["8b.hf"]["peak_mem_gib"]), eight_b)
        self.assertIn("- tokens/s ≥ 2.0× HF PEFT plain: **NOT met** (NOT met on 8b, 8b-ckpt; met on 1b)", text)
        # No compiled figure on the 8b rows: not run, never met.
        self.assertIn("- tokens/s ≥ 1.5× HF PEFT + compile: **not run** (met on 1b; not run on 8b, 8b-ckpt)", text)
        self.assertIn("- peak memory ≤ 0.6× plain on llama3-8b 4×2048 (8b): **met**", text)

    def test_a_slower_trainerd_turns_the_verdict(self):
        results = json.loads(json.dumps(self.results))
        results["1b.trainerd"]["tokens_per_s"] = 1.49 * results["1b.hf-compile"]["tokens_per_s"]
        text = report.render(self.versions, self.ceiling, results)
        self.assertIn("1.49× NOT met", self.row_line(text, "llama3-1b 8×2048 (1b)", "trainerd"))
        results["1b.hf"]["first_loss"] *= 1.02  # 2% apart: not the same computation
        text = report.render(self.versions, self.ceiling, results)
        self.assertIn("- first-step losses within 1% of both references: **NOT met**", text)

    def test_a_systems_own_settings_show_beside_its_name(self):
        results = json.loads(json.dumps(self.results))
        results["1b.trainerd"]["settings"] = "2 micro-batches of 4; gradient_checkpointing_layers: 17"
        text = report.render(self.versions, self.ceiling, results)
        self.assertIn("| trainerd (2 micro-batches of 4; gradient_checkpointing_layers: 17) | ", text)
        self.assertNotIn("| HF PEFT (", text)

    def test_the_cards_power_while_busy_shows_where_it_was_measured(self):
        text = report.render(self.versions, self.ceiling, self.results)
        self.assertNotIn("The card while busy", text)  # the H200 run's results predate the sampler
        results = json.loads(json.dumps(self.results))
        results["8b.trainerd"].update(power_w=697.5, sm_mhz=1327.5, power_samples=40)
        results["8b.hf"].update(power_w=612.0, sm_mhz=1755.0, power_samples=80)
        results["1b.hf-compile"] = dict(results["1b.hf-compile"], status="oom", power_w=500.0, sm_mhz=1900.0)
        text = report.render(self.versions, self.ceiling, results)
        line = next(l for l in text.splitlines() if l.startswith("The card while busy"))
        self.assertIn("power limit %s" % self.versions["power_limit"], line)
        self.assertIn("llama3-8b 4×2048 (8b), trainerd: 698 W at 1328 MHz; llama3-8b 4×2048 (8b), HF PEFT: 612 W at "
                      "1755 MHz.", line)
        self.assertNotIn("1b", line)  # a failed run's samples are not a figure

    def test_a_failed_reference_reads_as_such(self):
        results = json.loads(json.dumps(self.results))
        results["8b.hf"] = dict(results["8b.hf"], status="oom", error="CUDA out of memory")
        text = report.render(self.versions, self.ceiling, results)
        self.assertIn("| HF PEFT | OOM |", text)
        self.assertIn("8b, HF PEFT: CUDA out of memory", text)

    def test_a_reference_of_other_settings_is_shown_not_compared(self):
        results = json.loads(json.dumps(self.results))
        text = report.render(self.versions, self.ceiling, results)
        self.assertNotIn("not compared", text)  # the H200 run's systems share their settings
        results["1b.hf"]["lora_r"] = 64  # as if left from a run of another rank
        text = report.render(self.versions, self.ceiling, results)
        self.assertIn("| HF PEFT (other settings: not compared) | ", text)
        one_b = self.row_line(text, "llama3-1b 8×2048 (1b)", "trainerd")
        self.assertNotIn("%.2f×" % (results["1b.trainerd"]["tokens_per_s"] / results["1b.hf"]["tokens_per_s"]), one_b)
        self.assertIn("1b: HF PEFT was measured with llama3-1b, 8×2048, LoRA r 64 alpha 32 dropout 0.0, trainerd "
                      "with llama3-1b, 8×2048, LoRA r 16 alpha 32 dropout 0.0: not compared", text)
        # The compiled reference still compares; plain's verdict on 1b is "not run".
        self.assertIn("%.2f× met" % (results["1b.trainerd"]["tokens_per_s"] / results["1b.hf-compile"]["tokens_per_s"]),
                      one_b)
        self.assertIn("- tokens/s ≥ 2.0× HF PEFT plain: **NOT met** (NOT met on 8b, 8b-ckpt; not run on 1b)", text)


class StaleResultsTest(unittest.TestCase):
    def stale(self, folder, **kw):
        args = dict(results=folder, row="custom", shape="llama3-1b-0a1b2c3d", micro_batch=8, seq=1000, grad_ckpt=0,
                    lora_r=12, lora_alpha=24, lora_dropout=0.0)
        args.update(kw)
        with contextlib.redirect_stdout(io.StringIO()):  # one line per removed result
            return speed_util.cmd_stale(types.SimpleNamespace(**args))

    def test_a_row_run_with_other_settings_drops_what_the_old_ones_left(self):
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        old = dict(row="custom", shape="llama3-1b-0a1b2c3d", micro_batch=8, seq=1000, grad_ckpt=False, lora_r=12,
                   lora_alpha=24, lora_dropout=0.0, status="ok")
        for system in ("trainerd", "hf", "hf-compile"):
            speed_util.write_json(os.path.join(folder, "custom.%s.json" % system), dict(old, system=system))
        speed_util.write_json(os.path.join(folder, "1b.hf.json"), dict(old, row="1b", system="hf"))
        self.stale(folder)  # the same settings: everything stays
        self.assertEqual(len(os.listdir(folder)), 4)
        self.stale(folder, lora_dropout=0.05)  # another dropout: the row's three results go, 1b's stays
        self.assertEqual(sorted(os.listdir(folder)), ["1b.hf.json"])
        # A result written before dropout was recorded counts as dropout 0.
        legacy = {k: v for k, v in old.items() if k != "lora_dropout"}
        speed_util.write_json(os.path.join(folder, "custom.hf.json"), dict(legacy, system="hf"))
        self.stale(folder)
        self.assertIn("custom.hf.json", os.listdir(folder))
        self.stale(folder, shape="llama3-8b")
        self.assertNotIn("custom.hf.json", os.listdir(folder))


if __name__ == "__main__":
    unittest.main()
