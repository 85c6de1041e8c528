#!/usr/bin/env python3
"""Generates the engine's parity fixtures with transformers + PEFT (the reference).

Run on a machine that has torch, transformers and peft (the GPU machine):
    python3 tools/make_fixtures.py OUT_DIR
and copy OUT_DIR over tests/fixtures/. Everything is computed on the CPU in
float32 so that the fixtures are the reference's exact numbers, not a GPU's.

For each of three tiny configurations (llama, mistral, qwen2) it writes:
  NAME/model/                  HF model folder (save_pretrained)
  NAME/reference.safetensors   input_ids (B,T) int64; logits (B,T,V) f32;
                               lora_logits (B,T,V) f32 with NAME/adapter applied
  NAME/adapter/                PEFT LoRA adapter with non-zero B (save_pretrained)
  NAME/eval.jsonl              tokens-format eval set (ragged, some labels -100)
  NAME/reference.json          eval_loss / eval_tokens of the base model and
                               of the model with the adapter
and two training runs, whose loop is written out below and is the one the
engine implements (docs/job-spec.md): micro-batches in file order, right-padded,
the step's loss = sum of token losses of its accumulated micro-batches divided
by their target-token count, AdamW with weight decay on all but norms and
biases, a learning-rate schedule stepped after each optimizer step, clipping.
  llama/lora_train/  LoRA from a saved PEFT init: init_adapter/, train.jsonl,
                     final_adapter/, steps.json (per-step loss, lr, grad_norm)
  qwen2/full_train/  full fine-tuning: train.jsonl, steps.json
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

import peft
from peft import LoraConfig, PeftModel, get_peft_model

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

VOCAB = 256
SEQ = 16
BATCH = 2

CONFIGS = {
    # untied, llama3 rope scaling, GQA 4:2, odd intermediate size
    "llama": dict(
        model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=160,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=256,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=32),
        tie_word_embeddings=False, attention_bias=False, initializer_range=0.08),
    # tied, linear rope scaling, head_dim given explicitly (!= hidden/heads), bf16 shards
    "mistral": dict(
        model_type="mistral", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
        rope_scaling=dict(rope_type="linear", factor=2.0), sliding_window=None,
        tie_word_embeddings=True, initializer_range=0.08),
    # q,k,v biases, fp16 storage, untied
    "qwen2": dict(
        model_type="qwen2", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=256,
        use_sliding_window=False, tie_word_embeddings=False, initializer_range=0.08),
}
STORAGE = {"llama": (torch.float32, None), "mistral": (torch.bfloat16, "60KB"),
           "qwen2": (torch.float16, None)}
ADAPTERS = {
    "llama": dict(r=4, lora_alpha=8, lora_dropout=0.1,
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                  "gate_proj", "up_proj", "down_proj"]),
    "mistral": dict(r=8, lora_alpha=16, lora_dropout=0.0,
                    target_modules=["q_proj", "v_proj", "down_proj"]),
    "qwen2": dict(r=4, lora_alpha=4, lora_dropout=0.0, use_rslora=True,
                  target_modules=["k_proj", "o_proj", "up_proj"]),
}


def tokens_jsonl(path, examples):
    with open(path, "w") as f:
        for ids, labels in examples:
            obj = {"input_ids": ids}
            if labels is not None:
                obj["labels"] = labels
            f.write(json.dumps(obj) + "\n")


def random_examples(gen, n, lo, hi, masked_prefix_every=3):
    """n examples of lengths in [lo, hi]; every k-th has a masked prompt prefix."""
    out = []
    for i in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        ids = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        labels = None
        if i % masked_prefix_every == 1:
            cut = length // 2
            labels = [-100] * cut + ids[cut:]
        out.append((ids, labels))
    return out


def labels_of(ex):
    return ex[1] if ex[1] is not None else list(ex[0])


def make_batch(examples, max_seq_len, pad_id=0):
    """Right-pads to the longest example after truncation; pads carry label -100."""
    exs = [(e[0][:max_seq_len], labels_of(e)[:max_seq_len]) for e in examples]
    width = max(len(ids) for ids, _ in exs)
    ids = torch.full((len(exs), width), pad_id, dtype=torch.long)
    lab = torch.full((len(exs), width), -100, dtype=torch.long)
    for i, (a, b) in enumerate(exs):
        ids[i, : len(a)] = torch.tensor(a)
        lab[i, : len(b)] = torch.tensor(b)
    return ids, lab


def loss_sum_and_count(model, ids, labels):
    logits = model(input_ids=ids).logits.float()
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1)
    loss = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
    return loss, int((shift_labels != -100).sum())


@torch.no_grad()
def eval_loss(model, examples, max_seq_len=10**9):
    """Mean over all target tokens, each example on its own (no padding)."""
    total, count = 0.0, 0
    for ex in examples:
        ids, lab = make_batch([ex], max_seq_len)
        s, n = loss_sum_and_count(model, ids, lab)
        total += float(s)
        count += n
    return total / count, count


def perturb(model, gen):
    """Gives norms and biases non-trivial values so that a skipped one shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def decay_split(named_params):
    decay, no_decay = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        is_norm = "norm" in name.split(".")[-2] if "." in name else False
        (no_decay if name.endswith("bias") or is_norm else decay).append(p)
    return decay, no_decay


def lr_lambda(kind, warmup, total):
    def f(step):
        if step < warmup:
            return step / max(1, warmup)
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        raise ValueError(kind)
    return f


