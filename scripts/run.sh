#!/usr/bin/env bash
# README main-job command: install what is missing, build, and train the example model on the
# CPU, printing its falling loss. (The small GPT replaces the MLP example in the next issue.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/examples/train_mlp "$@"
