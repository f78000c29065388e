#!/usr/bin/env bash
# README main-job command: install what is missing (the default corpus is Debian's `fortunes`
# package), build, then train the default GPT (`--device auto`: on the GPU when libcuda and a
# device are found, else on the CPU), save model.h5 and print a sample. Extra arguments go to
# `kiln train`.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN_EXTRA_PACKAGES=fortunes bash scripts/setup.sh
./build/examples/kiln train --out model.h5 "$@"