def train(model, named_params, examples, hp):
    """The reference training loop; returns one record per optimizer step."""
    decay, no_decay = decay_split(named_params)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["learning_rate"], betas=(hp["adam_beta1"], hp["adam_beta2"]),
        eps=hp["adam_epsilon"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(hp["lr_scheduler"], hp["warmup_steps"], hp["max_steps"]))
    mb, accum = hp["micro_batch_size"], hp["gradient_accumulation_steps"]
    per_step = mb * accum
    records, cursor = [], 0
    model.train()
    for step in range(hp["max_steps"]):
        micro = []
        for _ in range(accum):
            chunk = []
            for _ in range(mb):
                chunk.append(examples[cursor % len(examples)])
                cursor += 1
            micro.append(make_batch(chunk, hp["max_seq_len"]))
        n_target = 0
        for ids, lab in micro:
            n_target += int((lab[:, 1:] != -100).sum())
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for ids, lab in micro:
            s, _ = loss_sum_and_count(model, ids, lab)
            (s / n_target).backward()
            total += float(s)
        params = decay + no_decay
        if hp["max_grad_norm"] > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, hp["max_grad_norm"])
        else:
            gn = torch.norm(torch.stack([p.grad.norm() for p in params]))
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        records.append({"step": step + 1, "loss": total / n_target, "lr": lr,
                        "grad_norm": float(gn), "tokens": n_target})
    assert per_step * hp["max_steps"] >= len(examples)  # the run wraps into a second epoch
    return records


def save_tensors(path, tensors):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)


def build_model(name, gen, out):
    cfg = AutoConfig.for_model(**CONFIGS[name])
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    perturb(model, gen)
    dtype, shard = STORAGE[name]
    model_dir = os.path.join(out, name, "model")
    model.to(dtype).save_pretrained(model_dir, **({"max_shard_size": shard} if shard else {}))
    # The reference numbers come from the stored (rounded) weights, in float32.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    want = CONFIGS[name].get("rope_scaling", {}).get("rope_type", "default")
    got = model.model.rotary_emb.rope_type
    assert got == want, f"{name}: rope type {got}, expected {want}"
    return model, model_dir


def main():
    out = sys.argv[1]
    gen = torch.Generator().manual_seed(1234)
    versions = {"torch": torch.__version__, "peft": peft.__version__}
    import transformers
    versions["transformers"] = transformers.__version__

    for name in CONFIGS:
        model, model_dir = build_model(name, gen, out)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
        evals = random_examples(gen, 6, 3, 20)
        tokens_jsonl(os.path.join(out, name, "eval.jsonl"), evals)
        base_loss, base_tokens = eval_loss(model, evals)

        lcfg = LoraConfig(task_type="CAUSAL_LM", **ADAPTERS[name])
        pmodel = get_peft_model(model, lcfg)
        with torch.no_grad():
            for pname, p in pmodel.named_parameters():
                if "lora_B" in pname:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        pmodel.eval()
        with torch.no_grad():
            lora_logits = pmodel(input_ids=ids).logits.float()
        lora_loss, _ = eval_loss(pmodel, evals)
        pmodel.save_pretrained(os.path.join(out, name, "adapter"))
        save_tensors(os.path.join(out, name, "reference.safetensors"),
                     {"input_ids": ids, "logits": logits, "lora_logits": lora_logits})
        with open(os.path.join(out, name, "reference.json"), "w") as f:
            json.dump({"eval_loss": base_loss, "eval_tokens": base_tokens,
                       "lora_eval_loss": lora_loss, "versions": versions}, f, indent=1)

    # LoRA training from a saved PEFT init (B = 0, A random), dropout 0.
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "llama", "model"),
                                                 dtype=torch.float32)
    tdir = os.path.join(out, "llama", "lora_train")
    os.makedirs(tdir, exist_ok=True)
    torch.manual_seed(7)
    pmodel = get_peft_model(model, LoraConfig(
        task_type="CAUSAL_LM", r=8, lora_alpha=16, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"]))
    pmodel.save_pretrained(os.path.join(tdir, "init_adapter"))
    train_examples = random_examples(gen, 10, 4, 24)
    tokens_jsonl(os.path.join(tdir, "train.jsonl"), train_examples)
    hp = dict(micro_batch_size=2, gradient_accumulation_steps=2, learning_rate=5e-3,
              lr_scheduler="linear", warmup_steps=3, weight_decay=0.01, adam_beta1=0.9,
              adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, max_steps=12,
              max_seq_len=20)
    recs = train(pmodel, list(pmodel.named_parameters()), train_examples, hp)
    pmodel.save_pretrained(os.path.join(tdir, "final_adapter"))
    with open(os.path.join(tdir, "steps.json"), "w") as f:
        json.dump({"hyperparameters": hp, "steps": recs, "versions": versions}, f, indent=1)

    # Full fine-tuning of qwen2 (biases and norms excluded from weight decay).
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "qwen2", "model"),
                                                 dtype=torch.float32)
    tdir = os.path.join(out, "qwen2", "full_train")
    os.makedirs(tdir, exist_ok=True)
    train_examples = random_examples(gen, 8, 4, 18)
    tokens_jsonl(os.path.join(tdir, "train.jsonl"), train_examples)
    hp = dict(micro_batch_size=3, gradient_accumulation_steps=1, learning_rate=2e-3,
              lr_scheduler="cosine", warmup_steps=2, weight_decay=0.1, adam_beta1=0.9,
              adam_beta2=0.95, adam_epsilon=1e-6, max_grad_norm=0.5, max_steps=10,
              max_seq_len=32)
    recs = train(model, list(model.named_parameters()), train_examples, hp)
    with open(os.path.join(tdir, "steps.json"), "w") as f:
        json.dump({"hyperparameters": hp, "steps": recs, "versions": versions}, f, indent=1)
    print("fixtures written to", out, versions)


if __name__ == "__main__":
    main()
