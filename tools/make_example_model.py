#!/usr/bin/env python3
"""Makes the small bundled example model and the demo's data.

    python3 tools/make_example_model.py OUT_DIR    (needs torch + transformers)

    python3 tools/make_example_model.py --data-only OUT_DIR   (plain Python)

The model is a tiny Llama (about 0.95M parameters, vocabulary 512, stored in
bf16) pretrained for a few hundred steps on a synthetic "language": token
sequences drawn from a sparse random Markov chain in which each token has
three successors with probabilities 0.6, 0.3 and 0.1. The demo's data
(data/train.jsonl, data/eval.jsonl, tokens format) comes from the same chain
with the successors' probabilities rotated (0.1, 0.6, 0.3): a shift in usage
the model has to learn, so the loss starts high and visibly falls as the
LoRA adapter learns it. Deterministic.
"""
import json
import os
import random
import sys


VOCAB = 512
SEQ = 64


def markov_chain(seed, successors=3):
    rng = random.Random(seed)
    return [rng.sample(range(VOCAB), successors) for _ in range(VOCAB)]


def sample(chain, rng, length, weights=(6, 3, 1)):
    tok = rng.randrange(VOCAB)
    out = [tok]
    for _ in range(length - 1):
        tok = rng.choices(chain[tok], weights=weights)[0]
        out.append(tok)
    return out


def write_data(out):
    chain = markov_chain(1)
    rng = random.Random(4)
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    for name, n in (("train", 1024), ("eval", 64)):
        with open(os.path.join(out, "data", f"{name}.jsonl"), "w") as f:
            for _ in range(n):
                ids = sample(chain, rng, rng.randrange(SEQ // 2, SEQ + 1), weights=(1, 6, 3))
                f.write(json.dumps({"input_ids": ids}) + "\n")


def main():
    if sys.argv[1] == "--data-only":
        write_data(sys.argv[2])
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    out = sys.argv[1]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        model_type="llama", vocab_size=VOCAB, hidden_size=128, intermediate_size=352,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)
    pretrain = markov_chain(1)
    rng = random.Random(2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    for step in range(400):
        batch = torch.tensor([sample(pretrain, rng, SEQ) for _ in range(32)], device=device)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == 399:
            print(f"pretrain step {step} loss {loss.item():.3f}")
    model.to("cpu", torch.bfloat16).save_pretrained(os.path.join(out, "tiny-llama"))

    write_data(out)


if __name__ == "__main__":
    main()
