#!/usr/bin/env bash
# CI tier: kiln against Hugging Face (scripts/check_against_transformers.py through the CTest
# KilnMatchesTransformers): the Llama against transformers, the BPE against tokenizers. Installs
# torch, transformers, tokenizers and h5py from PyPI into
# the benchmark venv (.venv-bench, or $KILN_BENCH_VENV) once; here a missing package is a failure,
# not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/examples/kiln ] || bash scripts/setup.sh
venv=${KILN_BENCH_VENV:-.venv-bench}
if ! "$venv/bin/python" -c "import torch, transformers, h5py" 2>/dev/null; then
  echo "check_transformers: installing torch, transformers and h5py from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch transformers tokenizers h5py numpy
fi
KILN_PYTHON="$PWD/$venv/bin/python" KILN_REQUIRE_TRANSFORMERS=1 \
  ctest --test-dir build -R '^KilnMatchesTransformers$' --output-on-failure
