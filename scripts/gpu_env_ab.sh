#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says:
# one sitting's A/B of kiln settings given as `kiln bench` options, on the same card:
#   OUT=$OUT bash scripts/gpu_env_ab.sh [gpu-bundle] SETTING [SETTING ...]
# A SETTING is "default" (no option) or one quoted word of kiln options, appended to each
# `kiln bench` command line; several --matmul choices go in one --matmul, comma-separated (a
# second --matmul is not merged), e.g.
#   bash scripts/gpu_env_ab.sh gpu-bundle default "--matmul staged-stores=none" "--matmul staged-stores=all"
#   bash scripts/gpu_env_ab.sh gpu-bundle default "--matmul tile=128x256,stages=3,split-k=0" \
#     "--attention-path simt --passes -absorb_casts"
#   1. the GPU tier's tests named by KILN_AB_TESTS (default: the wgmma matmul cases), once: the
#      tests take no kiln options (each case sets the matmul choices it checks itself);
#   2. GPT-2 small's bf16 step, two turns with the settings alternated (medians of 10 traced
#      steps), and with KILN_AB_F32=1 its f32 step once (medians of 5);
#   3. `kiln bench --gemm` (host-timed, medians of 20) per setting, for each DTYPE:SHAPES in
#      KILN_AB_GEMMS.
# About 40 s a setting on an H100 (not yet run on one). Everything is also written to $OUT/env-ab.log.
# Settings in the old VAR=VALUE form are refused: kiln no longer reads those environment
# variables (docs/CLI.md maps each to its option).
set -uo pipefail
bundle=gpu-bundle
if [ $# -gt 0 ] && [ -d "$1" ]; then
  bundle=$1
  shift
fi
if [ $# -eq 0 ]; then
  echo "usage: gpu_env_ab.sh [BUNDLE] SETTING [SETTING ...]  (SETTING: default, or kiln options as one word," \
    "e.g. \"--matmul staged-stores=none\")"
  exit 2
fi
run="$bundle/run"
log=${OUT:-.}/env-ab.log
tests=${KILN_AB_TESTS:-Lowering.GpuMatmulsOnWgmma*:Lowering.GpuWgmmaStoresOddRowsThroughSharedMemory:TensorCopy.Gpu*}
gemms=${KILN_AB_GEMMS:-bf16:8192x50257x768,8192x2304x768,8192x768x3072,8192x3072x768,4096 f32:8192x50257x768,4096}
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
opts=()
setting_options() {  # SETTING: its kiln options into opts (none for default)
  opts=()
  [ "$1" = default ] || read -r -a opts <<<"$1"
}
for s in "$@"; do  # refuse the old VAR=VALUE settings, and options split from their values
  [ "$s" = default ] && continue
  setting_options "$s"
  for w in ${opts[@]+"${opts[@]}"}; do
    case $w in
      [A-Z]*=*)
        echo "gpu_env_ab.sh: setting '$s': $w is an environment variable, which kiln no longer reads;" \
          "give kiln options instead, e.g. \"--matmul staged-stores=none\" (docs/CLI.md)" >&2
        exit 2
        ;;
    esac
  done
  case ${opts[0]:-} in
    -*) ;;
    *)
      echo "gpu_env_ab.sh: setting '$s' is neither default nor kiln options; quote each setting" \
        "as one word, e.g. \"--matmul staged-stores=none\"" >&2
      exit 2
      ;;
  esac
done
{
  echo "== tests"
  KILN_REQUIRE_GPU=1 timeout 200 "$run" "$bundle/bin/kiln_tests" --gtest_filter="$tests" 2>&1 |
    grep -E '^\[  (FAILED|PASSED)|Failure|rror' | head -n 10
  echo "== GPT-2 small steps"
  for turn in 1 2; do
    for s in "$@"; do
      echo "-- bf16, $s"
      setting_options "$s"
      timeout 60 "$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 "${gpt2[@]}" --steps 10 \
        ${opts[@]+"${opts[@]}"} 2>&1 | grep -E 'step \(traced|rror'
    done
  done
  if [ "${KILN_AB_F32:-0}" = 1 ]; then
    for s in "$@"; do
      echo "-- f32, $s"
      setting_options "$s"
      timeout 60 "$run" "$bundle/bin/kiln" bench --device cuda "${gpt2[@]}" --steps 5 ${opts[@]+"${opts[@]}"} 2>&1 |
        grep -E 'step \(traced|rror'
    done
  fi
  for g in $gemms; do
    IFS=: read -r dtype shapes <<<"$g"
    for s in "$@"; do
      echo "== gemm $dtype, $s"
      setting_options "$s"
      timeout 90 "$run" "$bundle/bin/kiln" bench --device cuda --precision "$dtype" --gemm "$shapes" --steps 20 \
        ${opts[@]+"${opts[@]}"} 2>&1 | grep -E '^gemm|rror'
    done
  done
} 2>&1 | tee "$log"
