#!/usr/bin/env bash
# Pipeline over MPI (TCP): for S = 1..3 stages and several K, greedy and
# sampled, with and without emulated latency, `vkswarm pipeline` prints
# exactly what `vkswarm generate --prompts` prints. Then the faults: a rank
# killed (-9) or stopped (SIGSTOP) mid-run, ranks with different models, a
# KV cache that does not fit. Every mpirun runs under `timeout`.
# Usage: test_pipeline.sh BUILD_DIR
set -uo pipefail
bin=${1:?build dir}/vkswarm
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model="--random-model 64,160,6,4,2,300,128"
mpi() { mpi_run "${T:-120}" "$@"; }

# prompts as token ids (the random model has no tokenizer); one longer than a prefill chunk
cat > "$tmp/prompts.txt" <<'P'
5 6 7 8 9 10 11
100
3 4
200 201 202 203 204 205 206 207 208 209 210 211 212 213 214 215 216 217 218 219 220 221 222 223 224 225 226 227 228 229 230 231 232 233 234 235 236 237 238 239
17

42 43 44
P

check_same() { # name reference-file mpirun-args...
    local name=$1 ref=$2
    shift 2
    if mpi "$@" > "$tmp/out.jsonl" 2> "$tmp/err.txt" && cmp -s "$tmp/out.jsonl" "$ref"; then ok "$name"
    else bad "$name"; tail -5 "$tmp/err.txt"; diff <(head -c 600 "$ref") <(head -c 600 "$tmp/out.jsonl") | head -5; fi
}

for mode in greedy sampled; do
    if [ $mode = greedy ]; then samp="--temp 0"; else samp="--temp 0.9 --top-p 0.9 --top-k 50 --seed 7"; fi
    ref=$tmp/ref_$mode.jsonl
    $bin generate $model --prompts "$tmp/prompts.txt" $samp -n 48 > "$ref" 2>/dev/null || bad "generate $mode"
    for S in 1 2 3; do
        for K in 1 2 3; do
            check_same "S=$S K=$K $mode" "$ref" -np $S $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 \
                --micro-batches $K --chunk 16
        done
    done
    check_same "S=2 K=4 batch 2 latency 30ms $mode" "$ref" -np 2 $bin pipeline $model --prompts "$tmp/prompts.txt" \
        $samp -n 48 --micro-batches 4 --batch 2 --link-latency-ms 30 --link-mbps 50
    check_same "S=3 auto partition $mode" "$ref" -np 3 $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 \
        --partition auto
done
check_same "S=3 partition 1,2,3" "$tmp/ref_greedy.jsonl" -np 3 $bin pipeline $model --prompts "$tmp/prompts.txt" \
    --temp 0 -n 48 --partition 1,2,3

# rollouts: the last stage's TOPLOC proofs make the same file as one rank's, and it verifies
samp="--temp 0.9 --top-p 0.9 --seed 11"
$bin generate $model --prompts "$tmp/prompts.txt" $samp -n 48 --rollouts-out "$tmp/r_gen.jsonl" > /dev/null 2>&1 ||
    bad "generate --rollouts-out"
for S in 2 3; do
    if mpi -np $S $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 --micro-batches 2 \
           --rollouts-out "$tmp/r_$S.jsonl" > /dev/null 2>&1 && cmp -s "$tmp/r_$S.jsonl" "$tmp/r_gen.jsonl" &&
       $bin verify $model --rollouts "$tmp/r_$S.jsonl" --cpu > /dev/null 2>&1; then ok "S=$S rollouts equal one rank's and verify"
    else bad "S=$S rollouts"; fi
done

# f16 on the wire: runs; how many tokens differ from f32 is reported, not required to be 0
if mpi -np 2 $bin pipeline $model --prompts "$tmp/prompts.txt" --temp 0 -n 48 --wire f16 > "$tmp/f16.jsonl" 2>/dev/null; then
    differ=$(paste -d'\n' "$tmp/f16.jsonl" "$tmp/ref_greedy.jsonl" | awk 'NR%2{a=$0;next}{if(a!=$0)d++}END{print d+0}')
    ok "wire f16 ran ($differ of $(wc -l < "$tmp/prompts.txt") sequences differ from f32)"
