#!/usr/bin/env python3
"""The PyTorch side of kiln's GPT training-step benchmark (docs/BENCHMARKS.md).

Times the step `kiln bench` times, in PyTorch: a GPT-2-architecture model (nanoGPT layout: learned
positions, pre-LayerNorm blocks with biases, tanh GELU, tied embedding and head), cross-entropy
over every position, backward, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, no weight decay, as
`kiln bench`), f32 throughout (TF32 matmuls off unless --tf32; bf16 autocast with --autocast-bf16),
dropout 0. Runs eager and, unless
--no-compile, torch.compile; prints ms/step and tokens/s for each.

GPT-2 small: --layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(embd)
        self.c_attn = nn.Linear(embd, 3 * embd)
        self.attn_proj = nn.Linear(embd, embd)
        self.ln_2 = nn.LayerNorm(embd)
        self.c_fc = nn.Linear(embd, 4 * embd)
        self.mlp_proj = nn.Linear(4 * embd, embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: fused (flash) attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, embd):
        super().__init__()
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(block, embd)
        self.blocks = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd)
        for m in self.modules():  # GPT-2 initialization, as kiln's (LayerNorm: ones and zeros)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for blk in self.blocks:
            for proj in (blk.attn_proj, blk.mlp_proj):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def time_steps(step, steps, sync):
    """Median seconds per step (as kiln bench reports), each step timed to its synchronize."""
    for _ in range(3):  # warm up (compilation included)
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step().item()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--vocab-size", type=int, default=65)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (kiln computes in full f32)")
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="forward and loss under torch.autocast(bfloat16): the peer of kiln --precision bf16")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.manual_seed(1)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ids = (torch.arange(a.batch * a.block, dtype=torch.long) * 7919 % a.vocab_size).view(a.batch, a.block).to(dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "the CPU"
    print(f"config L{a.layers} H{a.heads} C{a.embd} T{a.block} B{a.batch} V{a.vocab_size}, AdamW, "
          f"PyTorch {torch.__version__} on {name}, TF32 {'on' if a.tf32 else 'off'}"
          f"{', autocast bf16' if a.autocast_bf16 else ''}")
    compile_ok = hasattr(torch, "compile")
    if not a.no_compile and not compile_ok:
        print(f"torch.compile needs PyTorch 2; {torch.__version__} runs eager only")
    for mode in ["eager"] + ([] if a.no_compile or not compile_ok else ["torch.compile"]):
        model = GPT(a.vocab_size, a.block, a.layers, a.heads, a.embd).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        fwd = torch.compile(model) if mode == "torch.compile" else model

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.autocast_bf16):
                loss = fwd(ids, ids)
            loss.backward()
            opt.step()
            return loss

        per_step = time_steps(step, a.steps, sync)
        print(f"step ({mode}): {1000 * per_step:.2f} ms median, {a.batch * a.block / per_step:.0f} tokens/s")


if __name__ == "__main__":
    main()
