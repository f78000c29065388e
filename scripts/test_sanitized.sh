#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (build-sanitized/, made
# by scripts/build_sanitized.sh). A tier of .ci/run.
#
#   bash scripts/test_sanitized.sh            # build and run every test
#   bash scripts/test_sanitized.sh -R Hostile # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build_sanitized.sh
# Leak checks off: runtimes kept for the process (the CUDA runtime, plan caches) are not leaks.
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-sanitized --output-on-failure \
  -j"$(nproc)" "$@"
