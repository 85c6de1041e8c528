#!/usr/bin/env python3
"""Checks that a merged model folder trainerd wrote loads in transformers and
equals PEFT's base model + trainerd's adapter.

    python3 tools/check_merged_load.py BASE_MODEL_DIR OUTPUT_DIR

OUTPUT_DIR is a LoRA job's output.dir run with output.merge: true (holding
adapter/ and merged/). Prints one JSON line; exits non-zero above 1e-5
relative (float32, CPU).
"""
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    base_dir, out_dir = sys.argv[1], sys.argv[2]
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    merged = AutoModelForCausalLM.from_pretrained(f"{out_dir}/merged", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, f"{out_dir}/adapter").eval()
    with torch.no_grad():
        a = merged(input_ids=ids).logits
        b = peft_model(input_ids=ids).logits
    err = ((a - b).abs().max() / b.abs().max()).item()
    ok = err <= 1e-5
    print(json.dumps({"check": "transformers_loads_trainerd_merged_model", "relative_error": err, "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