else bad "wire f16"; fi

# overlap: over 150 ms links, 3 micro-batches of one sequence finish 6 prompts
# much sooner than 1 (one micro-batch's transfers overlap the others' work)
head -6 "$tmp/prompts.txt" > "$tmp/six.txt"
run_time() { # a failed run counts as infinitely slow
    local t0=$(date +%s.%N)
    mpi -np 2 $bin pipeline $model --prompts "$tmp/six.txt" --temp 0 -n 16 --link-latency-ms 150 --batch 1 "$@" \
        > /dev/null 2>&1 || { echo 99999; return; }
    echo "$(date +%s.%N) - $t0" | bc
}
t1=$(run_time --micro-batches 1)
t3=$(run_time --micro-batches 3)
if [ "$(echo "$t3 < 0.6 * $t1" | bc)" = 1 ]; then ok "overlap: K=3 ${t3}s vs K=1 ${t1}s"
else bad "overlap: K=3 ${t3}s vs K=1 ${t1}s"; fi

# a rank killed mid-run: everyone exits within 30 s, non-zero, naming the lost rank
fault_run() { # signal
    local sig=$1 start=0 pid="" rc=0
    start=$(date +%s)
    mpi -np 3 $bin pipeline $model --prompts "$tmp/prompts.txt" --temp 0 -n 120 --link-latency-ms 300 \
        --timeout-s 5 > /dev/null 2> "$tmp/fault.txt" &
    local job=$!
    sleep 6
    pid=$(grep -l "OMPI_COMM_WORLD_RANK=1" /proc/[0-9]*/environ 2>/dev/null | grep -o '[0-9]*' | while read p; do
        tr '\0' '\n' < /proc/$p/cmdline 2>/dev/null | grep -q '^pipeline$' && echo $p; done | head -1)
    [ -n "$pid" ] && kill -$sig "$pid"
    wait $job
    rc=$?
    local took=$(( $(date +%s) - start - 6 ))
    if [ -n "$pid" ] && [ $rc -ne 0 ] && [ $took -le 30 ] && grep -q "rank 1" "$tmp/fault.txt"; then
        ok "rank 1 $sig: others exited in ${took}s with status $rc"
    else bad "rank 1 $sig: pid '$pid' status $rc after ${took}s"; cat "$tmp/fault.txt" | tail -5; fi
    if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
}
fault_run KILL
fault_run STOP

# different models on different ranks: refused, naming the rank
if mpi -np 1 $bin pipeline $model --prompts "$tmp/prompts.txt" -n 8 : \
       -np 1 $bin pipeline --random-model 64,160,6,4,2,301,128 --prompts "$tmp/prompts.txt" -n 8 \
       > /dev/null 2> "$tmp/mm.txt"; then bad "model mismatch accepted"
elif grep -q "rank 1 loaded a different model" "$tmp/mm.txt"; then ok "model mismatch refused, naming rank 1"
else bad "model mismatch message"; cat "$tmp/mm.txt"; fi

# KV cache too large: refused at start with the bytes needed and available
if mpi -np 2 $bin pipeline --random-model 64,160,6,4,2,300,1000000 --prompts "$tmp/prompts.txt" -n 1000000 \
       --batch 4000 > /dev/null 2> "$tmp/kv.txt"; then bad "oversized KV accepted"
elif grep -q "needs" "$tmp/kv.txt" && grep -q "available\|allows" "$tmp/kv.txt"; then ok "oversized KV refused"
else bad "oversized KV message"; cat "$tmp/kv.txt" | tail -3; fi

echo "pipeline: $passed passed, $failed failed"
[ $failed -eq 0 ]
