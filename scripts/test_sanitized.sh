#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (build-sanitized/, made
# by scripts/build_sanitized.sh). A tier of .ci/run. Every test of host code runs here (readers,
# writers, executor, passes, layers, training, the CLI, the runtime and simulator behind the fake
# driver); the lowering cases that run kernels by the thousand in the SIMT simulator
# (Lowering.*, EveryPrim/LoweringTest.*, EveryTarget/LoweringPtxasTest.*, MatmulColumnSums.*, the PtxCommand* CLI runs) are
# two thirds of the plain suite's time and run once, in the plain tier (scripts/test.sh); so does
# CliImportPeakMemory, whose figure the sanitizers' shadow memory would swamp.
#
#   bash scripts/test_sanitized.sh            # build and run every test
#   bash scripts/test_sanitized.sh -R Hostile # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build_sanitized.sh
# Leak checks off: runtimes kept for the process (the CUDA runtime, plan caches) are not leaks.
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-sanitized --output-on-failure \
  -j"$(nproc)" -E '^(Lowering\.|EveryPrim/LoweringTest\.|EveryTarget/LoweringPtxasTest\.|MatmulColumnSums\.|PtxCommand|CliImportPeakMemory)' "$@"
