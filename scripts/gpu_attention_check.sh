#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says
# (gpu-bundle/ with bin/kiln, bin/kiln_tests, reference/ and data/): checks and times the
# tensor-core attention kernels (cuda/lower/attention_mma.cpp) in one sitting:
#   1. the GPU tier's attention cases, the mma known answers and the GPT steps (bf16 included);
#   2. compute-sanitizer racecheck and memcheck over the mma attention cases;
#   3. causal attention forward + backward alone, bf16 operands, the mma kernels against the FFMA
#      ones (KILN_ATTENTION_MMA=0), beside PyTorch's scaled_dot_product_attention in bf16;
#   4. GPT-2 small's bf16 training step, mma attention against FFMA attention (alternated);
#   5. the default config trained 300 steps in bf16 with either attention (final validation loss).
# Results go to $OUT/attention-check.log (default ./attention-check.log); the end of the output is
# the table to copy into docs/BENCHMARKS.md.
set -uo pipefail
bundle=${1:-gpu-bundle}
run="$bundle/run"
kiln=("$run" "$bundle/bin/kiln")
tests=("$run" "$bundle/bin/kiln_tests")
log=${OUT:-.}/attention-check.log
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
att=8x12x1024x64,16x4x64x32
cs=/usr/local/cuda/bin/compute-sanitizer
{
  echo "== tests"
  KILN_REQUIRE_GPU=1 KILN_REFERENCE_DIR="$bundle/reference" KILN_REQUIRE_REFERENCE=1 timeout 150 "${tests[@]}" \
    --gtest_filter='*GpuMatchesEigen/*attention*:Mma.Gpu*:GpuGpt.*' 2>&1 | grep -E '^\[  (FAILED|PASSED)|Failure|rror' | head -n 20
  echo "== sanitizers (mma attention cases)"
  for tool in racecheck memcheck; do
    KILN_REQUIRE_GPU=1 timeout 90 "$cs" --tool "$tool" "${tests[@]}" --gtest_filter='*GpuMatchesEigen/*attention*mma*' 2>&1 \
      | grep -E 'SUMMARY|^\[  (FAILED|PASSED)' | head -n 4
  done
  echo "== attention alone, bf16 products"
  for mma in 1 0; do
    echo "-- KILN_ATTENTION_MMA=$mma"
    KILN_ATTENTION_MMA=$mma timeout 60 "${kiln[@]}" bench --device cuda --precision bf16 --attention "$att" --steps 20 2>&1 \
      | grep -E '^attention|rror'
  done
  timeout 60 python3 scripts/bench_torch_attention.py "$att" --bf16 2>&1 | grep -E 'attention|rror'
  echo "== GPT-2 small, bf16 step"
  for mma in 1 0 1 0; do
    echo "-- KILN_ATTENTION_MMA=$mma"
    KILN_ATTENTION_MMA=$mma timeout 60 "${kiln[@]}" bench --device cuda --precision bf16 "${gpt2[@]}" --steps 10 2>&1 \
      | grep -E 'step \(traced|rror'
  done
  echo "== default config, 300 bf16 steps"
  for mma in 1 0; do
    echo "-- KILN_ATTENTION_MMA=$mma"
    KILN_ATTENTION_MMA=$mma timeout 60 "${kiln[@]}" train --device cuda --precision bf16 --steps 300 \
      --data "$bundle/data" --out "/tmp/attention-check-$mma.h5" 2>&1 | grep -E 'final validation|rror'
  done
} 2>&1 | tee "$log"
