#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says:
# one sitting's A/B of kiln settings given as environment variables, on the same card:
#   OUT=$OUT bash scripts/gpu_env_ab.sh [gpu-bundle] SETTING [SETTING ...]
# A SETTING is "default" (nothing set) or VAR=VALUE[,VAR=VALUE...], e.g.
#   bash scripts/gpu_env_ab.sh gpu-bundle default KILN_MMA_STAGED_STORES=0 KILN_MMA_STAGED_STORES=all
#   1. the GPU tier's tests named by KILN_AB_TESTS (default: the wgmma matmul cases), once per
#      setting;
#   2. GPT-2 small's bf16 step, two turns with the settings alternated (medians of 10 traced
#      steps), and with KILN_AB_F32=1 its f32 step once (medians of 5);
#   3. `kiln bench --gemm` (host-timed, medians of 20) per setting, for each DTYPE:SHAPES in
#      KILN_AB_GEMMS.
# About 40 s a setting on an H100 (not yet run on one). Everything is also written to $OUT/env-ab.log.
set -uo pipefail
bundle=gpu-bundle
if [ $# -gt 0 ] && [ -d "$1" ]; then
  bundle=$1
  shift
fi
[ $# -gt 0 ] || { echo "usage: gpu_env_ab.sh [BUNDLE] SETTING [SETTING ...]"; exit 2; }
run="$bundle/run"
log=${OUT:-.}/env-ab.log
tests=${KILN_AB_TESTS:-Lowering.GpuMatmulsOnWgmma*:Lowering.GpuWgmmaStoresOddRowsThroughSharedMemory:TensorCopy.Gpu*}
gemms=${KILN_AB_GEMMS:-bf16:8192x50257x768,8192x2304x768,8192x768x3072,8192x3072x768,4096 f32:8192x50257x768,4096}
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
with_setting() {  # SETTING, then a command
  local setting=$1
  shift
  if [ "$setting" = default ]; then
    "$@"
  else
    env ${setting//,/ } "$@"
  fi
}
{
  for s in "$@"; do
    echo "== tests, $s"
    with_setting "$s" env KILN_REQUIRE_GPU=1 timeout 200 "$run" "$bundle/bin/kiln_tests" --gtest_filter="$tests" 2>&1 |
      grep -E '^\[  (FAILED|PASSED)|Failure|rror' | head -n 10
  done
  echo "== GPT-2 small steps"
  for turn in 1 2; do
    for s in "$@"; do
      echo "-- bf16, $s"
      with_setting "$s" timeout 60 "$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 "${gpt2[@]}" \
        --steps 10 2>&1 | grep -E 'step \(traced|rror'
    done
  done
  if [ "${KILN_AB_F32:-0}" = 1 ]; then
    for s in "$@"; do
      echo "-- f32, $s"
      with_setting "$s" timeout 60 "$run" "$bundle/bin/kiln" bench --device cuda "${gpt2[@]}" --steps 5 2>&1 |
        grep -E 'step \(traced|rror'
    done
  fi
  for g in $gemms; do
    IFS=: read -r dtype shapes <<<"$g"
    for s in "$@"; do
      echo "== gemm $dtype, $s"
      with_setting "$s" timeout 90 "$run" "$bundle/bin/kiln" bench --device cuda --precision "$dtype" \
        --gemm "$shapes" --steps 20 2>&1 | grep -E '^gemm|rror'
    done
  done
} 2>&1 | tee "$log"
