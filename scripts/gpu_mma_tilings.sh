#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says:
# one sitting that picks the bf16 mma matmul kernel's tiling (`--matmul` tile, stages and
# split-k) and its products' instruction (mma.sync, or sm_90a's wgmma: `--matmul wgmma=on|off`):
#   1. the GPU tier's wgmma known answers, its mma and wgmma matmul cases (bf16 and tf32, every
#      tiling against Eigen) and GPT steps;
#   2. kiln's GEMM alone at each tiling (bf16 operands, b stored [k][n]; and f32 operands on tf32
#      at two tilings), and cuBLAS bf16 and tf32 through PyTorch on the same shapes;
#   3. GPT-2 small's bf16 step at the tilings in KILN_STEP_TILINGS (two turns, alternated; medians
#      of 10 traced steps), once with the bf16 casts kept as kernels (--passes -absorb_casts), and
#      PyTorch eager with autocast bf16 once.
# A tiling is TILE:STAGES[:SPLIT[:wgmma]], passed to kiln as one option,
# `--matmul tile=TILE,stages=STAGES,split-k=SPLIT,wgmma=on|off`: TILE is 128x128, 128x256,
# 192x256 (wgmma: three warpgroups), auto (per product: 128x256 where its grid fills the SMs) or
# waves (per product: the tile of least time in whole waves, a 128x256 wave counted 1.6 of a
# 128x128 one, a 192x256 one 2.4); SPLIT is 0 (when left out), auto or 2-4; a trailing wgmma gives
# wgmma=on (3 or 4 stages), none wgmma=off. "default" passes no --matmul (on an H100: wgmma, auto
# tiles, 4 stages, split-K auto; `auto:4:0:wgmma` is the same without the split).
# KILN_GEMM_TILINGS, KILN_TF32_TILINGS ("" skips them) and KILN_STEP_TILINGS replace the lists,
# KILN_TILINGS_TESTS the tests' gtest filter.
# About 2-3 minutes on an H100 with the default lists (122 s on 2026-11-27 with one step tiling
# fewer; give the device call 300 s or more: each step has its own timeout, so a hang costs at
# most 90-200 s). Everything is also written to $OUT/mma-tilings.log (default ./mma-tilings.log).
# `kiln bench --gemm` is host-timed (launch to synchronize) and torch's CUDA events bracket one
# call: for kernel against kernel, scripts/gpu_gemm_kernels.py times both under ncu.
set -uo pipefail
bundle=${1:-gpu-bundle}
run="$bundle/run"
log=${OUT:-.}/mma-tilings.log
shapes=${KILN_GEMM_SHAPES:-1024,4096,8192x2304x768,8192x768x3072,768x3072x8192,768x768x8192,8192x50257x768,8192x3072x768}
gemm_tilings=${KILN_GEMM_TILINGS:-128x128:2 default auto:4:0:wgmma 128x128:4:0:wgmma 128x256:4:0:wgmma 192x256:4:0:wgmma waves:4:auto:wgmma}
tf32_tilings=${KILN_TF32_TILINGS-128x128:2 128x128:4}
step_tilings=${KILN_STEP_TILINGS:-128x128:2 default waves:4:auto:wgmma 192x256:4:0:wgmma}
tests=${KILN_TILINGS_TESTS:-Wgmma.Gpu*:Lowering.GpuMatmulsOnWgmmaMatchEigen:Lowering.GpuMatmulsOnMmaMatchEigen:GpuGpt.*}
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
tiling=()
tiling_options() {  # TILE:STAGES[:SPLIT[:wgmma]]: its --matmul option into tiling; default: none
  local tile stages split engine
  tiling=()
  [ "$1" = default ] && return
  IFS=: read -r tile stages split engine <<<"$1"
  tiling=(--matmul "tile=$tile,stages=$stages,split-k=${split:-0},wgmma=$([ "$engine" = wgmma ] && echo on || echo off)")
}
{
  echo "== tests"
  KILN_REQUIRE_GPU=1 KILN_REFERENCE_DIR="$bundle/reference" KILN_REQUIRE_REFERENCE=1 timeout 200 "$run" \
    "$bundle/bin/kiln_tests" --gtest_filter="$tests" 2>&1 |
    grep -E '^\[  (FAILED|PASSED)|Failure|rror' | head -n 20
  for t in $gemm_tilings; do
    echo "== kiln gemm bf16, $t"
    tiling_options "$t"
    timeout 90 "$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 ${tiling[@]+"${tiling[@]}"} \
      --gemm "$shapes" --steps 20 2>&1 | grep -E '^gemm|rror'
  done
  for t in $tf32_tilings; do
    echo "== kiln gemm tf32 (f32 operands, --tf32), $t"
    tiling_options "$t"
    timeout 90 "$run" "$bundle/bin/kiln" bench --device cuda --tf32 ${tiling[@]+"${tiling[@]}"} \
      --gemm "$shapes" --steps 20 2>&1 | grep -E '^gemm|rror'
  done
  echo "== torch gemm bf16, tf32"
  timeout 120 python3 scripts/bench_torch_gemm.py "$shapes" --dtypes bf16,tf32 2>&1 | grep -E 'gemm|rror'
  echo "== GPT-2 small bf16 step"
  for turn in 1 2; do
    for t in $step_tilings; do
      echo "-- $t"
      tiling_options "$t"
      timeout 90 "$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 "${gpt2[@]}" \
        ${tiling[@]+"${tiling[@]}"} --steps 10 2>&1 | grep -E 'step \(traced|rror'
    done
  done
  echo "-- 128x128:2 with the casts kept as kernels (--passes -absorb_casts)"
  tiling_options 128x128:2
  timeout 90 "$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 "${gpt2[@]}" "${tiling[@]}" \
    --passes -absorb_casts --steps 10 2>&1 | grep -E 'step \(traced|rror'
  echo "-- PyTorch eager, autocast bf16"
  timeout 120 python3 scripts/bench_torch_gpt.py "${gpt2[@]}" --steps 10 --no-compile --autocast-bf16 2>&1 |
    grep -E 'step|rror'
} 2>&1 | tee "$log"
