#!/usr/bin/env bash
# kiln train on a full disk (CTest DiskFullSweep): a small tmpfs holds a previous weights file
# (or checkpoint) and a filler that leaves F bytes free; `kiln train --out` (then
# `--checkpoint`) writes there. For every F, from 0 to past the file's size:
#   - the exit status is 0 (the file fit) or 1 (it did not), never a crash or another code;
#   - on 1 the error says the disk may be full, and the previous file is byte for byte intact;
#   - on 0 the new file is complete (kiln reads it back);
#   - no temporary file is left beside it.
# At least one size must fail and one succeed, so that the sweep spans the boundary.
# Mounting needs root: without it the test is skipped (exit 77) unless KILN_REQUIRE_TMPFS=1
# (.ci/run sets it), which makes the skip a failure.
#
#   tests/disk_full_sweep.sh path/to/kiln [work dir]
set -uo pipefail
kiln=$1
work=$(mktemp -d "${2:-${TMPDIR:-/tmp}}/kiln-disk-full.XXXXXX") || exit 1
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
  mountpoint -q "$mnt" && umount "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT

skip() {
  echo "DiskFullSweep skipped: $1"
  [ "${KILN_REQUIRE_TMPFS:-}" = 1 ] && { echo "KILN_REQUIRE_TMPFS=1: a skip is a failure" >&2; exit 1; }
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "mounting a tmpfs needs root"
mount -t tmpfs -o size=2m,mode=0755 tmpfs "$mnt" 2>"$work/mount.err" || skip "cannot mount a tmpfs: $(cat "$work/mount.err")"

fail() {
  echo "DiskFullSweep FAILED: $*" >&2
  exit 1
}

# A tiny model: its weights file is tens of KiB, its checkpoint three times that.
for i in $(seq 1 200); do echo "the quick brown fox jumps over the lazy dog $i times"; done >"$work/corpus.txt"
config=(--data "$work/corpus.txt" --steps 2 --layers 1 --heads 2 --embd 32 --block 16 --batch 4 --threads 1)
train() { "$kiln" train "${config[@]}" --metrics "$work/metrics.jsonl" "$@"; }

# The previous files, written where there is room.
train --out "$work/previous.h5" --checkpoint "$work/previous.ckpt.h5" >/dev/null 2>&1 ||
  fail "training with room to spare failed"

free_bytes() { echo $(($(stat -f -c '%a * %S' "$mnt"))); }

# sweep KIND TARGET ARGS...: the target (on the tmpfs) starts as the previous file of that kind.
sweep() {
  local kind=$1 target=$2
  shift 2
  local previous=$work/previous.h5
  [ "$kind" = checkpoint ] && previous=$work/previous.ckpt.h5
  local size
  size=$(stat -c %s "$previous")
  local step=$(((size + 4096 * 24) / 24 / 4096 * 4096))
  [ "$step" -ge 4096 ] || step=4096
  local failed=0 succeeded=0 runs=0
  for ((want = 0; want <= size + 3 * step; want += step)); do
    rm -rf "${mnt:?}"/*
    cp "$previous" "$target"
    local before
    before=$(sha256sum <"$target")
    local fill=$(($(free_bytes) - want))
    [ "$fill" -gt 0 ] && { head -c "$fill" /dev/zero >"$mnt/filler" 2>/dev/null || true; }
    local free
    free=$(free_bytes)
    train "$@" >"$work/out.txt" 2>"$work/err.txt"
    local rc=$?
    runs=$((runs + 1))
    case $rc in
      0)
        succeeded=$((succeeded + 1))
        if [ "$kind" = weights ]; then
          "$kiln" sample --weights "$target" --tokens 4 >/dev/null 2>&1 || fail "$kind, $free bytes free: exit 0 but kiln cannot read the file back"
        else
          "$kiln" train "${config[@]}" --steps 3 --metrics "$work/resume.jsonl" --out "$work/resumed.h5" --resume "$target" \
            >/dev/null 2>&1 || fail "$kind, $free bytes free: exit 0 but the checkpoint does not resume"
        fi
        ;;
      1)
        failed=$((failed + 1))
        grep -q "is the disk full" "$work/err.txt" || fail "$kind, $free bytes free: exit 1 without the disk-full message: $(cat "$work/err.txt")"
        [ "$(sha256sum <"$target")" = "$before" ] || fail "$kind, $free bytes free: the previous file changed"
        ;;
      *) fail "$kind, $free bytes free: exit status $rc (a crash?): $(tail -3 "$work/err.txt")" ;;
    esac
    local left
    left=$(find "$mnt" -name '*.tmp-*' | head -1)
    [ -z "$left" ] || fail "$kind, $free bytes free: a temporary file was left behind: $left"
    printf '%-10s %8d bytes free: exit %d\n' "$kind" "$free" "$rc"
  done
  [ "$failed" -gt 0 ] && [ "$succeeded" -gt 0 ] ||
    fail "$kind: $runs sizes gave $failed failures and $succeeded successes; the sweep must span the file's size ($size bytes)"
  echo "$kind: $runs free-space sizes up to $((size + 3 * step)) bytes (the file: $size), $failed refused cleanly, $succeeded written"
}

sweep weights "$mnt/model.h5" --out "$mnt/model.h5"
sweep checkpoint "$mnt/ckpt.h5" --out "$work/model.h5" --checkpoint "$mnt/ckpt.h5"
echo "DiskFullSweep passed"
