#!/usr/bin/env bash
# README test command: install what is missing, build, run the whole GoogleTest suite via CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
