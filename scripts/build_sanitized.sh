#!/usr/bin/env bash
# Builds kiln, its tests and its libFuzzer targets with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer in build-sanitized/ (the normal build stays in build/). The library
# carries libFuzzer's coverage instrumentation (fuzzer-no-link) so one build serves both
# scripts/test_sanitized.sh and scripts/fuzz.sh. Assertions stay on; -O1 keeps the build short.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN_EXTRA_PACKAGES="clang libclang-rt-dev libomp-dev ${KILN_EXTRA_PACKAGES:-}" bash scripts/setup.sh >/dev/null
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S . -B build-sanitized -DCMAKE_BUILD_TYPE=Sanitized -DKILN_BUILD_FUZZERS=ON \
  -DCMAKE_C_FLAGS_SANITIZED="-O1" -DCMAKE_CXX_FLAGS_SANITIZED="-O1 -gline-tables-only $flags" \
  -DCMAKE_EXE_LINKER_FLAGS_SANITIZED="-fsanitize=address,undefined" >/dev/null
cmake --build build-sanitized -j"$(nproc)"
