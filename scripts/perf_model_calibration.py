#!/usr/bin/env python3
"""Calibrates kiln's GPU performance model (cuda/perf/estimate.hpp) against the kernel times
measured on H100 and H200 GPUs (docs/BENCHMARKS.md), without a GPU.

  python3 scripts/perf_model_calibration.py [--kiln build/examples/kiln] [--fit] [--counts FILE]
  python3 scripts/perf_model_calibration.py --gpt2-step bf16|f32 [--kiln ...]

For each measured case it runs `kiln bench --device sim --estimate DEVICE` (the case's kernels in
the SIMT simulator, blocks sampled), reads each kernel's time at the whole of every limit (the
"raw us:" lines), and prints the model's estimate beside the measured time, the error, and the
binding limit, then the error per kernel class. With --fit it also searches the fractions of each
limit reached (and the chain latency, the shortest kernel, and the host's overhead per timed step
for host-timed figures) that minimize the squared log errors, and prints them: they go into
cuda/perf/estimate.cpp's kReached, kLatencyCycles and launch_s by hand, and the table is run
again (--counts FILE keeps the kernels' counts, read back instead of simulating them again while
the binary's counting is unchanged). --gpt2-step estimates GPT-2 small's training step (B8 T1024)
by kernel class beside the classes Nsight Compute measured: the fake device holds the step with 1
and 2 layers, not 12, so each class is the 1-layer step's plus 11 times the second layer's (the
layers' kernels are the same). The fit is in-sample: few figures, several parameters; the errors it reports are not a
prediction's.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

LIMITS = ["dram", "l2", "tensor", "fp32", "issue", "shared", "latency", "launch"]

# (class, device, precision, bench flag, shape, what the estimate line names, measured us,
#  "ncu" (kernel time under Nsight Compute, the SM clock held at base) or "host" (device work
#  timed by the host: the launch and synchronize around it included), docs/BENCHMARKS.md row).
# Left out: the bf16 "old bench" products, timed when the bench summed an f32 product (another
# kernel and a sum: much at K = 768); the f32 ones it cost 1-3%, and they stay.
MEASURED = [
    ("gemm bf16", "h100", "bf16", "gemm", "4096", 245.4, "ncu", "GEMM kernel, bf16 4096^3 (ncu), 2026-11-28"),
    ("gemm bf16", "h100", "bf16", "gemm", "8192x2304x768", 92.4, "ncu", "GEMM kernel, bf16 8192x2304x768 (ncu)"),
    ("gemm bf16", "h100", "bf16", "gemm", "8192x50257x768", 3410.0, "host", "GEMM bf16 8192x50257x768 (LM head)"),
    ("gemm bf16", "h100", "bf16", "gemm", "8192x768x50257", 2050.0, "host", "GEMM bf16 8192x768x50257"),
    ("gemm bf16", "h100", "bf16", "gemm", "50257x768x8192", 950.0, "host", "GEMM bf16 50257x768x8192"),
    ("gemm f32", "h100", "f32", "gemm", "4096", 3840.0, "ncu", "GEMM kernel, f32 4096^3, TF32 off (ncu)"),
    ("gemm f32", "h100", "f32", "gemm", "1024", 2 * 1024**3 / 22.3e12 * 1e6, "host", "GEMM f32 1024^3, 22.3 TFLOP/s"),
    ("gemm f32", "h100", "f32", "gemm", "8192x2304x768", 2 * 8192 * 2304 * 768 / 28.1e12 * 1e6, "host",
     "GEMM f32 8192x2304x768, 28.1 TFLOP/s"),
    ("gemm f32", "h100", "f32", "gemm", "8192x768x3072", 2 * 8192 * 768 * 3072 / 30.8e12 * 1e6, "host",
     "GEMM f32 8192x768x3072, 30.8 TFLOP/s"),
    ("gemm f32", "h200", "f32", "gemm", "768x3072x8192", 2 * 768 * 3072 * 8192 / 23.8e12 * 1e6, "host",
     "GEMM f32 768x3072x8192, 23.8 TFLOP/s (H200)"),
    ("gemm f32", "h200", "f32", "gemm", "8192x50257x768", 2 * 8192 * 50257 * 768 / 29.8e12 * 1e6, "host",
     "GEMM f32 8192x50257x768, 29.8 TFLOP/s (H200)"),
    ("attention bf16", "h100", "bf16", "attention", "8x12x1024x64", 709.0, "host",
     "Causal attention fwd + bwd, bf16, 8x12x1024x64"),
    ("attention bf16", "h100", "bf16", "attention", "16x4x64x32", 31.0, "host",
     "Causal attention fwd + bwd, bf16, 16x4x64x32"),
    ("attention f32", "h100", "f32", "attention", "8x12x1024x64", 4450.0, "host",
     "Causal attention fwd + bwd, f32, 8x12x1024x64"),
    ("attention f32", "h100", "f32", "attention", "16x4x64x32", 85.0, "host",
     "Causal attention fwd + bwd, f32, 16x4x64x32"),
]

# The host-timed figures' overhead a timed step, from the last fit (see p["host"] below).
HOST_OVERHEAD_US = 18.6

HEAD = re.compile(r"^estimate on ([^,]+), (.*): ([0-9.]+) us")
KERNEL = re.compile(r"^  (\S+)\s+(\d+) x\s+([0-9.]+) us\s+(\S+)")
RAW = re.compile(r"^    raw us:(.*)$")
MODEL = re.compile(r"^  model: reached (.*); latency_cycles=(\S+) launch_us=(\S+)")


def run_bench(kiln, device, precision, flag, shapes):
    """{what: [(kernel, launches, {limit: raw us})]} and the binary's calibration from one kiln bench run."""
    cmd = [kiln, "bench", "--device", "sim", "--estimate", device, "--precision", precision, "--" + flag,
           ",".join(shapes)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
    return parse_bench(out.stdout)


def parse_bench(text):
    items, current, kernel, model = {}, None, None, None
    for line in text.splitlines():
        if m := MODEL.match(line):
            model = {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
            model["latency_cycles"], model["launch_us"] = float(m.group(2)), float(m.group(3))
        elif m := HEAD.match(line):
            current = items.setdefault(m.group(2), [])
        elif (m := KERNEL.match(line)) and current is not None:
            kernel = [m.group(1), int(m.group(2)), {}]
            current.append(kernel)
        elif (m := RAW.match(line)) and kernel is not None:
            kernel[2] = {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    return items, model


def shape_name(flag, shape, precision):
    if flag == "gemm":
        dims = shape.split("x") * (3 if "x" not in shape else 1)
        return f"gemm {dims[0]} x {dims[1]} x {dims[2]} {precision}"
    return f"attention {shape} {precision}, forward + backward"


def estimate(kernels, how, p):
    total = 0.0
    binding = {}
    for name, launches, raw in kernels:
        bounds = {l: raw[l] / p[l] for l in LIMITS if l not in ("latency", "launch")}
        bounds["latency"] = raw["latency"] * p["latency"]
        bounds["launch"] = p["launch"]
        limit = max(bounds, key=bounds.get)
        total += launches * bounds[limit]
        binding[limit] = binding.get(limit, 0) + launches * bounds[limit]
    if how == "host":
        total += p["host"]
    return total, max(binding, key=binding.get)


# GPT-2 small's training step on an H100 by kernel class, ms (docs/BENCHMARKS.md, "GPU training
# step": Nsight Compute, 2026-11-28; the f32 step from gpu-check's profile stage the same sitting).
STEP_MEASURED = {
    "bf16": {"kiln_fused_matmul": 11.36, "kiln_matmul": 7.15, "attention": 7.40, "kiln_fused_rows": 4.76,
             "kiln_column_sums_quads": 1.58, "kiln_multi_tensor": 1.20, "casts": 0.40},
    "f32": {"matmuls": 164.4, "attention": 52.2, "rows": 5.1},
}


def kernel_class(name, precision):
    family = name.rsplit("_", 1)[0]
    if family.startswith("kiln_attention"):
        return "attention"
    if precision == "f32":
        return {"kiln_fused_matmul": "matmuls", "kiln_matmul": "matmuls", "kiln_fused_rows": "rows"}.get(family, "other")
    if family.startswith("kiln_cast"):
        return "casts"
    return family if family in STEP_MEASURED["bf16"] else "other"


def gpt2_step(kiln, precision, model_of):
    by_layers = {}
    for layers in (1, 2):
        cmd = [kiln, "bench", "--device", "sim", "--estimate", "h100", "--precision", precision, "--layers",
               str(layers), "--heads", "12", "--embd", "768", "--block", "1024", "--vocab-size", "50257", "--batch",
               "8"]
        print("estimating " + " ".join(cmd[2:]), file=sys.stderr, flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("failed: " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
        items, model = parse_bench(out.stdout)
        q = model_of(model)
        classes = {}
        for name, launches, raw in items["the training step"]:
            t, _ = estimate([(name, launches, raw)], "ncu", q)
            c = kernel_class(name, precision)
            classes[c] = classes.get(c, 0) + t / 1000
        by_layers[layers] = classes
    one, two = by_layers[1], by_layers[2]
    measured = STEP_MEASURED[precision]
    print(f"| class | estimate ms (1 layer + 11 x the second) | measured ms | error |")
    print("|---|---|---|---|")
    total_e = 0
    for c in sorted(set(one) | set(two), key=lambda c: -(one.get(c, 0) + 11 * (two.get(c, 0) - one.get(c, 0)))):
        e = one.get(c, 0) + 11 * (two.get(c, 0) - one.get(c, 0))
        total_e += e
        m = measured.get(c)
        print(f"| {c} | {e:.2f} | {m if m is not None else '-'} | {'' if m is None else f'{e / m - 1:+.0%}'} |")
    print(f"| all | {total_e:.2f} | {sum(measured.values()):.2f} (the classes above) | |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default="build/examples/kiln")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--counts", help="a JSON file of the kernels' raw times: read if it exists, else written")
    ap.add_argument("--gpt2-step", choices=["bf16", "f32"], help="GPT-2 small's step by kernel class instead")
    args = ap.parse_args()

    def model_params(model):
        # The binary's calibration; the raw latency was computed at its cycles, which "latency"
        # scales. "host" is the host-timed figures' overhead a step (the launch and the synchronize
        # around the kernels), fitted with the rest and not part of the model.
        q = {l: model[l] for l in LIMITS if l not in ("latency", "launch")}
        q.update(latency=1.0, launch=model["launch_us"], host=HOST_OVERHEAD_US)
        return q

    if args.gpt2_step:
        gpt2_step(args.kiln, args.gpt2_step, model_params)
        return
    groups = {}
    for row in MEASURED:
        groups.setdefault((row[1], row[2], row[3]), []).append(row[4])
    found, model = {}, None
    if args.counts and os.path.exists(args.counts):
        with open(args.counts) as f:
            saved = json.load(f)
        found = {tuple(k.split("|", 1)): v for k, v in saved["kernels"].items()}
        model = saved["model"]
    else:
        for (device, precision, flag), shapes in groups.items():
            print(f"estimating {flag} {','.join(shapes)} ({precision}, {device})", file=sys.stderr, flush=True)
            items, model = run_bench(args.kiln, device, precision, flag, shapes)
            for what, kernels in items.items():
                found[(device, what)] = kernels
        if args.counts:
            with open(args.counts, "w") as f:
                json.dump({"model": model, "kernels": {"|".join(k): v for k, v in found.items()}}, f, indent=1)
    cases = []
    for cls, device, precision, flag, shape, us, how, source in MEASURED:
        key = (device, shape_name(flag, shape, precision))
        if key not in found:
            sys.exit(f"no estimate for {key}")
        cases.append((cls, device, shape, us, how, source, found[key]))
    p = model_params(model)

    def loss(q):
        return sum(math.log(estimate(k, how, q)[0] / us) ** 2 for _, _, _, us, how, _, k in cases)

    if args.fit:
        # L2's bandwidth is an assumption (not published): its fraction may exceed 1.
        bounds = {"dram": (0.3, 1.0), "l2": (0.1, 2.0), "tensor": (0.1, 1.0), "fp32": (0.1, 1.0),
                  "issue": (0.1, 1.0), "shared": (0.1, 1.0), "latency": (0.1, 10.0), "launch": (1.0, 10.0),
                  "host": (0.0, 20.0)}
        best = loss(p)
        step = 0.5
        while step > 0.005:
            improved = False
            for name, (lo, hi) in bounds.items():
                for direction in (1 + step, 1 / (1 + step)):
                    q = dict(p)
                    q[name] = min(hi, max(lo, (p[name] if p[name] > 0 else 0.5) * direction))
                    if (v := loss(q)) < best - 1e-12:
                        p, best, improved = q, v, True
            if not improved:
                step /= 2
        print("fitted: " + ", ".join(f"{k}={v:.3g}" for k, v in p.items()) +
              f" (latency cycles {p['latency'] * model['latency_cycles']:.3g})")
    print(f"| case | device | measured us | estimate us | error | binding | measured by |")
    print("|---|---|---|---|---|---|---|")
    per_class = {}
    for cls, device, shape, us, how, source, kernels in cases:
        est, binding = estimate(kernels, how, p)
        err = est / us - 1
        per_class.setdefault(cls, []).append(err)
        print(f"| {cls} {shape} | {device.upper()} | {us:.1f} | {est:.1f} | {err:+.0%} | {binding} | {how} |")
    print()
    print("| class | cases | within 25% | median abs error |")
    print("|---|---|---|---|")
    everything = []
    for cls, errs in per_class.items():
        everything += errs
        within = sum(abs(e) <= 0.25 for e in errs)
        med = sorted(abs(e) for e in errs)[len(errs) // 2]
        print(f"| {cls} | {len(errs)} | {within} | {med:.0%} |")
    within = sum(abs(e) <= 0.25 for e in everything)
    print(f"| all | {len(everything)} | {within} ({within / len(everything):.0%}) | "
          f"{sorted(abs(e) for e in everything)[len(everything) // 2]:.0%} |")


if __name__ == "__main__":
    main()
