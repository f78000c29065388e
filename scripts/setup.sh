#!/usr/bin/env bash
# Installs what kiln needs to build on Debian/Ubuntu (only the packages that are missing) and
# configures + builds it in ./build. Used by both README commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config libeigen3-dev nlohmann-json3-dev libpcre2-dev libhdf5-dev hdf5-tools libspdlog-dev libgtest-dev libbenchmark-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin ${KILN_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "kiln setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
