#!/usr/bin/env bash
# Verifier ranks: `mpirun -np N vkswarm verify --mpi` hands batches of rollout
# samples to ranks 1..N-1 and prints exactly what a lone `vkswarm verify`
# prints, for honest and tampered files, on the GPU and with --cpu; and a
# lone GPU verify with three row-checker threads prints the same again.
# Usage: test_verifier.sh BUILD_DIR
set -uo pipefail
bin=${1:?build dir}/vkswarm
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model="--random-model 64,160,4,4,2,300,128"
mpi() { mpi_run 120 "$@"; }

for i in $(seq 1 20); do echo "$((i + 3)) $((i * 7 % 290 + 3)) $((i * 13 % 290 + 3))"; done > "$tmp/prompts.txt"
$bin generate $model --prompts "$tmp/prompts.txt" --temp 0.9 --seed 3 -n 40 --rollouts-out "$tmp/honest.jsonl" \
    > /dev/null 2>&1 || bad "generate rollouts"
# tamper with one output token of the third sample
awk 'NR==4 { sub(/"output_ids":\[[0-9]+/, "\"output_ids\":[7") } { print }' "$tmp/honest.jsonl" > "$tmp/tampered.jsonl"

for file in honest tampered; do
    for mode in --cpu ""; do
        $bin verify $model --rollouts "$tmp/$file.jsonl" $mode --batch 3 --jsonl > "$tmp/lone.txt" 2>/dev/null
        lone_rc=$?
        if [ -z "$mode" ]; then # rows checked by 3 threads (one per job) give the same verdicts
            VKSWARM_VERIFY_THREADS=3 $bin verify $model --rollouts "$tmp/$file.jsonl" --batch 3 --jsonl \
                > "$tmp/threads.txt" 2>/dev/null
            rc=$?
            if [ $rc -eq $lone_rc ] && cmp -s "$tmp/threads.txt" "$tmp/lone.txt"; then
                ok "$file gpu: 3 checker threads give the same verdicts"
            else bad "$file gpu: 3 checker threads: status $rc vs $lone_rc"; fi
        fi
        for np in 1 3; do
            mpi -np $np $bin verify $model --rollouts "$tmp/$file.jsonl" $mode --batch 3 --jsonl --mpi \
                > "$tmp/mpi.txt" 2> "$tmp/err.txt"
            rc=$?
            if [ $rc -eq $lone_rc ] && cmp -s "$tmp/mpi.txt" "$tmp/lone.txt" && [ -s "$tmp/lone.txt" ]; then
                ok "$file ${mode:-gpu} np=$np: same verdicts (status $rc)"
            else bad "$file ${mode:-gpu} np=$np: status $rc vs $lone_rc"; tail -3 "$tmp/err.txt"; fi
        done
    done
done
[ "$(grep -c '"accepted":false' "$tmp/lone.txt")" = 1 ] && ok "the tampered sample, and only it, is rejected" ||
    bad "tampered verdicts"
echo "verifier: $passed passed, $failed failed"
[ $failed -eq 0 ]
