"""PyTorch's causal attention, forward and backward, on the shapes `kiln bench --attention` takes.

    python3 scripts/bench_torch_attention.py 8x12x1024x64,16x4x64x32 [--runs 20] [--device cuda] [--bf16]

Two rows a shape: torch.nn.functional.scaled_dot_product_attention (is_causal=True; on a GPU
its flash backend where it applies) and the same chain written out (matmul, mask, softmax,
matmul), as kiln's GPT records it. f32 (TF32 off), q, k, v of (B, H, T, D) with gradients;
each run is the forward, sum(y * y), and the backward. --bf16: q, k, v in bf16 (the peer of
`kiln bench --precision bf16 --attention`; on a GPU the flash kernels). Median of CUDA-event times (wall
times on the CPU) after a warm-up. FLOPs are counted as bench_attention.hpp counts them.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


def shapes(spec):
    return [tuple(int(d) for d in item.split("x")) for item in spec.split(",")]


def written_out(q, k, v):
    t = q.shape[-2]
    s = (q / math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def time_ms(fn, q, k, v, runs, device):
    def step():
        y = fn(q, k, v)
        (y * y).sum().backward()

    for _ in range(3):
        step()
    times = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shapes")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true", help="q, k, v in bf16")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for b, h, t, d in shapes(a.shapes):
        g = torch.Generator(device="cpu").manual_seed(1)
        q, k, v = (torch.randn(b, h, t, d, generator=g).to(a.device, dtype).requires_grad_() for _ in range(3))
        flops = 12.0 * b * h * t * t * d / 2
        for name, fn in (("scaled_dot_product_attention", sdpa), ("written out", written_out)):
            ms = time_ms(fn, q, k, v, a.runs, a.device)
            print(f"torch attention {b}x{h}x{t}x{d} (B H T D), {name}, {dtype}, {a.device}: {ms:.3f} ms median of {a.runs}"
                  f" -> {flops / (ms / 1000) / 1e12:.3f} TFLOP/s")


if __name__ == "__main__":
    main()
