# Sourced by the scripts that need Python packages from PyPI (benchmarks against PyTorch, the
# checks against Hugging Face): one virtual environment for all of them, .venv-bench or
# $KILN_BENCH_VENV, in $venv.
#
#   python_venv "torch, h5py" torch h5py numpy   # installs the packages unless the imports work
#
# Returns non-zero when the imports still fail (PyPI unreachable, say); the caller decides
# whether that skips or fails.
venv=${KILN_BENCH_VENV:-.venv-bench}
python_venv() {
  local imports=$1
  shift
  "$venv/bin/python" -c "import $imports" 2>/dev/null && return 0
  echo "installing $* from PyPI into $venv (once)"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q "$@" && "$venv/bin/python" -c "import $imports"
}
