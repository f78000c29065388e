#!/usr/bin/env bash
# gpu-check.sh: a one-shot check of kiln's CUDA back end on a machine with an NVIDIA GPU.
#
# It runs from the repository root, with executables bundled by device-bundle.sh: the GPU
# machine needs the driver (and, for some stages, the CUDA toolkit's tools, PyTorch and h5py),
# none of kiln's build dependencies. On the build machine, from the repository root:
#
#   cmake --build build -j2 --target kiln_cli kiln_tests
#   ../shared/tools/device-bundle.sh build gpu-bundle build/examples/kiln build/tests/kiln_tests
#   cp scripts/gpu-check.sh gpu-bundle/
#   cp -r ../shared/reference gpu-bundle/reference             # PyTorch reference for GpuGpt.*
#   [ -d /usr/share/games/fortunes ] && cp -r /usr/share/games/fortunes gpu-bundle/data
#   grep -qx '/gpu-bundle/' .git/info/exclude || echo /gpu-bundle/ >> .git/info/exclude
#
# On the GPU machine, from the repository root:
#
#   bash gpu-bundle/gpu-check.sh [options] [STAGE|GROUP ...]
#
# Stages run in this order, each under its own time limit; a failure or a timeout is recorded
# and the next stage runs anyway:
#   smi        nvidia-smi; driver, toolkit, PyTorch and h5py versions; libraries the bundle lacks
#   tests      the GPU tier of kiln_tests, then the kernels that combine partial results across
#              blocks (reduce_all, column_sums, multi_tensor sums) repeated 30 times
#   train      kiln train --device cuda, default config, 300 steps with --stats, a checkpoint,
#              then 20 more steps resumed from it
#   bench      kiln bench --device cuda, default config, with CUDA graphs and without
#   gpt2       kiln bench --device cuda, GPT-2 small (L12 H12 C768 T1024 B8 V50257), with
#              nvidia-smi sampled twice a second (memory, clocks, power)
#   nccl       data parallelism's device collective over one rank: NCCL loaded (the toolkit's
#              libnccl, else PyTorch's pip copy, else KILN_NCCL_LIBRARY), the GpuCollective tests,
#              the default config trained with NCCL inside its step graphs (--collectives nccl)
#              against without it (--deterministic: identical weights), and kiln bench with it
#   tune       kiln tune --device cuda on GPT-2 small in bf16 and in f32 (each matmul kernel's
#              candidates checked against Eigen and timed); the tuning file is copied into the
#              results folder, to be committed as this GPU kind's defaults (docs/tuning/)
#   agree      a mid-size config (4096 rows per step): two --deterministic GPU runs and one with
#              --no-cuda-graphs must give identical weights; a GPU and a CPU run of the same
#              20 steps must give close weights and losses
#   torch      scripts/bench_torch_gpt.py on the default config and on GPT-2 small (eager and
#              torch.compile, f32), and GPT-2 small eager with TF32 matmuls for reference
#   sanitizer  compute-sanitizer: memcheck over the GPU lowering tests and over kiln bench of a
#              tiny GPT (8 steps, CUDA graphs included); racecheck and synccheck over the lowering
#              tests of the kernels with shared memory; initcheck over the tiny GPT
#   profile    Nsight Compute: the time of every kernel of one GPT-2-small step (grouped by kind),
#              and the throughput, occupancy and shared-memory tables of the first matmul
#              kernels of the default config
# Groups: all (the default: every stage), core (smi tests train bench gpt2 agree nccl),
#         compare (smi torch sanitizer profile).
#
# Options:
#   --bundle DIR     the bundle (default: this script's folder if it holds bin/kiln, else
#                    ./gpu-bundle)
#   --deadline SECS  start no work later than SECS seconds after the start: each stage is cut to
#                    the time left and one that would get less than 30 s is skipped (use about
#                    560 where one command may run at most 10 minutes); default: no deadline
#   --data PATH      training corpus (default: $KILN_CHECK_DATA, /usr/share/games/fortunes,
#                    BUNDLE/data, else a corpus made of the repository's text files)
#   --list           print the stages with their time limits and exit
# Environment: OUT (results go to $OUT/gpu-check; default ./gpu-check-out/gpu-check),
#   KILN_CHECK_LIMIT_<STAGE>=SECS overrides a stage's time limit (e.g. KILN_CHECK_LIMIT_GPT2=900).
#
# Results (three files, so that they fit where few files may come back):
#   summary.txt   each stage's status and time, then its key lines (test counts, ms/step, tokens/s,
#                 losses, comparisons, sanitizer error counts, kernel time tables)
#   logs.txt      every stage's log (long logs keep their first 100 and last 300 lines)
#   logs.tar.gz   the full logs, gtest XML, nvidia-smi samples, Nsight Compute tables
#   gpu-*.json    the tune stage's tuning file (kiln tune's choices for this GPU)
# Exit status: 0 when every stage that ran passed, 1 otherwise.

