#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says:
# why kiln's GEMM kernels stall, in Nsight Compute's words, beside cuBLAS's on the same shapes.
#   OUT=$OUT bash scripts/gpu_gemm_stalls.sh [gpu-bundle]
# For each case (KILN_STALL_CASES, default below: dtype:shape), one launch of kiln's product
# kernel (`kiln bench --gemm`, default tiling) and one of torch.matmul's, each under ncu with the
# sections that say where the time goes: SpeedOfLight and ComputeWorkloadAnalysis (the tensor or
# FMA pipe's share), Occupancy, SchedulerStats (issue slots), WarpStateStats (cycles a warp waits
# per instruction, by reason) and SourceCounters (the instructions the warps wait at most).
# The questions it answers (docs/BENCHMARKS.md, "SASS of the two matmul kernels"):
#  - bf16 wgmma: each k step of 64 runs `fence.proxy.async` (SASS: MEMBAR.ALL.CTA then
#    FENCE.VIEW.ASYNC.S) before its barrier. If the membar waits for the next step's copies still
#    in flight, the pipeline is one step deep whatever the stages: Stall Membar at the top of the
#    warp states, at the MEMBAR's line in SourceCounters.
#  - f32 FFMA: ptxas issues A's next-tile loads after about 660-680 of a k step's 1024 FFMAs (B,
#    stored [k][n], is copied by cp.async at the step's top); Stall Long Scoreboard at A's shared
#    stores would say that their latency is not hidden.
# About 1-2 minutes on an H100 (ncu replays each kernel once per section pass). Everything is
# written to $OUT/gemm-stalls.log (default ./gemm-stalls.log).
set -uo pipefail
bundle=${1:-gpu-bundle}
run="$bundle/run"
log=${OUT:-.}/gemm-stalls.log
cases=${KILN_STALL_CASES:-bf16:4096 bf16:8192x2304x768 f32:4096}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$ncu" ] || { echo "gpu_gemm_stalls: ncu not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"; exit 1; }
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section SchedulerStats
  --section WarpStateStats --section SourceCounters)
{
  for c in $cases; do
    IFS=: read -r dtype shape <<<"$c"
    echo "== kiln $dtype $shape (default tiling)"
    timeout 240 "$ncu" --target-processes all -k 'regex:kiln_(fused_)?matmul' --launch-skip 2 --launch-count 1 \
      "${sections[@]}" "$run" "$bundle/bin/kiln" bench --device cuda --precision "$dtype" --gemm "$shape" --steps 4 2>&1 |
      grep -vE '^==PROF==|^gemm'
    # The sections print the top stall reason only: every reason's cycles per issued instruction,
    # largest first (the 2026-11-28 sitting named LG throttle at 31% and could say no more).
    echo "-- kiln $dtype $shape: stall reasons, cycles a warp waits per issued instruction"
    timeout 120 "$ncu" --target-processes all -k 'regex:kiln_(fused_)?matmul' --launch-skip 2 --launch-count 1 \
      --metrics 'regex:^smsp__average_warps?_(latency_)?issue_stalled_.*' "$run" "$bundle/bin/kiln" bench \
      --device cuda --precision "$dtype" --gemm "$shape" --steps 4 2>&1 | grep issue_stalled |
      awk '{ print $NF, $1 }' | sort -g -r | head -n 12
    echo "== cuBLAS $dtype $shape (torch.matmul)"
    timeout 240 "$ncu" --target-processes all -k 'regex:gemm|nvjet|xmma|cutlass' \
      --launch-skip 2 --launch-count 1 "${sections[@]}" \
      python3 scripts/bench_torch_gemm.py "$shape" --dtypes "$dtype" --runs 3 2>&1 | grep -vE '^==PROF==|^(torch )?gemm'
  done
} 2>&1 | tee "$log"
