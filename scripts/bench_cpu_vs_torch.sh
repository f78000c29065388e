#!/usr/bin/env bash
# kiln against PyTorch 2 on the CPU, one sitting: the same GPT training step (model, loss,
# AdamW, f32; see scripts/bench_torch_gpt.py) timed by `kiln bench` and by PyTorch eager and
# torch.compile, for the default config and the wider one of docs/BENCHMARKS.md, kiln and
# PyTorch taking turns ($KILN_BENCH_TURNS each, default 4) so that a change in the machine's
# load hits both. Each figure is a median over the timed steps. Prints each turn's figures and
# kiln's time as a fraction of PyTorch's (below 1: kiln is faster), then per config the
# medians over the turns of each figure and of each turn's ratio: the VM this runs on changes
# speed within seconds, so one turn's ratio says little.
#
# PyTorch comes from PyPI into a virtual environment this script creates (.venv-bench, or
# $KILN_BENCH_VENV); without PyPI, kiln's figures alone are printed.
#
# With --precision bf16 the peers are kiln --precision bf16, kiln f32 (bf16 must not be slower
# where the CPU has no bf16 arithmetic) and PyTorch under torch.autocast("cpu", bfloat16), eager
# and torch.compile; attention goes through scaled_dot_product_attention throughout.
#
#   bash scripts/bench_cpu_vs_torch.sh                        # both configs, f32
#   bash scripts/bench_cpu_vs_torch.sh default                # one of: default wide
#   bash scripts/bench_cpu_vs_torch.sh --precision bf16 wide  # mixed precision
#   bash scripts/bench_cpu_vs_torch.sh --precision bf16 --cpu-bf16 onednn  # oneDNN's bf16 kernels (AMX: the default)
#   bash scripts/bench_cpu_vs_torch.sh --recompute none wide  # kiln keeping every saved value (default: auto)
set -euo pipefail
precision=f32 cpu_bf16="" recompute=""  # "": kiln's defaults for the CPU
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
  case $1 in
  --precision) precision=${2:?--precision f32 or bf16} ;;
  --cpu-bf16) cpu_bf16=${2:?--cpu-bf16 rounded-f32 or onednn} ;;
  --recompute) recompute=${2:?--recompute none, auto or blocks} ;;
  *) echo "bench_cpu_vs_torch.sh: unknown option $1" >&2 && exit 2 ;;
  esac
  shift 2
done
case $precision in f32 | bf16) ;; *) echo "--precision: expected f32 or bf16, received $precision" >&2 && exit 2 ;; esac
cd "$(dirname "$0")/.."
[ -x build/examples/kiln ] || bash scripts/setup.sh
source scripts/python_venv.sh
have_torch=0
if python_venv torch torch numpy; then have_torch=1; else echo "bench: no PyTorch (PyPI unreachable?)"; fi

declare -A flags=(
  [default]="--layers 4 --heads 4 --embd 128 --block 64 --batch 16 --vocab-size 65"
  [wide]="--layers 6 --heads 6 --embd 384 --block 256 --batch 8 --vocab-size 65"
)
declare -A steps=([default]=40 [wide]=12)

kiln_ms() {  # the traced (replayed) step, as training runs it; $3: the precision
  local out
  out=$(./build/examples/kiln bench $1 --steps "$2" --precision "$3" ${cpu_bf16:+--cpu-bf16 "$cpu_bf16"} ${recompute:+--recompute "$recompute"} 2>&1) ||
    { echo "kiln bench failed: $out" >&2 && return 1; }
  sed -n 's/^step (traced, replayed): \([0-9.]*\) ms.*/\1/p' <<<"$out"
}
torch_ms() {  # "eager compile"
  local autocast=""
  [ "$precision" = bf16 ] && autocast=--autocast-bf16
  "$venv/bin/python" scripts/bench_torch_gpt.py --device cpu $1 --steps "$2" $autocast 2>/dev/null |
    sed -n 's/^step (\(eager\|torch.compile\)): \([0-9.]*\) ms.*/\2/p' | paste -sd' '
}
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
median() { python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" "$@"; }
turns=${KILN_BENCH_TURNS:-4}
peer=PyTorch
[ "$precision" = bf16 ] && peer="PyTorch autocast bf16"

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //');" \
  "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -oE 'avx2|avx512f|avx512_bf16|amx_bf16' | paste -sd' ');" \
  "precision $precision, --cpu-bf16 ${cpu_bf16:-kiln default}"
./build/examples/kiln bench --steps 1 --precision "$precision" ${cpu_bf16:+--cpu-bf16 "$cpu_bf16"} 2>/dev/null |
  grep '^CPU bf16' || true
for config in ${@:-default wide}; do
  f=${flags[$config]:?unknown config $config (default or wide)}
  n=${steps[$config]}
  ks=() fs=() es=() cs=() res=() rcs=() rfs=()
  for turn in $(seq "$turns"); do
    k=$(kiln_ms "$f" "$n" "$precision")
    ks+=("$k")
    line="$config turn $turn: kiln $k ms/step"
    if [ "$precision" = bf16 ]; then
      f32=$(kiln_ms "$f" "$n" f32)
      fs+=("$f32") rfs+=("$(ratio "$k" "$f32")")
      line+=" (kiln f32 $f32, bf16/f32 ${rfs[-1]})"
    fi
    if [ "$have_torch" = 1 ]; then
      read -r eager compiled <<<"$(torch_ms "$f" "$n")"
      es+=("$eager") cs+=("$compiled") res+=("$(ratio "$k" "$eager")") rcs+=("$(ratio "$k" "$compiled")")
      line+="; $peer eager $eager, torch.compile $compiled; kiln/eager ${res[-1]}, kiln/compile ${rcs[-1]}"
    fi
    echo "$line"
  done
  line="$config median of $turns turns: kiln $(median "${ks[@]}") ms/step"
  [ "$precision" = bf16 ] && line+=" (kiln f32 $(median "${fs[@]}"), bf16/f32 $(median "${rfs[@]}"))"
  [ "$have_torch" = 1 ] && line+="; $peer eager $(median "${es[@]}"), torch.compile $(median "${cs[@]}");"\
" kiln/eager $(median "${res[@]}"), kiln/compile $(median "${rcs[@]}")"
  echo "$line"
done
