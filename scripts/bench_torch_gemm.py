"""cuBLAS through PyTorch on the GEMM shapes `kiln bench --gemm` takes, for the same sitting.

    python3 scripts/bench_torch_gemm.py 1024,4096,8192x2304x768 [--dtypes f32,bf16] [--runs 20]

f32 with TF32 off (as kiln's f32 matmuls); tf32: f32 with TF32 on (as `kiln bench --tf32`); bf16:
bf16 operands with f32 accumulation (torch's default for bf16 matmuls). Median of CUDA-event times after a warm-up,
on random data (never zeros).
"""
import argparse

import torch


def shapes(spec):
    out = []
    for item in spec.split(","):
        dims = [int(d) for d in item.split("x")]
        out.append((dims[0],) * 3 if len(dims) == 1 else tuple(dims))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shapes")
    p.add_argument("--dtypes", default="f32")
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    names = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
    for m, n, k in shapes(a.shapes):
        for dt in a.dtypes.split(","):
            torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
            x = torch.randn(m, k, device="cuda", dtype=names[dt])
            y = torch.randn(k, n, device="cuda", dtype=names[dt])
            for _ in range(3):
                x @ y
            times = []
            for _ in range(a.runs):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                x @ y
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            t = sorted(times)[len(times) // 2]
            print(f"torch gemm {m} x {n} x {k} (m n k), {dt}: {t:.3f} ms median of {a.runs} -> "
                  f"{2 * m * n * k / (t / 1000) / 1e12:.1f} TFLOP/s on {torch.cuda.get_device_name(0)}")


if __name__ == "__main__":
    main()
