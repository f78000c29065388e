#!/bin/bash
# Checks that a refactor of the lowering changed no generated kernel: writes the PTX of one
# training step in 19 configurations (f32, bf16, tf32; sm_80 and sm_90; the opt-in matmul
# settings; Llama; GPT-2 small) with two `kiln` binaries and compares them byte for byte.
#
#   scripts/ptx_unchanged.sh OLD_KILN NEW_KILN [WORK_DIR]
#
# Build OLD_KILN from the commit before the change (copy build/examples/kiln aside first: it is
# linked statically). About 6 minutes a binary on 2 cores; ONLY=REGEX runs the configurations
# whose names match. Exit status 1 where any kernel differs.
#
# A configuration's choices are `kiln ptx` options (--matmul, --tf32); a binary from before those
# options existed (whose `kiln ptx --help` has no --matmul) gets the same choices as the KILN_*
# variables it read instead, so that the kernels of the two ways can be compared.
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 OLD_KILN NEW_KILN [WORK_DIR (new, or the default's, which is replaced)]" >&2
  exit 2
fi
old=$1 new=$2 work=${3:-/tmp/kiln-ptx-unchanged}
if [[ $# -ge 3 && -e $work ]]; then
  echo "$work exists: name a new directory" >&2
  exit 2
fi
# Only each configuration's own settings: none of the caller's KILN_* variables.
while read -r name; do unset "$name"; done < <(compgen -e | grep '^KILN_' || true)
small=(--layers 1 --embd 192 --heads 3 --block 128 --batch 4 --vocab-size 101)
llama=(--model llama --layers 1 --embd 192 --heads 4 --block 64 --batch 4 --vocab-size 77)
gpt2=(--layers 1 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8)
# name | choices as options | the same as variables (binaries before the options) | model options
configs=(
  "f32_90|||${small[*]} --precision f32"
  "f32_80|||${small[*]} --precision f32 --sm 80"
  "bf16_90|||${small[*]} --precision bf16"
  "bf16_80|||${small[*]} --precision bf16 --sm 80"
  "bf16_tensor_copies|--matmul tensor-copies=on|KILN_WGMMA_TENSOR_COPIES=1|${small[*]} --precision bf16"
  "bf16_staged_all|--matmul staged-stores=all|KILN_MMA_STAGED_STORES=all|${small[*]} --precision bf16"
  "bf16_staged_none|--matmul staged-stores=none|KILN_MMA_STAGED_STORES=0|${small[*]} --precision bf16"
  "bf16_products_first|--matmul products-first=on|KILN_WGMMA_PRODUCTS_FIRST=1|${small[*]} --precision bf16"
  "bf16_no_mma|--matmul bf16-mma=off|KILN_BF16_MMA=0|${small[*]} --precision bf16"
  "tf32_90|--tf32|KILN_ALLOW_TF32=1|${small[*]} --precision f32"
  "tf32_80|--tf32|KILN_ALLOW_TF32=1|${small[*]} --precision f32 --sm 80"
  "llama_f32|||${llama[*]} --precision f32"
  "llama_bf16|||${llama[*]} --precision bf16"
  "gpt2_f32|||${gpt2[*]} --precision f32"
  "gpt2_bf16|||${gpt2[*]} --precision bf16"
  "gpt2_bf16_tensor_copies|--matmul tensor-copies=on|KILN_WGMMA_TENSOR_COPIES=1|${gpt2[*]} --precision bf16"
  "bf16_192x256|--matmul tile=192x256|KILN_MMA_TILE=192x256|${small[*]} --precision bf16"
  "bf16_80_3_stages|--matmul stages=3|KILN_MMA_STAGES=3|${small[*]} --precision bf16 --sm 80"
  "bf16_80_split_k|--matmul split-k=2|KILN_MMA_SPLIT_K=2|${small[*]} --precision bf16 --sm 80"
)
takes_options() { "$1" ptx --help 2>&1 | grep -q -- '--matmul'; }
rm -rf "$work"
mkdir -p "$work/old" "$work/new" "$work/logs"
differ=0 compared=0
for c in "${configs[@]}"; do
  IFS='|' read -r name choices envs opts <<< "$c"
  [[ $name =~ ${ONLY:-.} ]] || continue
  for side in old new; do
    bin=$old
    [[ $side == new ]] && bin=$new
    as_options=$choices as_variables=
    takes_options "$bin" || as_options='' as_variables=$envs
    # shellcheck disable=SC2086 # the variables and options are word lists
    env $as_variables "$bin" ptx --out "$work/$side/$name" $opts $as_options > "$work/logs/$side.$name.log" 2>&1 ||
      { echo "kiln ptx failed for $name ($side): see $work/logs/$side.$name.log"; exit 2; }
  done
  files=$(find "$work/old/$name" -name '*.ptx' | wc -l)
  if ((files == 0)); then
    echo "no kernels written for $name: see $work/logs/old.$name.log"
    differ=1
  elif diff -rq "$work/old/$name" "$work/new/$name" > /dev/null; then
    echo "same      $name ($files kernels)"
    compared=$((compared + 1))
  else
    echo "DIFFERENT $name: diff -r $work/old/$name $work/new/$name"
    differ=1
  fi
done
if ((compared == 0 && differ == 0)); then
  echo "no configuration compared (ONLY=${ONLY:-} matches none)"
  exit 2
fi
exit $differ
