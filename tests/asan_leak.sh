#!/usr/bin/env bash
# The leak check itself, tested (ASan builds only; tests/meson.build):
#   asan_leak.sh clean CANARY SUPPRESSIONS   opening a Vulkan device and closing it
#                                             leaks nothing: exit 0, no report
#   asan_leak.sh leak CANARY SUPPRESSIONS    a leak in vkswarm code is reported
#                                             (naming the vkswarm function) and
#                                             fails the run
# It runs with the ASAN_OPTIONS/LSAN_OPTIONS it is given (tools/test's), so
# options or suppressions that stop leak reports fail it; without any, with
# tools/test's defaults.
set -uo pipefail
mode=$1 canary=$2 supp=$3
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp:print_suppressions=0}
log=$(mktemp /tmp/vkswarm-asan-leak.XXXXXX)
trap 'rm -f "$log"' EXIT

case "$mode" in
  clean)
    timeout 120 "$canary" 2>"$log"
    rc=$?
    if [ $rc -ne 0 ] || grep -q 'LeakSanitizer' "$log"; then
      cat "$log"
      echo "FAIL: opening and closing a device: exit $rc, LeakSanitizer must stay quiet" >&2
      exit 1
    fi
    echo "ok: a device opened and closed leaks nothing (ASAN_OPTIONS=$ASAN_OPTIONS LSAN_OPTIONS=$LSAN_OPTIONS)"
    ;;
  leak)
    timeout 120 "$canary" --leak 2>"$log"
    rc=$?
    if [ $rc -eq 0 ] || ! grep -q 'ERROR: LeakSanitizer: detected memory leaks' "$log" ||
       ! grep -q 'in vks_gguf_writer_create ' "$log"; then
      cat "$log"
      echo "FAIL: a leak in vkswarm code (vks_gguf_writer_create) must be reported and fail the run; exit $rc" >&2
      exit 1
    fi
    echo "ok: the leak in vks_gguf_writer_create was reported, exit $rc"
    ;;
  *) echo "usage: asan_leak.sh clean|leak CANARY SUPPRESSIONS" >&2; exit 2 ;;
esac
