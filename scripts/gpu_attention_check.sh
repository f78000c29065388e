#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says
# (gpu-bundle/ with bin/kiln, bin/kiln_tests, reference/ and data/; optionally bin/kiln_base, an
# earlier build to time against): checks and times the tensor-core attention kernels
# (cuda/lower/attention_mma.cpp) and the column sums in one sitting:
#   1. the GPU tier (lowering cases, mma known answers, runtime, GPT steps, graph replay), and
#      the column-sums cases 30 times;
#   2. GPT-2 small's bf16 training step: mma attention against FFMA attention
#      (--attention-path simt), and against bin/kiln_base (no options), alternated;
#   3. causal attention forward + backward alone, bf16 operands, mma against FFMA, beside
#      PyTorch's scaled_dot_product_attention in bf16;
#   4. ncu: the kernel times of one bf16 GPT-2 step, grouped by kind;
#   5. compute-sanitizer racecheck and memcheck over the mma attention cases;
#   6. the default config trained 300 steps in bf16 with either attention (final validation loss).
# Everything is also written to $OUT/attention-check.log (default ./attention-check.log).
set -uo pipefail
bundle=${1:-gpu-bundle}
run="$bundle/run"
kiln=("$run" "$bundle/bin/kiln")
tests=("$run" "$bundle/bin/kiln_tests")
log=${OUT:-.}/attention-check.log
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
att=8x12x1024x64,16x4x64x32
cs=/usr/local/cuda/bin/compute-sanitizer
ncu=/usr/local/cuda/bin/ncu
step() {  # label, kiln or kiln_base, then options for its bench
  local label=$1 bin=$2
  shift 2
  echo "-- $label"
  timeout 60 "$run" "$bundle/bin/$bin" bench --device cuda --precision bf16 "${gpt2[@]}" --steps 10 "$@" 2>&1 |
    grep -E 'step \(traced|rror'
}
{
  echo "== tests"
  KILN_REQUIRE_GPU=1 KILN_REFERENCE_DIR="$bundle/reference" KILN_REQUIRE_REFERENCE=1 timeout 150 "${tests[@]}" \
    --gtest_filter='*GpuMatchesEigen/*:Lowering.Gpu*:Mma.Gpu*:GpuRuntime.*:GpuGpt.*:GpuGraphReplay.*' 2>&1 |
    grep -E '^\[  (FAILED|PASSED)|Failure|rror' | head -n 20
  echo "-- column sums (last blocks of each column tile), 30 times"
  KILN_REQUIRE_GPU=1 timeout 60 "${tests[@]}" --gtest_filter='*GpuMatchesEigen/column_sums*' --gtest_repeat=30 2>&1 |
    grep -cE '^\[  PASSED' | sed 's/$/ of 30 repeats passed/'
  echo "== GPT-2 small, bf16 step"
  for turn in 1 2; do
    step "mma attention (--attention-path mma)" kiln --attention-path mma
    step "FFMA attention (--attention-path simt)" kiln --attention-path simt
    [ -x "$bundle/bin/kiln_base" ] && step "kiln_base" kiln_base
  done
  echo "== attention alone, bf16 products"
  for path in mma simt; do
    echo "-- --attention-path $path"
    timeout 60 "${kiln[@]}" bench --device cuda --precision bf16 --attention "$att" --attention-path "$path" \
      --steps 20 2>&1 | grep -E '^attention|rror'
  done
  timeout 60 python3 scripts/bench_torch_attention.py "$att" --bf16 2>&1 | grep -E 'attention|rror'
  echo "== ncu, one bf16 GPT-2 step"
  sed -n "/^cat > \"\$work\/kernel_times.py\" <<'PY'/,/^PY\$/p" "$bundle/gpu-check.sh" | sed '1d;$d' >/tmp/kernel_times.py
  timeout 100 "$ncu" --target-processes all --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:kiln_ --launch-count 900 --export /tmp/bf16-step --force-overwrite \
    "${kiln[@]}" bench --device cuda --precision bf16 "${gpt2[@]}" --steps 1 >/tmp/ncu.log 2>&1
  "$ncu" --import /tmp/bf16-step.ncu-rep --csv --page raw --print-units base >/tmp/bf16-step.csv 2>/dev/null &&
    python3 /tmp/kernel_times.py /tmp/bf16-step.csv | head -n 40
  echo "== sanitizers (mma attention cases)"
  for tool in racecheck memcheck; do
    KILN_REQUIRE_GPU=1 timeout 90 "$cs" --tool "$tool" "${tests[@]}" --gtest_filter='*GpuMatchesEigen/*attention*mma*' 2>&1 |
      grep -E 'SUMMARY|^\[  (FAILED|PASSED)' | head -n 4
  done
  echo "== default config, 300 bf16 steps"
  for path in mma simt; do
    echo "-- --attention-path $path"
    timeout 60 "${kiln[@]}" train --device cuda --precision bf16 --attention-path "$path" --steps 300 \
      --data "$bundle/data" --out "/tmp/attention-check-$path.h5" 2>&1 | grep -E 'final validation|rror'
  done
} 2>&1 | tee "$log"
