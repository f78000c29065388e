"""Kernel time of kiln's GEMM against cuBLAS's on the same shapes, both measured by Nsight Compute.

    python3 scripts/gpu_gemm_kernels.py [gpu-bundle] [--bf16-shapes 1024,4096,8192x2304x768]
        [--f32-shapes 1024,4096] [--runs 10] [--out DIR]

On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says.
`kiln bench --gemm` (host-timed: launch to synchronize) and scripts/bench_torch_gemm.py (CUDA
events around one call) time the product with different overheads around it; this script times
the kernels alone, the same way for both: one process per shape and dtype on each side under
`ncu --metrics gpu__time_duration.sum` (one pass, clocks and caches as the workload leaves them).

- kiln: the kernels of `kiln bench --gemm M x N x K` that run every step, as the product's
  `kiln_(fused_)?matmul` kernel does (it stores the product into a resident tensor: bf16 under
  --precision bf16), each at its median times its launches a step, summed: with b's rows not
  16-byte aligned (n = 50257) a step also copies b into padded rows.
- cuBLAS: every kernel of `bench_torch_gemm.py` but torch.randn's, summed and divided by the calls
  (3 warm-up + runs): cuBLAS may take more than one kernel a product (a split-K reduction).

bf16: bf16 operands and product, f32 accumulation; f32: TF32 off on both sides. Prints one line a
shape and dtype, and writes the table to DIR/gemm-kernels.txt (default: $OUT or .).
"""
import argparse
import csv
import os
import re
import shutil
import statistics
import subprocess
import sys

RANDN = re.compile(r"distribution|normal|philox|randn|fill", re.IGNORECASE)


def find_ncu():
    for path in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if path and os.path.exists(path):
            return path
    sys.exit("gpu_gemm_kernels: ncu not found (looked on PATH and in /usr/local/cuda/bin)")


def kernel_rows(ncu, report):
    """(name, ms) of each kernel in an ncu report, in launch order."""
    text = subprocess.run([ncu, "--import", report, "--csv", "--page", "raw", "--print-units", "base"],
                          capture_output=True, text=True, check=True).stdout
    rows = [r for r in csv.reader(text.splitlines()) if r]
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        raise RuntimeError(f"{report}: no 'Kernel Name' column in ncu's CSV")
    header = rows[start]
    c_name = header.index("Kernel Name")
    c_time = next(i for i, h in enumerate(header) if "gpu__time_duration" in h)
    out = []
    for r in rows[start + 1:]:
        try:
            out.append((r[c_name], float(r[c_time].replace(",", "")) * 1e-6))  # ns -> ms
        except (ValueError, IndexError):
            continue  # the units row
    return out


def profile(ncu, report, command, timeout):
    subprocess.run([ncu, "--target-processes", "all", "--clock-control", "none", "--cache-control", "none",
                    "--metrics", "gpu__time_duration.sum", "--export", report, "--force-overwrite"] + command,
                   capture_output=True, text=True, timeout=timeout, check=True)
    rows = kernel_rows(ncu, report + ".ncu-rep")
    os.remove(report + ".ncu-rep")  # only the table comes back from the device
    return rows


def per_step_ms(rows):
    """(ms, kernels) of one step of kiln's product: the kernels that run at least as often as the
    product's (not the operands' set-up), each at its median times its launches a step (kernels are
    named by their code: a square product pads a and b with one kernel, two launches a step)."""
    times = {}
    for name, t in rows:
        times.setdefault(name, []).append(t)
    steps = max((len(ts) for name, ts in times.items() if re.match(r"kiln_(fused_)?matmul", name)), default=0)
    if not steps:
        return float("nan"), 0
    every_step = [ts for ts in times.values() if len(ts) >= steps]
    return (sum(statistics.median(ts) * round(len(ts) / steps) for ts in every_step),
            sum(round(len(ts) / steps) for ts in every_step))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bundle", nargs="?", default="gpu-bundle")
    # Issue 20's shapes (1024^3, 4096^3, GPT-2 small's); in bf16 also the GPT-2 step's other products.
    p.add_argument("--bf16-shapes", default="1024,4096,8192x2304x768,8192x768x3072,768x3072x8192,768x768x8192,"
                                            "8192x3072x768,8192x50257x768")
    p.add_argument("--f32-shapes", default="1024,4096,8192x2304x768,8192x768x3072")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    a = p.parse_args()
    ncu = find_ncu()
    work = os.path.join(a.out, "gemm-kernels")
    os.makedirs(work, exist_ok=True)
    lines = ["m x n x k | dtype | kiln kernel ms (kernels a step) | cuBLAS kernel ms (kernels a call) | kiln TFLOP/s | "
             "cuBLAS TFLOP/s | kiln / cuBLAS"]
    print(lines[0], flush=True)
    cases = [(dt, item) for dt, spec in (("bf16", a.bf16_shapes), ("f32", a.f32_shapes)) for item in spec.split(",")
             if item]
    for dt, item in cases:
        dims = [int(d) for d in item.split("x")]
        m, n, k = (dims[0],) * 3 if len(dims) == 1 else dims
        flops = 2.0 * m * n * k
        tag = f"{m}x{n}x{k}-{dt}"
        try:
            kiln = profile(
                ncu, os.path.join(work, "kiln-" + tag),
                [os.path.join(a.bundle, "run"), os.path.join(a.bundle, "bin", "kiln"), "bench", "--device", "cuda",
                 "--precision", dt, "--gemm", f"{m}x{n}x{k}", "--steps", str(a.runs)], 300)
            torch = [t for name, t in profile(
                ncu, os.path.join(work, "torch-" + tag),
                [sys.executable, "scripts/bench_torch_gemm.py", f"{m}x{n}x{k}", "--dtypes", dt, "--runs",
                 str(a.runs)], 300) if not RANDN.search(name)]
        except (subprocess.SubprocessError, RuntimeError, StopIteration) as e:
            line = f"{m} x {n} x {k} | {dt} | failed: {e}"
            print(line, flush=True)
            lines.append(line)
            continue
        calls = 3 + a.runs
        kiln_ms, kiln_kernels = per_step_ms(kiln)
        torch_ms = sum(torch) / calls if torch else float("nan")
        line = (f"{m} x {n} x {k} | {dt} | {kiln_ms:.4f} ({kiln_kernels}) | {torch_ms:.4f} ({len(torch) / calls:g}) | "
                f"{flops / kiln_ms / 1e9:.1f} | {flops / torch_ms / 1e9:.1f} | {torch_ms / kiln_ms:.0%}")
        print(line, flush=True)
        lines.append(line)
    with open(os.path.join(a.out, "gemm-kernels.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
