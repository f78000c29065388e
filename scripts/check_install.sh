#!/usr/bin/env bash
# Checks kiln as a dependency of another CMake project (CI tier): installs the build in ./build
# into a temporary prefix; compiles every installed header alone with only the prefix's include/
# on the path; checks that the installed CMake files name no library by an absolute path; moves
# ./build aside and builds examples/external (LANGUAGES CXX, <kiln/kiln.hpp> alone) against the
# prefix with find_package alone; then builds examples/external with kiln's source added
# (add_subdirectory; FetchContent does the same), as a shared library, and checks its SONAME. Each
# program runs: tiny_regression checks its gradients, draws its data, trains in a replayed step,
# and writes an HDF5 data file and a weights file; user_prims (against the prefix) registers a
# Prim and a custom VJP, checks them, and trains through them on the CPU and the fake GPU. Needs scripts/setup.sh's build (the README's test command).
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

echo "--- every installed header compiles alone (-I prefix/include only)"
headers=$(cd "$work/prefix/include" && find kiln -name '*.hpp' | sort)
export KILN_PREFIX_INCLUDE="$work/prefix/include"
failed=$(printf '%s\n' $headers | xargs -P "$jobs" -I{} sh -c \
  'echo "#include <{}>" | g++ -std=c++20 -fsyntax-only -I"$KILN_PREFIX_INCLUDE" -x c++ - 2>/dev/null || echo "{}"')
if [ -n "$failed" ]; then
  echo "check_install: installed headers that do not compile alone:" >&2
  printf '  %s\n' $failed >&2
  exit 1
fi
echo "$(printf '%s\n' $headers | wc -l) headers, each compiled alone"

echo "--- the installed CMake files name no library by an absolute path"
cmake_files=("$work"/prefix/lib*/cmake/kiln/kilnTargets*.cmake)
[ -f "${cmake_files[0]}" ] || { echo "check_install: no kilnTargets*.cmake under $work/prefix/lib*/cmake/kiln" >&2; exit 1; }
if grep -nE '(^|[;" ])/[^;" ]*\.(so|a)([.;" ]|$)' "$work"/prefix/lib*/cmake/kiln/*.cmake; then
  echo "check_install: the installed package names libraries by absolute paths (above)" >&2
  exit 1
fi

echo "--- examples/external with find_package(kiln), ./build moved aside"
# Only the prefix is named: no kiln include path, library or flag is given by hand, and the build
# tree is gone while the user's project builds and runs.
[ ! -e build.moved-aside ] || { echo "check_install: build.moved-aside exists (a killed run?): restore it as build" >&2; exit 1; }
mv build build.moved-aside
trap 'mv build.moved-aside build; rm -rf "$work"' EXIT
cmake -S examples/external -B "$work/installed" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/installed" -j"$jobs" >/dev/null
"$work/installed/tiny_regression" "$work/installed.h5"
# The user Prims (softcap, round_ste) on the CPU and on the fake GPU (the SIMT simulator); with a
# planted wrong VJP the gradient check, and so the program, must fail.
"$work/installed/user_prims" --device cpu
"$work/installed/user_prims" --device sim
if "$work/installed/user_prims" --plant-wrong-vjp >"$work/wrong_vjp.txt" 2>&1 || ! grep -q 'softcap: FAILED' "$work/wrong_vjp.txt"; then
  cat "$work/wrong_vjp.txt" >&2
  echo "check_install: user_prims --plant-wrong-vjp did not fail its gradient check" >&2
  exit 1
fi
echo "user_prims --plant-wrong-vjp: the gradient check caught the wrong VJP"
mv build.moved-aside build
trap 'rm -rf "$work"' EXIT
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
