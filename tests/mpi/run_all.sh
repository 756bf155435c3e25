#!/usr/bin/env bash
# The MPI suites one after another, as one meson test ('mpi'). They must not
# run beside each other (two jobs' ranks on a 2-core machine make each other's
# fault timings meaningless), but may beside a cmocka suite: their fault cases
# mostly wait (measured: ~40% of the cores idle over the four), so meson runs
# this test first and the cmocka suites on the other core meanwhile.
# Usage: run_all.sh BUILD_DIR [SUITE...]
#   SUITE: broadcast pipeline verifier rl join (default: all, in that order);
#   one suite: meson test -C build mpi --test-args rl
set -uo pipefail
build=${1:?build dir}
shift
here=$(cd "$(dirname "$0")" && pwd)
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(broadcast pipeline verifier rl join)
failed=()
for s in "${suites[@]}"; do
    case $s in
        broadcast) cmd=("$here/broadcast.sh" "$build/vkswarm") ;;
        pipeline) cmd=("$here/test_pipeline.sh" "$build") ;;
        verifier) cmd=("$here/test_verifier.sh" "$build") ;;
        rl) cmd=("$here/test_rl.sh" "$build") ;;
        join) cmd=("$here/test_join.sh" "$build") ;;
        *) echo "run_all.sh: unknown suite '$s' (broadcast pipeline verifier rl join)" >&2; exit 2 ;;
    esac
    echo "== mpi_$s =="
    t0=$(date +%s)
    if "${cmd[@]}"; then echo "== mpi_$s: passed in $(($(date +%s) - t0)) s =="
    else echo "== mpi_$s: FAILED after $(($(date +%s) - t0)) s =="; failed+=("mpi_$s"); fi
done
[ ${#failed[@]} -eq 0 ] && exit 0
echo "failed: ${failed[*]}"
exit 1
