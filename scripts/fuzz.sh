#!/usr/bin/env bash
# Fuzzes kiln's readers of untrusted input with libFuzzer under ASan+UBSan (targets in
# tests/fuzz/, built by scripts/build_sanitized.sh). For each target: first every input that
# once crashed it (tests/fuzz/regressions/<target>/) must now pass; then it runs for a bounded
# time from the committed seed corpus (tests/fuzz/corpus/<target>/), writing new inputs to a
# scratch corpus. A crash, a sanitizer report, a timeout or running out of memory fails the
# run; the input is kept in build-sanitized/fuzz-runs/crashes/ (commit it as a regression once
# fixed). A tier of .ci/run.
#
#   bash scripts/fuzz.sh [seconds per target, default 60] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(weights weights_fields checkpoint batch tokenizer text safetensors tokenizer_json)
bash scripts/build_sanitized.sh >/dev/null
bin=build-sanitized/tests/fuzz
runs=build-sanitized/fuzz-runs
rm -rf "$runs"
mkdir -p "$runs/crashes"
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
status=0
for t in "${targets[@]}"; do
  regressions=()
  for f in tests/fuzz/regressions/"$t"/*; do [ -e "$f" ] && regressions+=("$f"); done
  if [ ${#regressions[@]} -gt 0 ]; then
    if ! "$bin/fuzz_$t" "${regressions[@]}" >"$runs/$t.regressions.log" 2>&1; then
      echo "fuzz_$t: an input that crashed it before crashes again:"
      tail -n 40 "$runs/$t.regressions.log"
      status=1
      continue
    fi
  fi
  mkdir -p "$runs/corpus/$t"
  if "$bin/fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$runs/crashes/$t-" "$runs/corpus/$t" "tests/fuzz/corpus/$t" >"$runs/$t.log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$runs/$t.log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$runs/$t.log" | tail -n 1 | grep -o '[0-9]*' || echo '?')
    echo "fuzz_$t: no crash in ${seconds} s (${execs} inputs, ${#regressions[@]} regression inputs, coverage ${cov} edges)"
  else
    echo "fuzz_$t: CRASH (input kept in $runs/crashes/):"
    tail -n 60 "$runs/$t.log"
    status=1
  fi
done
exit $status
