#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says
# plus bin/kiln_base (an earlier build): one sitting's A/B of whole training steps, so that a
# change's effect is measured against its base on the same card:
#   1. the GPU tier (lowering cases, mma known answers, runtime, GPT steps, graph replay);
#   2. GPT-2 small's step in bf16 (two turns) and in f32 (one), and the default config's (two),
#      kiln and kiln_base alternated (medians of 10 traced steps each);
#   3. ncu: the kernel times of one bf16 GPT-2 step of kiln, grouped by kind.
# Everything is also written to $OUT/step-ab.log (default ./step-ab.log).
set -uo pipefail
bundle=${1:-gpu-bundle}
run="$bundle/run"
tests=("$run" "$bundle/bin/kiln_tests")
log=${OUT:-.}/step-ab.log
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
ncu=/usr/local/cuda/bin/ncu
step() {  # binary, then bench flags
  local bin=$1
  shift
  echo "-- $bin $*"
  timeout 60 "$run" "$bundle/bin/$bin" bench --device cuda "$@" --steps 10 2>&1 | grep -E 'step \(traced|rror'
}
{
  echo "== tests"
  KILN_REQUIRE_GPU=1 KILN_REFERENCE_DIR="$bundle/reference" KILN_REQUIRE_REFERENCE=1 timeout 150 "${tests[@]}" \
    --gtest_filter='*GpuMatchesEigen/*:Lowering.Gpu*:Mma.Gpu*:GpuRuntime.*:GpuGpt.*:GpuGraphReplay.*' 2>&1 |
    grep -E '^\[  (FAILED|PASSED)|Failure|rror' | head -n 20
  echo "== steps"
  for turn in 1 2; do
    for bin in kiln kiln_base; do step "$bin" --precision bf16 "${gpt2[@]}"; done
  done
  for bin in kiln kiln_base; do step "$bin" "${gpt2[@]}"; done
  for bin in kiln kiln_base kiln kiln_base; do step "$bin"; done
  echo "== ncu, one bf16 GPT-2 step"
  sed -n "/^cat > \"\$work\/kernel_times.py\" <<'PY'/,/^PY\$/p" "$bundle/gpu-check.sh" | sed '1d;$d' >/tmp/kernel_times.py
  timeout 100 "$ncu" --target-processes all --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:kiln_ --launch-count 900 --export /tmp/bf16-step --force-overwrite \
    "$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 "${gpt2[@]}" --steps 1 >/tmp/ncu.log 2>&1
  "$ncu" --import /tmp/bf16-step.ncu-rep --csv --page raw --print-units base >/tmp/bf16-step.csv 2>/dev/null &&
    python3 /tmp/kernel_times.py /tmp/bf16-step.csv | head -n 40
} 2>&1 | tee "$log"
