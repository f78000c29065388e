#!/usr/bin/env bash
# kiln against PyTorch 2 on the CPU, one sitting: the same GPT training step (model, loss,
# AdamW, f32; see scripts/bench_torch_gpt.py) timed by `kiln bench` and by PyTorch eager and
# torch.compile, for the default config and the wider one of docs/BENCHMARKS.md, kiln and
# PyTorch taking turns (twice each) so that a change in the machine's load hits both. Each
# figure is a median over the timed steps. Prints each figure and kiln's time as a fraction of
# PyTorch's (below 1: kiln is faster).
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

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for config in ${@:-default wide}; do
  f=${flags[$config]:?unknown config $config (default or wide)}
  n=${steps[$config]}
  for turn in 1 2; do
    k=$(kiln_ms "$f" "$n")
    if [ "$have_torch" = 1 ]; then
      read -r eager compiled <<<"$(torch_ms "$f" "$n")"
      echo "$config turn $turn: kiln $k ms/step; PyTorch eager $eager, torch.compile $compiled;" \
        "kiln/eager $(ratio "$k" "$eager"), kiln/compile $(ratio "$k" "$compiled")"
    else
      echo "$config turn $turn: kiln $k ms/step"
    fi
  done
done
