#!/usr/bin/env bash
# Checks kiln as a dependency of another CMake project (CI tier): installs the build in ./build
# into a temporary prefix and builds examples/external against it with find_package alone; then
# builds examples/external with kiln's source added (add_subdirectory; FetchContent does the
# same), as a shared library, and checks its SONAME. Each program runs: it checks its gradients,
# trains, and writes a weights file. Needs scripts/setup.sh's build (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/CMakeCache.txt ] || { echo "check_install: no ./build (run scripts/setup.sh first)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=$(nproc)

echo "--- installing ./build into $work/prefix"
cmake --build build -j"$jobs" --target kiln kiln_cli >/dev/null
cmake --install build --prefix "$work/prefix" >/dev/null
"$work/prefix/bin/kiln" --version

echo "--- examples/external with find_package(kiln)"
# Only the prefix is named: no kiln include path, library or flag is given by hand.
cmake -S examples/external -B "$work/installed" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/installed" -j"$jobs" >/dev/null
"$work/installed/tiny_regression" "$work/installed.h5"
if grep -q -- '-march' "$work/installed/CMakeFiles/tiny_regression.dir/flags.make"; then
  echo "check_install: an architecture flag leaked into the user's build:" >&2
  grep -- '-march' "$work/installed/CMakeFiles/tiny_regression.dir/flags.make" >&2
  exit 1
fi

echo "--- examples/external with add_subdirectory(kiln), BUILD_SHARED_LIBS=ON"
cmake -S examples/external -B "$work/subdir" -DKILN_SOURCE_DIR="$PWD" -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/subdir" -j"$jobs" >/dev/null
"$work/subdir/tiny_regression" "$work/subdir.h5"
soname=$(objdump -p "$work/subdir/kiln/libkiln.so" | awk '/SONAME/ {print $2}')
[ "$soname" = "libkiln.so.0.1" ] || { echo "check_install: SONAME is '$soname', not libkiln.so.0.1" >&2; exit 1; }
echo "libkiln.so's SONAME: $soname"
echo "check_install: passed"
