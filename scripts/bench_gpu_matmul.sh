#!/usr/bin/env bash
# On a GPU machine, from the repository root, with a bundle made as gpu-check.sh's header says
# (gpu-bundle/ with bin/kiln, bin/kiln_tests and reference/): checks kiln's matmul kernels on the
# device (both tilings against Eigen, the GPT steps against PyTorch), then times them beside
# cuBLAS through PyTorch on the same shapes, and a GPT-2-small step beside PyTorch eager, in one
# sitting; f32, tf32 (--tf32) and bf16 (--precision bf16, against autocast; and with
# --matmul bf16-mma=off, bf16 widened in f32 tiles). Prints
# the lines to copy into docs/BENCHMARKS.md, and causal attention forward + backward (kiln fused
# and unfused, PyTorch's scaled_dot_product_attention and the written-out chain).
# KILN_GEMM_TILES picks the f32 tilings timed (default: auto 64 128; auto is kiln's choice, 64 and
# 128 are given as --matmul simt-tile=N); KILN_ATTENTION_SHAPES the attention shapes (BxHxTxD;
# default GPT-2 small's and the default config's; unfused: --passes -fuse_attention).
set -uo pipefail
bundle=${1:-gpu-bundle}
run="$bundle/run"
shapes=${KILN_GEMM_SHAPES:-1024,4096,8192x2304x768,8192x768x3072,768x3072x8192,8192x50257x768}
gpt2=(--layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
echo "== tests"
KILN_REQUIRE_GPU=1 KILN_REFERENCE_DIR="$bundle/reference" KILN_REQUIRE_REFERENCE=1 "$run" "$bundle/bin/kiln_tests" \
  --gtest_filter='*GpuMatchesEigen/*attention*:*GpuMatchesEigen/*matmul*:*GpuMatchesEigen/*bf16*:Lowering.Gpu*:Mma.Gpu*:GpuGpt.*:GpuGraphReplay.*' \
  2>&1 | grep -E '^\[  (FAILED|PASSED)|Failure' | head -n 20
for tile in ${KILN_GEMM_TILES:-auto 64 128}; do
  echo "== kiln gemm, tiles: $tile"
  tile_opts=()
  [ "$tile" = auto ] || tile_opts=(--matmul "simt-tile=$tile")
  "$run" "$bundle/bin/kiln" bench --device cuda ${tile_opts[@]+"${tile_opts[@]}"} \
    --gemm "$shapes" --steps 20 2>&1 | grep -E '^gemm|rror'
done
echo "== kiln gemm, --tf32"
"$run" "$bundle/bin/kiln" bench --device cuda --tf32 --gemm "$shapes" --steps 20 2>&1 | grep -E '^gemm|rror'
echo "== kiln gemm, --precision bf16 (the bf16 tensor-core kernel: wgmma on an H100/H200, mma.sync elsewhere)"
"$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 --gemm "$shapes" --steps 20 2>&1 | grep -E '^gemm|rror'
echo "== kiln gemm, --precision bf16, --matmul bf16-mma=off (bf16 widened in f32 tiles)"
"$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 --matmul bf16-mma=off --gemm "$shapes" --steps 20 2>&1 |
  grep -E '^gemm|rror'
echo "== torch gemm"
python3 scripts/bench_torch_gemm.py "$shapes" --dtypes f32,tf32,bf16 2>&1 | grep -E 'gemm|rror'
echo "== GPT-2 small step"
for tf32 in "" --tf32; do
  echo "-- kiln, ${tf32:-f32 (TF32 off)}"
  "$run" "$bundle/bin/kiln" bench --device cuda "${gpt2[@]}" ${tf32:+"$tf32"} --steps 10 2>&1 \
    | grep -E 'step \(traced|FLOPs|rror'
done
echo "-- kiln, --precision bf16"
"$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 "${gpt2[@]}" --steps 10 2>&1 \
  | grep -E 'step \(traced|FLOPs|rror'
echo "-- kiln, --precision bf16, --matmul bf16-mma=off"
"$run" "$bundle/bin/kiln" bench --device cuda --precision bf16 --matmul bf16-mma=off "${gpt2[@]}" --steps 10 2>&1 \
  | grep -E 'step \(traced|FLOPs|rror'
echo "-- PyTorch eager, f32, TF32, then autocast bf16"
python3 scripts/bench_torch_gpt.py "${gpt2[@]}" --steps 10 --no-compile 2>&1 | grep -E 'step|rror'
python3 scripts/bench_torch_gpt.py "${gpt2[@]}" --steps 10 --no-compile --tf32 2>&1 | grep -E 'step|rror'
python3 scripts/bench_torch_gpt.py "${gpt2[@]}" --steps 10 --no-compile --autocast-bf16 2>&1 | grep -E 'step|rror'
echo "== attention, forward + backward (kiln fused, kiln unfused, PyTorch)"
att=${KILN_ATTENTION_SHAPES:-8x12x1024x64,16x4x64x32}
"$run" "$bundle/bin/kiln" bench --device cuda --attention "$att" --steps 20 2>&1 | grep -E '^attention|rror'
"$run" "$bundle/bin/kiln" bench --device cuda --attention "$att" --passes -fuse_attention --steps 20 2>&1 \
  | grep -E '^attention|rror'
python3 scripts/bench_torch_attention.py "$att" 2>&1 | grep -E 'attention|rror'
echo "== default config step"
"$run" "$bundle/bin/kiln" bench --device cuda --steps 20 2>&1 | grep -E 'step \(traced|rror'