# The stages are called by name (stage_$name), which shellcheck cannot follow.
# shellcheck disable=SC2317
set -u
umask 022

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start_time=$(date +%s)

all_stages=(smi tests train bench gpt2 agree nccl tune torch sanitizer profile)
declare -A limit=([smi]=60 [tests]=420 [train]=300 [agree]=360 [nccl]=240 [bench]=180 [gpt2]=480
                  [tune]=540 [torch]=600 [sanitizer]=600 [profile]=600)
for s in "${all_stages[@]}"; do
  v="KILN_CHECK_LIMIT_${s^^}"
  [ -n "${!v:-}" ] && limit[$s]=${!v}
done

gpt2_flags=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

# ---- arguments -------------------------------------------------------------------------------
bundle=${KILN_BUNDLE:-}
deadline=0
data=${KILN_CHECK_DATA:-}
selected=()
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) bundle=${2:?--bundle needs a folder}; shift 2 ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift 2 ;;
    --data) data=${2:?--data needs a path}; shift 2 ;;
    --list)
      for s in "${all_stages[@]}"; do printf '%-10s %4ss\n' "$s" "${limit[$s]}"; done
      exit 0 ;;
    -h | --help) usage; exit 0 ;;
    all) selected+=("${all_stages[@]}"); shift ;;
    core) selected+=(smi tests train bench gpt2 agree nccl); shift ;;
    compare) selected+=(smi torch sanitizer profile); shift ;;
    *)
      if [ -n "${limit[$1]+x}" ]; then selected+=("$1"); shift
      else echo "gpu-check: unknown stage or option '$1' (--help lists them)" >&2; exit 2; fi ;;
  esac
