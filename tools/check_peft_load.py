#!/usr/bin/env python3
"""Checks that an adapter trainerd wrote loads in PEFT unchanged and gives
trainerd's logits.

    TRAINERD_PEFT_CHECK_DIR=DIR build/tests/engine/parity_test \
        --gtest_filter=TrainingParity.LoraStepsMatchPeftFromSavedInit
    python3 tools/check_peft_load.py tests/fixtures/llama/model DIR

DIR holds adapter/ (trainerd's PEFT-format output) and logits.safetensors
(input_ids and the logits trainerd computed with that adapter). Prints one
JSON line with the relative error and exits non-zero above 1e-5 (float32, CPU).
"""
import json
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    base_dir, check_dir = sys.argv[1], sys.argv[2]
    ours = load_file(f"{check_dir}/logits.safetensors")
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, f"{check_dir}/adapter")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ours["input_ids"]).logits.float()
    err = ((logits - ours["logits"]).abs().max() / ours["logits"].abs().max()).item()
    ok = err <= 1e-5
    print(json.dumps({"check": "peft_loads_trainerd_adapter", "relative_error": err, "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
