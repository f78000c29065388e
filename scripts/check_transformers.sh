#!/usr/bin/env bash
# CI tier: kiln against Hugging Face (scripts/check_against_transformers.py through the CTest
# KilnMatchesTransformers): the Llama against transformers, the BPE against tokenizers; and
# kiln import / kiln export of GPT-2 and Llama models transformers writes
# (scripts/check_hf_models.py through KilnImportsHuggingFaceModels). Installs
# torch, transformers, tokenizers and h5py from PyPI into
# the benchmark venv (.venv-bench, or $KILN_BENCH_VENV) once; here a missing package is a failure,
# not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/examples/kiln ] || bash scripts/setup.sh
source scripts/python_venv.sh
python_venv "torch, transformers, tokenizers, h5py" torch transformers tokenizers h5py numpy
KILN_PYTHON="$PWD/$venv/bin/python" KILN_REQUIRE_TRANSFORMERS=1 \
  ctest --test-dir build -R '^(KilnMatchesTransformers|KilnImportsHuggingFaceModels)$' --output-on-failure