done
[ ${#selected[@]} -gt 0 ] || selected=("${all_stages[@]}")
# Keep the canonical order, each stage once.
stages=()
for s in "${all_stages[@]}"; do
  for t in "${selected[@]}"; do [ "$s" = "$t" ] && { stages+=("$s"); break; }; done
done

if [ -z "$bundle" ]; then
  if [ -x "$script_dir/bin/kiln" ]; then bundle=$script_dir; else bundle=$PWD/gpu-bundle; fi
fi
bundle=$(cd "$bundle" 2>/dev/null && pwd || echo "$bundle")
bin=$bundle/bin

results=${OUT:-$PWD/gpu-check-out}/gpu-check
mkdir -p "$results"
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpu-check.XXXXXX")
mkdir -p "$work/logs" "$work/keys" "$work/agree" "$work/train"
# Kernels compiled by one stage are loaded from this cache by the next ones (and by a second
# invocation on the same machine).
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-${TMPDIR:-/tmp}/kiln-gpu-check-cache}

# kiln's executables run through the bundle's wrapper, which puts its libraries (and the CUDA
# library folders) on the library path for them alone: tools and Python keep their own.
if [ -x "$bundle/run" ]; then kiln=("$bundle/run" "$bin/kiln"); tests=("$bundle/run" "$bin/kiln_tests")
else kiln=("$bin/kiln"); tests=("$bin/kiln_tests"); fi

# A tool from PATH or the first of the given paths (globs allowed) that exists.
find_tool() {
  local name=$1 pattern path
  shift
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
  for pattern in "$@"; do
    # shellcheck disable=SC2086  # the candidates are globs on purpose
    for path in $pattern; do
      if [ -x "$path" ]; then echo "$path"; return 0; fi
    done
  done
  return 1
}

now() { date +%s; }
time_left() {  # seconds until the deadline (a large number without one)
  if [ "$deadline" -gt 0 ]; then echo $((start_time + deadline - $(now))); else echo 1000000; fi
}

# ---- helpers written once: weights comparison and the kernel time table ----------------------
cat > "$work/compare_weights.py" <<'PY'
"""compare_weights.py MODE A.h5 B.h5: every numeric dataset of two kiln weights files.

exact: bit for bit (exit 1 otherwise). close: the norm-wise relative difference |a-b|/|b| of
each tensor, for information only: after Adam steps, parameters whose gradient is zero in exact
arithmetic (the attention key bias) move by rounding noise scaled to full steps, so weights may
differ where the losses agree.
"""
import sys

import h5py
import numpy as np


def load(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiu":
                out[name] = np.asarray(obj[()])
        f.visititems(visit)
    return out


mode, pa, pb = sys.argv[1:4]
a, b = load(pa), load(pb)
names = sorted(set(a) | set(b))
missing = [n for n in names if n not in a or n not in b]
rel = []
differ = 0
for n in names:
    if n in missing:
        continue
    x, y = a[n], b[n]
    if x.shape != y.shape:
        print(f"  {n}: shapes differ {x.shape} vs {y.shape}")
        differ += 1
        continue
    if x.tobytes() != y.tobytes():
        differ += 1
    if x.dtype.kind == "f" and x.size:
        d = np.linalg.norm((x.astype(np.float64) - y.astype(np.float64)).ravel())
        r = np.linalg.norm(y.astype(np.float64).ravel())
        rel.append((d / r if r > 0 else d, n))
rel.sort(reverse=True)
print(f"{len(names)} datasets, {differ} not bit-identical, {len(missing)} missing on one side")
if mode == "exact":
    for r, n in rel[:5]:
        if r > 0:
            print(f"  {n}: |a-b|/|b| = {r:.3e}")
    print("RESULT: identical" if differ == 0 and not missing else "RESULT: DIFFERENT")
    sys.exit(0 if differ == 0 and not missing else 1)
med = rel[len(rel) // 2][0] if rel else 0.0
print(f"  median over tensors of |a-b|/|b|: {med:.3e}; largest:")
for r, n in rel[:5]:
    print(f"  {n}: |a-b|/|b| = {r:.3e}")
PY

cat > "$work/kernel_times.py" <<'PY'
"""kernel_times.py CSV: one step's kernel times from `ncu --import R --csv --page raw`."""
import collections
import csv
import re
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
if not rows:
    sys.exit("no rows")
header = rows[0]


def col(*names):
    for name in names:
        if name in header:
            return header.index(name)
    return None


c_name = col("Kernel Name", "Function Name", "Demangled Name")
c_grid = col("Grid Size")
c_time = next((i for i, h in enumerate(header) if "gpu__time_duration" in h), None)
if c_name is None or c_time is None:
    sys.exit(f"unexpected columns: {header[:12]}")
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}
unit = 1e-6
data = rows[1:]
if data and not re.match(r"^[0-9.,]+$", data[0][c_time] or "x"):
    unit = scale.get(data[0][c_time].strip(), 1e-6)
    data = data[1:]
launches = []
for r in data:
    if len(r) <= max(c_name, c_time):
        continue
    try:
        t = float(r[c_time].replace(",", "")) * unit
    except ValueError:
        continue
    launches.append((r[c_name], r[c_grid] if c_grid is not None else "", t))
if not launches:
    sys.exit("no kernel rows")
# One training step: from the first embedding gather (a step's first kernel; parameter
# initialization comes before it) to the next launch of the same kernel.
names = [n for n, _, _ in launches]
begin = next((i for i, n in enumerate(names) if n.startswith("kiln_gather_rows") and n in names[i + 1:]), 0)
end = next((i for i in range(begin + 1, len(names)) if names[i] == names[begin]), len(names))
step = launches[begin:end]
total = sum(t for _, _, t in step)
print(f"{len(launches)} launches profiled; one step = launches {begin}-{end - 1} ({len(step)} kernels): "
      f"{total:.2f} ms of kernel time")
fam = collections.defaultdict(lambda: [0, 0.0])
for name, _, t in step:
    k = re.sub(r"_[0-9a-f]{16}$", "", name)
    fam[k][0] += 1
    fam[k][1] += t
print("by kind (launches, ms, share):")
for k, (n, t) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
    print(f"  {k:34s} {n:5d} {t:10.3f} ms {100 * t / total:5.1f}%")
per = collections.defaultdict(lambda: [0, 0.0])
for name, grid, t in step:
    per[(name, grid)][0] += 1
    per[(name, grid)][1] += t
print("top kernels (launches, ms, mean us, grid):")
for (name, grid), (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:20]:
    print(f"  {name:42s} {n:4d} {t:9.3f} ms {1000 * t / n:9.1f} us  {grid}")
PY

# ---- stage bookkeeping -----------------------------------------------------------------------
declare -A stage_status stage_time
stage=""; log=""; stage_end=0
failures=()
skipped=""  # set by a stage that cannot run here (a tool missing): its status says why

# run LABEL SECS CMD...: CMD under `timeout`, for at most SECS seconds (less when the stage's or
# the run's time is running out). Its output goes to logs/STAGE-LABEL.out (the path is left in
# $out) and then into the stage's log. A nonzero exit is recorded as a failure of the stage; the
# caller goes on either way.
out=""
run() {
  local label=$1 secs=$2 left global rc t0
  shift 2
  out=$work/logs/$stage-$label.out
  : > "$out"
  left=$((stage_end - $(now)))
  global=$(($(time_left) - 5))
  [ "$left" -lt "$secs" ] && secs=$left
  [ "$global" -lt "$secs" ] && secs=$global
  if [ "$secs" -lt 5 ]; then
    echo "### $label: skipped, no time left" >> "$log"
    failures+=("$label: skipped (no time left)")
    return 124
  fi
  echo "   $(date +%T) $label (limit ${secs}s)"
  printf '\n### %s  %s: $ %s   (limit %ss)\n' "$(date +%T)" "$label" "$*" "$secs" >> "$log"
  t0=$(now)
  timeout --kill-after=15 "$secs" "$@" > "$out" 2>&1 < /dev/null
  rc=$?
  cat "$out" >> "$log"
  printf '### %s: exit %s after %ss\n' "$label" "$rc" "$(($(now) - t0))" >> "$log"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then failures+=("$label: timed out after ${secs}s")
  elif [ "$rc" -ne 0 ]; then failures+=("$label: exit $rc"); fi
  return "$rc"
}

note() { echo "$*" >> "$work/keys/$stage.txt"; echo "### note: $*" >> "$log"; }
# key PATTERN [FILE [N]]: the first N (40) lines of the stage's log (or FILE) that match PATTERN
# go to the stage's part of the summary.
key() { grep -E -- "$1" "${2:-$log}" | cut -c1-300 | head -n "${3:-40}" >> "$work/keys/$stage.txt"; }

run_stage() {
  stage=$1
  log=$work/logs/$stage.log
  : > "$log"
  : > "$work/keys/$stage.txt"
  failures=()
  skipped=""
  local budget=${limit[$stage]} left t0
  left=$(($(time_left) - 5))
  if [ "$left" -lt 30 ]; then
    stage_status[$stage]="skipped (deadline)"; stage_time[$stage]=0
    echo "### skipped: the deadline leaves ${left}s" >> "$log"
    return
  fi
  [ "$left" -lt "$budget" ] && budget=$left
  stage_end=$(($(now) + budget))
  t0=$(now)
  echo "== $(date +%T) stage $stage (limit ${budget}s)"
  "stage_$stage"
  stage_time[$stage]=$(($(now) - t0))
  if [ ${#failures[@]} -eq 0 ] && [ -n "$skipped" ]; then stage_status[$stage]="skipped: $skipped"
  elif [ ${#failures[@]} -eq 0 ]; then stage_status[$stage]="ok"
  else
    local IFS=';'
    stage_status[$stage]="FAILED: ${failures[*]}"
  fi
  echo "   ${stage_status[$stage]} (${stage_time[$stage]}s)"
}

# ---- the stages ------------------------------------------------------------------------------
stage_smi() {
  local smi cs ncu nvcc
  if smi=$(find_tool nvidia-smi /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi); then
    run nvidia-smi 30 "$smi"
    key 'Driver Version|CUDA Version' "$out" 2
    run nvidia-smi-query 20 "$smi" --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,compute_cap --format=csv
    key '.' "$out" 4
  else
    failures+=("nvidia-smi not found")
  fi
  if nvcc=$(find_tool nvcc /usr/local/cuda/bin/nvcc); then
    run nvcc 20 "$nvcc" --version
    key 'release' "$out" 1
  fi
  if cs=$(find_tool compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer); then
    note "compute-sanitizer: $cs"
  else
    note "compute-sanitizer: not found"
  fi
  if ncu=$(find_tool ncu /usr/local/cuda/bin/ncu '/opt/nvidia/nsight-compute/*/ncu'); then note "ncu: $ncu"; else note "ncu: not found"; fi
  run python-torch 90 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
  key '^torch ' "$out" 1
  run python-h5py 30 python3 -c 'import h5py, numpy; print("h5py", h5py.__version__, "numpy", numpy.__version__)'
  key '^h5py ' "$out" 1
  note "bundle: $bundle"
  if [ -x "$bin/kiln" ] && [ -x "$bin/kiln_tests" ]; then
    if [ -x "$bundle/run" ]; then
      run ldd 20 "$bundle/run" ldd "$bin/kiln" "$bin/kiln_tests"
      if grep -q 'not found' "$out"; then failures+=("the bundle lacks libraries"); key 'not found' "$out" 10; fi
    fi
  else
    failures+=("no bin/kiln or bin/kiln_tests in $bundle (build the bundle first: see --help)")
  fi
  note "corpus: $corpus"
}

# kiln_tests finds the PyTorch reference data through KILN_REFERENCE_DIR: the carried copy, or
# the shared/ folder beside the checkout.
reference_env=()
prepare_reference() {
  local src
  for src in "${KILN_CHECK_REFERENCE:-}" "$bundle/reference" "$PWD/shared/reference" "$PWD/../shared/reference"; do
    if [ -n "$src" ] && [ -f "$src/gpt_tiny_reference.h5" ]; then
      reference_env=(KILN_REFERENCE_DIR="$(cd "$src" && pwd)" KILN_REQUIRE_REFERENCE=1)
      note "reference: $src (GpuGpt.ReferenceForwardBackward runs against it)"
      return
    fi
  done
  note "reference: none found: GpuGpt.ReferenceForwardBackward is SKIPPED (carry it in BUNDLE/reference)"
}

gtest_counts() {  # the totals of a gtest run's output
  grep -E '^\[==========\] [0-9]+ tests? .*ran|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]+|^\[  FAILED  \]|FAILED TESTS?' "$1" |
    grep -v -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' | head -n 40
}

stage_tests() {
  prepare_reference
  # The tests that need a real device: every lowering case, the runtime with real cubins, GPT
  # steps against PyTorch and the CPU, graph replay against launch by launch.
  # KILN_REQUIRE_GPU=1: a GPU-tier test that finds no GPU fails instead of skipping.
  run gpu-tier 360 env KILN_REQUIRE_GPU=1 ${reference_env[@]+"${reference_env[@]}"} "${tests[@]}" \
    --gtest_filter='*GpuMatchesEigen/*:Lowering.Gpu*:Mma.Gpu*:GpuRuntime.*:GpuGpt.*:GpuGraphReplay.*' \
    --gtest_output="xml:$work/logs/gpu-tier.xml"
  grep -q -E '^\[  PASSED  \] [1-9]' "$out" || failures+=("gpu-tier: no test passed (no usable GPU?)")
  {
    echo "GPU tier:"
    gtest_counts "$out"
    grep -E '^\[  SKIPPED \] [A-Za-z]' "$out" | head -n 20
  } >> "$work/keys/tests.txt"
  # Kernels whose last block combines the other blocks' partials: a missing barrier or fence
  # shows up as an occasional wrong sum, so each runs 30 times.
  run last-block-repeat 150 env KILN_REQUIRE_GPU=1 "${tests[@]}" \
    --gtest_filter='*GpuMatchesEigen/column_sums*:*GpuMatchesEigen/reduce_all*:*GpuMatchesEigen/multi_tensor_sum:*GpuMatchesEigen/multi_tensor_total:*GpuMatchesEigen/scatter_add_rows*' \
    --gtest_repeat=30
  local passed
  passed=$(grep -c '^\[       OK \]' "$out")
  note "last-block kernels repeated 30 times: $passed runs passed, $(grep -c -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$out") failed"
  [ "$passed" -gt 0 ] || failures+=("last-block-repeat: no test passed")
}

stage_train() {
  local common=(--device cuda --data "$corpus")
  run train 240 "${kiln[@]}" train "${common[@]}" --steps 300 --eval-every 100 --stats \
    --out "$work/train/model.h5" --checkpoint "$work/train/ckpt.h5" --ckpt-every 150
  key 'CUDA device|step +[0-9]+/[0-9]+ +loss|validation loss|rror' "$out" 20
  key 'stats:' "$out" 3
  run resume 120 "${kiln[@]}" train "${common[@]}" --resume "$work/train/ckpt.h5" --steps 320 \
    --eval-every 320 --out "$work/train/resumed.h5"
  echo "resumed from the checkpoint at step 300:" >> "$work/keys/train.txt"
  key 'step +[0-9]+/[0-9]+ +loss|validation loss|rror' "$out" 6
}

# The output of compare_weights.py in $out, into the summary under a heading.
comparison() { { echo "$1"; grep -E '^(  |[0-9]+ datasets|RESULT)' "$out"; } >> "$work/keys/$stage.txt"; }

stage_agree() {
  # 16 x 256 = 4096 rows per step: the layer norms' parameter gradients split across 128 blocks.
  local cfg=(--layers 2 --heads 6 --embd 384 --block 256 --batch 16 --seed 5 --warmup 10
             --eval-every 20 --data "$corpus")
  local d=$work/agree label
  run det-a 150 "${kiln[@]}" train --device cuda --deterministic --steps 60 "${cfg[@]}" --out "$d/det-a.h5"
  run det-b 150 "${kiln[@]}" train --device cuda --deterministic --steps 60 "${cfg[@]}" --out "$d/det-b.h5"
  run det-nographs 150 "${kiln[@]}" train --device cuda --deterministic --no-cuda-graphs --steps 60 \
    "${cfg[@]}" --out "$d/det-c.h5"
  run gpu-20 120 "${kiln[@]}" train --device cuda --steps 20 "${cfg[@]}" --out "$d/gpu.h5"
  run cpu-20 300 "${kiln[@]}" train --device cpu --steps 20 "${cfg[@]}" --out "$d/cpu.h5"
  echo "validation losses and speed per run:" >> "$work/keys/agree.txt"
  for label in det-a det-b det-nographs gpu-20 cpu-20; do
    grep -E 'validation loss|ms/step' "$work/logs/agree-$label.out" 2>/dev/null | tail -n 4 | sed "s/^/  $label: /" |
      cut -c1-200 >> "$work/keys/agree.txt"
  done
  run repeat-exact 60 python3 "$work/compare_weights.py" exact "$d/det-a.h5" "$d/det-b.h5"
  comparison "deterministic GPU run against itself (must be identical):"
  run graphs-exact 60 python3 "$work/compare_weights.py" exact "$d/det-a.h5" "$d/det-c.h5"
  comparison "deterministic GPU run, CUDA graphs against launch by launch (must be identical):"
  run gpu-vs-cpu 60 python3 "$work/compare_weights.py" close "$d/gpu.h5" "$d/cpu.h5"
  comparison "20 steps, GPU against CPU, weights (for information):"
  # The losses decide: f32 rounding moves them by far less than 1e-3 in 20 steps.
  local g c
  g=$(sed -n 's/.*final validation loss \([0-9.]*\).*/\1/p' "$work/logs/agree-gpu-20.out" | tail -n 1)
  c=$(sed -n 's/.*final validation loss \([0-9.]*\).*/\1/p' "$work/logs/agree-cpu-20.out" | tail -n 1)
  if [ -n "$g" ] && [ -n "$c" ]; then
    awk -v g="$g" -v c="$c" 'BEGIN { d = (g - c) / c; if (d < 0) d = -d
      printf "20 steps, GPU against CPU, final validation loss: %s against %s, relative difference %.2e: %s\n",
             g, c, d, d < 1e-3 ? "agree" : "DISAGREE (expected below 1e-3)"; exit d < 1e-3 ? 0 : 1 }' \
      >> "$work/keys/agree.txt" || failures+=("GPU and CPU validation losses disagree")
  fi
}

# libnccl.so.2 for kiln's loader: the loader's path, the CUDA toolkit's lib folder, or the copy
# that PyTorch's wheels install (nvidia/nccl/lib); empty when none is found.
find_nccl() {
  local p
  ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 ' && { echo libnccl.so.2; return; }
  for p in /usr/local/cuda/lib/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
    [ -e "$p" ] && { echo "$p"; return; }
  done
  python3 - 2>/dev/null <<'PY'
import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for p in glob.glob(d + "/nvidia/nccl/lib/libnccl.so.2"):
        print(p); sys.exit()
PY
}

stage_nccl() {
  [ -n "${KILN_NCCL_LIBRARY:-}" ] || KILN_NCCL_LIBRARY=$(find_nccl)
  if [ -z "$KILN_NCCL_LIBRARY" ]; then skipped="no libnccl.so.2 found"; return; fi
  export KILN_NCCL_LIBRARY
  note "libnccl: $KILN_NCCL_LIBRARY"
  run nccl-tests 120 env KILN_REQUIRE_GPU=1 "${tests[@]}" --gtest_filter='NcclLoading.*:GpuCollective.*'
  gtest_counts "$out" >> "$work/keys/nccl.txt"
  grep -q -E '^\[  PASSED  \] [1-9]' "$out" || failures+=("nccl-tests: no test passed")
  grep -q -E '^\[  SKIPPED \] GpuCollective' "$out" && failures+=("nccl-tests: GpuCollective skipped")
  local d=$work/nccl
  mkdir -p "$d"
  run nccl-plain 120 "${kiln[@]}" train --device cuda --deterministic --steps 40 --data "$corpus" --out "$d/plain.h5"
  run nccl-train 120 "${kiln[@]}" train --device cuda --deterministic --collectives nccl --steps 40 \
    --data "$corpus" --out "$d/nccl.h5"
  key 'data parallel|step +40/40 +loss|rror' "$out" 6
  # The reported losses too: the averaged loss is the bucket's last element.
  local lp ln
  lp=$(grep -oE 'step +40/40 +loss [-0-9.]+' "$work/logs/nccl-nccl-plain.out" | tail -n 1 | awk '{print $NF}')
  ln=$(grep -oE 'step +40/40 +loss [-0-9.]+' "$work/logs/nccl-nccl-train.out" | tail -n 1 | awk '{print $NF}')
  note "step 40 loss: $lp without a collective, $ln with NCCL"
  [ -n "$lp" ] && [ "$lp" = "$ln" ] || failures+=("nccl-train: step 40 loss $ln, without NCCL $lp")
  run nccl-exact 60 python3 "$work/compare_weights.py" exact "$d/plain.h5" "$d/nccl.h5"
  comparison "40 deterministic steps, NCCL over one rank in the step graphs against none (must be identical):"
  run nccl-bench 120 "${kiln[@]}" bench --device cuda --collectives nccl --steps 20
  key '^config|^step \(|rror' "$out"
}

stage_bench() {
  run bench 120 "${kiln[@]}" bench --device cuda --steps 20
  key '^config|^step \(|^matmul FLOPs|rror' "$out"
  run bench-no-graphs 120 "${kiln[@]}" bench --device cuda --no-cuda-graphs --steps 20
  echo "--no-cuda-graphs (kernel by kernel):" >> "$work/keys/bench.txt"
  key '^step \(|rror' "$out"
}

# nvidia-smi samples in the background while a stage's main command runs.
sampler_pid=""
sampler_start() {
  local smi
  smi=$(find_tool nvidia-smi /usr/local/nvidia/bin/nvidia-smi) || return 0
  "$smi" --query-gpu=timestamp,memory.used,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv -lms 500 > "$1" 2>&1 &
  sampler_pid=$!
}
sampler_stop() {
  if [ -n "$sampler_pid" ]; then
    kill "$sampler_pid" 2>/dev/null
    wait "$sampler_pid" 2>/dev/null
  fi
  sampler_pid=""
  [ -f "$1" ] || return 0
  awk -F', *' 'NR > 1 && $2 ~ /MiB/ { m = $2 + 0; if (m > mem) mem = m; c = $4 + 0; if (c > clk) clk = c
       p = $6 + 0; if (p > pw) pw = p }
       END { printf "nvidia-smi while it ran: peak memory used %d MiB, highest SM clock %d MHz, highest power %.0f W\n",
             mem, clk, pw }' "$1" >> "$work/keys/$stage.txt"
}

stage_gpt2() {
  sampler_start "$work/logs/gpt2-nvidia-smi.csv"
  run gpt2 480 "${kiln[@]}" bench --device cuda "${gpt2_flags[@]}" --steps 5
  sampler_stop "$work/logs/gpt2-nvidia-smi.csv"
  key '^config|^step \(|^matmul FLOPs|rror' "$out"
}

stage_tune() {
  local cache=$work/tune-cache precision
  for precision in bf16 f32; do
    run "tune-$precision" 260 env KILN_CACHE_DIR="$cache" "${kiln[@]}" tune --device cuda "${gpt2_flags[@]}" \
      --precision "$precision" --budget 200
    key '^matmul kernels per step|^[0-9]+ kernels in|dropped|^choices written|rror' "$out"
  done
  if cp "$cache"/tuning/*.json "$results"/ 2>/dev/null; then
    note "tuning file: $(cd "$results" && ls ./*.json)"
  else
    failures+=("no tuning file written")
  fi
}

stage_torch() {
  local py=scripts/bench_torch_gpt.py
  [ -f "$py" ] || py=$bundle/bench_torch_gpt.py
  if [ ! -f "$py" ]; then failures+=("scripts/bench_torch_gpt.py not found (run from the repository root)"); return; fi
  run torch-default 240 env PYTHONUNBUFFERED=1 python3 "$py" --steps 20
  key '^config|^step \(|torch.compile needs|Error' "$out"
  sampler_start "$work/logs/torch-gpt2-nvidia-smi.csv"
  run torch-gpt2 480 env PYTHONUNBUFFERED=1 python3 "$py" "${gpt2_flags[@]}" --steps 10
  sampler_stop "$work/logs/torch-gpt2-nvidia-smi.csv"
  key '^config|^step \(|torch.compile needs|Error' "$out"
  run torch-gpt2-tf32 180 env PYTHONUNBUFFERED=1 python3 "$py" "${gpt2_flags[@]}" --steps 10 --no-compile --tf32
  key '^config|^step \(|Error' "$out"
}

stage_sanitizer() {
  local cs tool
  if ! cs=$(find_tool compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer); then
    skipped="compute-sanitizer not found"
    return
  fi
  local opts=(--target-processes all --error-exitcode 99 --print-limit 20)
  local report='ERROR SUMMARY|RACECHECK SUMMARY|^========= +(Invalid|Race|Barrier|Uninitialized|Program hit|Error)|^\[  (PASSED|FAILED)'
  # A tiny GPT through kiln bench: 3 recorded, 1 timed, 3 traced and 1 timed steps, CUDA graphs
  # included, no sampling. B x T = 4 x 32 = 128 rows, so the layer norms' column sums take the
  # split path, whose last block combines the other blocks' partials.
  local tiny=(bench --device cuda --layers 1 --heads 2 --embd 32 --block 32 --batch 4 --vocab-size 65 --steps 1)
  # The lowering cases of the kernels that use shared memory or barriers.
  local smem_cases='*GpuMatchesEigen/*matmul*:*GpuMatchesEigen/reduce*:*GpuMatchesEigen/column_sums*:*GpuMatchesEigen/multi_tensor*:*GpuMatchesEigen/attention*'
  run memcheck-lowering 300 "$cs" --tool memcheck "${opts[@]}" "${tests[@]}" --gtest_filter='*GpuMatchesEigen/*'
  key "$report" "$out" 12
  run memcheck-gpt 180 "$cs" --tool memcheck "${opts[@]}" "${kiln[@]}" "${tiny[@]}"
  key "$report" "$out" 12
  for tool in racecheck synccheck; do
    run "$tool-lowering" 240 "$cs" --tool "$tool" "${opts[@]}" "${tests[@]}" --gtest_filter="$smem_cases"
    key "$report" "$out" 12
  done
  run initcheck-gpt 180 "$cs" --tool initcheck "${opts[@]}" "${kiln[@]}" "${tiny[@]}"
  key "$report" "$out" 12
}

stage_profile() {
  local ncu rep=$work/gpt2-kernels
  if ! ncu=$(find_tool ncu /usr/local/cuda/bin/ncu '/opt/nvidia/nsight-compute/*/ncu'); then
    skipped="ncu not found"
    return
  fi
  # One metric needs one pass: no replay, so the 23 GB workspace is never saved and restored.
  run ncu-gpt2-times 330 "$ncu" --target-processes all --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --kernel-name regex:kiln_ --launch-count 900 \
    --export "$rep" --force-overwrite "${kiln[@]}" bench --device cuda "${gpt2_flags[@]}" --steps 1
  if [ -f "$rep.ncu-rep" ]; then
    "$ncu" --import "$rep.ncu-rep" --csv --page raw --print-units base > "$work/logs/gpt2-kernels.csv" 2>> "$log"
    run kernel-table 60 python3 "$work/kernel_times.py" "$work/logs/gpt2-kernels.csv"
    echo "GPT-2 small, one training step under ncu (kernels serialized, clocks not locked):" >> "$work/keys/profile.txt"
    head -n 45 "$out" >> "$work/keys/profile.txt"
    rm -f "$rep.ncu-rep"
  fi
  # The first matmul kernels of the default config: throughput, occupancy, shared-memory
  # wavefronts and bank conflicts (the operand tiles' stores).
  run ncu-matmul 240 "$ncu" --target-processes all --clock-control none \
    --kernel-name regex:'kiln_(fused_)?matmul' --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis_Tables --section LaunchStats \
    "${kiln[@]}" bench --device cuda --no-cuda-graphs --steps 1
  echo "matmul kernels of the default config under ncu:" >> "$work/keys/profile.txt"
  key 'kiln_(fused_)?matmul|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Shared (Load|Store)|[Bb]ank' "$out" 80
}

# ---- results ---------------------------------------------------------------------------------
write_results() {
  local s f lines summary=$results/summary.txt
  {
    echo "kiln GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname 2>/dev/null), $(($(now) - start_time))s so far"
    echo "bundle $bundle; results $results"
    echo
    printf '%-10s %6s  %s\n' stage time status
    for s in "${stages[@]}"; do
      printf '%-10s %6s  %s\n' "$s" "${stage_time[$s]:-}${stage_time[$s]:+s}" "${stage_status[$s]:-not run yet}"
    done
    for s in "${stages[@]}"; do
      f=$work/keys/$s.txt
      [ -s "$f" ] || continue
      echo
      echo "== $s"
      cat "$f"
    done
  } > "$summary"
  {
    for s in "${stages[@]}"; do
      f=$work/logs/$s.log
      [ -f "$f" ] || continue
      lines=$(wc -l < "$f")
      echo "==================== $s ($lines lines) ===================="
      if [ "$lines" -gt 400 ]; then
        head -n 100 "$f"
        echo "... ($((lines - 400)) lines left out: logs.tar.gz has them) ..."
        tail -n 300 "$f"
      else
        cat "$f"
      fi
    done
  } > "$results/logs.txt"
  tar -C "$work" --exclude='*.out' -czf "$results/logs.tar.gz" logs keys 2>/dev/null
  if [ "$(stat -c %s "$results/logs.tar.gz" 2>/dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ]; then
    rm -f "$results/logs.tar.gz"
    echo "(logs.tar.gz left out: over 15 MiB)" >> "$summary"
  fi
}

# ---- main ------------------------------------------------------------------------------------
if [ -n "$data" ]; then corpus=$data
elif [ -d /usr/share/games/fortunes ]; then corpus=/usr/share/games/fortunes
elif [ -e "$bundle/data" ]; then corpus=$bundle/data
else
  # A corpus of the repository's own text (about a megabyte of characters).
  corpus=$work/corpus.txt
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z -- '*.md' '*.cpp' '*.hpp' '*.py' '*.sh' '*.txt' | xargs -0 cat > "$corpus" 2>/dev/null
  else
    find . -path ./gpu-bundle -prune -o -path ./build -prune -o -type f \
      \( -name '*.md' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.py' \) -print0 | xargs -0 cat > "$corpus" 2>/dev/null
  fi
  [ -s "$corpus" ] || printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 20000) > "$corpus"
fi

echo "kiln GPU check: stages ${stages[*]}; bundle $bundle; results in $results"
for s in "${stages[@]}"; do
  run_stage "$s"
  write_results
done
smi=$(find_tool nvidia-smi /usr/local/nvidia/bin/nvidia-smi) &&
  { echo; echo "GPU state at the end:"; "$smi" --query-gpu=name,memory.used,utilization.gpu,temperature.gpu,clocks_throttle_reasons.active --format=csv 2>&1; } >> "$results/summary.txt"
echo
cat "$results/summary.txt"
rm -rf "$work"

status=0
for s in "${stages[@]}"; do
  case ${stage_status[$s]:-} in ok | skipped*) ;; *) status=1 ;; esac
done
exit "$status"
