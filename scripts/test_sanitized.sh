#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own build
# directory (build-asan). Not part of .ci/run yet: on 2 cores the sanitized build takes about
# 12 minutes and its tests about 2, which would double CI's time.
#
#   bash scripts/test_sanitized.sh            # build and run every test
#   bash scripts/test_sanitized.sh -R Hostile # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null  # the packages, and the normal build the CLI tests use
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-asan -j"$(nproc)"
# Leak checks off: runtimes kept for the process (the CUDA runtime, plan caches) are not leaks.
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure \
  -j"$(nproc)" "$@"
