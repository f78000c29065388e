#!/usr/bin/env bash
# Builds the API reference (Doxygen, from Debian) from the headers' comments into
# build/docs/html; any warning fails it (docs/Doxyfile). CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v doxygen >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends doxygen >/dev/null
fi
mkdir -p build/docs
doxygen docs/Doxyfile
echo "API reference: build/docs/html/index.html ($(find build/docs/html -name '*.html' | wc -l) pages)"
