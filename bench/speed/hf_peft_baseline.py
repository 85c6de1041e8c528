#!/usr/bin/env python3
# Copied from shared/gpu/hf_peft_baseline.py beside the repository (../shared/gpu/ from its root; measured in its README.md), so that
# bench/speed/run.sh has it on the GPU machine. One change besides these comment lines: model.train() after
# from_pretrained (--model-dir), which returns the model in eval mode, where transformers skips gradient
# checkpointing: --grad-ckpt then ran out of memory (8b-ckpt row: 137 GiB). Edit nothing else here.
"""Reference LoRA fine-tuning throughput with Hugging Face transformers + PEFT (the tools most users
would reach for), for side-by-side comparison with trainerd on the GPU machine, which has both installed.

It times a plain training loop (no Trainer overhead): forward with labels, backward, fused AdamW step.
Every figure is printed as one JSON line, so a benchmark script can read it beside its own numbers.

  python3 hf_peft_baseline.py --shape llama3-8b --micro-batch 4 --seq 2048
  python3 hf_peft_baseline.py --model-dir DIR --micro-batch 8 --seq 2048 --grad-ckpt
  python3 hf_peft_baseline.py --shape llama3-1b --save-model DIR   # writes random weights of that shape, HF format
  python3 hf_peft_baseline.py --shape llama3-8b --compile          # with torch.compile

--model-dir loads an HF model directory (the same one trainerd loads), so both sides train identical
weights on identical token ids (--tokens FILE: JSONL of {"input_ids": [...]}, one sequence per line;
random ids with --seed otherwise). The first step's loss is printed, to check both computed the same thing.
"""
import argparse, json, time, torch

SHAPES = {
    "llama3-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def matmul_ceiling():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        a @ b
    e.record()
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 / (s.elapsed_time(e) / 1e3 / 20) / 1e12


def lora_flops_per_token(cfg, seq):
    """4·N_dense + 4·L·seq·d: forward (2N) and input gradients (2N) of every matmul including lm_head,
    frozen weights getting no weight gradients, plus causal attention scores and values forward+backward."""
    d, L, f, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    hd = d // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * hd
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * f
    n_dense = L * per_layer + v * d
    return 4 * n_dense + 4 * L * seq * d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=SHAPES)
    ap.add_argument("--model-dir")
    ap.add_argument("--save-model", help="write random weights of --shape to this HF directory and exit")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=int, default=32)
    ap.add_argument("--lora-dropout", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (the best a Python user can do here)")
    a = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM, AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(a.seed)
    if a.model_dir:
        model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
        model.train()  # bench/speed: from_pretrained returns eval mode, where gradient checkpointing is off
        cfg = model.config
    else:
        cfg = LlamaConfig(max_position_embeddings=8192, rope_theta=500000.0, **SHAPES[a.shape])
        cfg._attn_implementation = "sdpa"
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        if a.save_model:
            model.save_pretrained(a.save_model, safe_serialization=True)
            print(json.dumps({"saved": a.save_model}))
            return
    if a.grad_ckpt:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.lora_dropout,
                                             target_modules=TARGETS))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    fwd = torch.compile(model) if a.compile else model
    if a.tokens:
        rows = [json.loads(l)["input_ids"] for l in open(a.tokens)]
        flat = torch.tensor([t for r in rows for t in r])
        need = a.micro_batch * a.seq
        flat = flat.repeat(need // len(flat) + 1)[:need]
        x = flat.view(a.micro_batch, a.seq).cuda()
    else:
        x = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq), device="cuda")
    peak = matmul_ceiling()
    torch.cuda.reset_peak_memory_stats()

    def step():
        loss = fwd(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first = step().item()
    for _ in range(a.warmup - 1):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    dt = (time.perf_counter() - t) / a.steps
    tok = a.micro_batch * a.seq / dt
    mfu = tok * lora_flops_per_token(cfg, a.seq) / 1e12 / peak
    print(json.dumps(dict(system="hf-peft" + ("+compile" if a.compile else ""), shape=a.shape or a.model_dir, micro_batch=a.micro_batch, seq=a.seq,
                          grad_ckpt=a.grad_ckpt, first_loss=round(first, 5), step_s=round(dt, 4),
                          tokens_per_s=round(tok), mfu=round(mfu, 4), matmul_tflops=round(peak),
                          peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
                          torch=torch.__version__)))


if __name__ == "__main__":
    main()
