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
#   bash scripts/bench_cpu_vs_torch.sh            # both configs
#   bash scripts/bench_cpu_vs_torch.sh default    # one of: default wide
set -euo pipefail
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

kiln_ms() {  # the traced (replayed) step, as training runs it
  ./build/examples/kiln bench $1 --steps "$2" | sed -n 's/^step (traced, replayed): \([0-9.]*\) ms.*/\1/p'
}
torch_ms() {  # "eager compile"
  "$venv/bin/python" scripts/bench_torch_gpt.py --device cpu $1 --steps "$2" 2>/dev/null |
    sed -n 's/^step (\(eager\|torch.compile\)): \([0-9.]*\) ms.*/\2/p' | paste -sd' '
}
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
median() { python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" "$@"; }
turns=${KILN_BENCH_TURNS:-4}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for config in ${@:-default wide}; do
  f=${flags[$config]:?unknown config $config (default or wide)}
  n=${steps[$config]}
  ks=() es=() cs=() res=() rcs=()
  for turn in $(seq "$turns"); do
    k=$(kiln_ms "$f" "$n")
    ks+=("$k")
    if [ "$have_torch" = 1 ]; then
      read -r eager compiled <<<"$(torch_ms "$f" "$n")"
      es+=("$eager") cs+=("$compiled") res+=("$(ratio "$k" "$eager")") rcs+=("$(ratio "$k" "$compiled")")
      echo "$config turn $turn: kiln $k ms/step; PyTorch eager $eager, torch.compile $compiled;" \
        "kiln/eager ${res[-1]}, kiln/compile ${rcs[-1]}"
    else
      echo "$config turn $turn: kiln $k ms/step"
    fi
  done
  if [ "$have_torch" = 1 ]; then
    echo "$config median of $turns turns: kiln $(median "${ks[@]}") ms/step; PyTorch eager $(median "${es[@]}")," \
      "torch.compile $(median "${cs[@]}"); kiln/eager $(median "${res[@]}"), kiln/compile $(median "${rcs[@]}")"
  else
    echo "$config median of $turns turns: kiln $(median "${ks[@]}") ms/step"
  fi
done
