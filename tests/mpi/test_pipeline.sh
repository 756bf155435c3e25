#!/usr/bin/env bash
# Pipeline over MPI (TCP): for S = 1..3 stages and several K, greedy and
# sampled, with and without emulated latency, `vkswarm pipeline` prints
# exactly what `vkswarm generate --prompts` prints. Then the faults: a rank
# killed (-9) or stopped (SIGSTOP) mid-run or during start-up, a rank that
# resumes after a stop, ranks with different models, a KV cache that does
# not fit. Every mpirun runs under `timeout`; stopped ranks are killed.
# Usage: test_pipeline.sh BUILD_DIR
set -uo pipefail
bin=${1:?build dir}/vkswarm
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'release_stopped; rm -rf "$tmp"' EXIT
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

# Stage counts S and micro-batch counts K, as S:K pairs: every pair for greedy decoding; for
# sampling, whose draws depend on the sequence and step only (the sampler runs on the last
# stage, the host code is greedy's), one K per S plus S = 3, K = 3.
# VKSWARM_TEST_SHORT (tools/test's ASan run): three greedy pairs and one sampled pair, no
# timed overlap case (a speed property, which ASan's slowdown says nothing about), one rollout
# case, four of the six faults (one of each kind: killed, stopped mid-run, stopped at launch,
# stopped at start-up), and not the explicit partition, f16 wire, blame cascade and resumed
# rank cases; the normal build runs all.
short=${VKSWARM_TEST_SHORT:-}
for mode in greedy sampled; do
    if [ $mode = greedy ]; then samp="--temp 0"; else samp="--temp 0.9 --top-p 0.9 --top-k 50 --seed 7"; fi
    ref=$tmp/ref_$mode.jsonl
    $bin generate $model --prompts "$tmp/prompts.txt" $samp -n 48 > "$ref" 2>/dev/null || bad "generate $mode"
    if [ $mode = greedy ]; then pairs="1:1 1:2 1:3 2:1 2:2 2:3 3:1 3:2 3:3"; else pairs="1:3 2:2 3:1 3:3"; fi
    if [ -n "$short" ]; then
        if [ $mode = greedy ]; then pairs="1:1 2:3 3:3"; else pairs="3:3"; fi
    fi
    for SK in $pairs; do
        S=${SK%:*} K=${SK#*:}
        check_same "S=$S K=$K $mode" "$ref" -np $S $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 \
            --micro-batches $K --chunk 16
    done
    if [ -z "$short" ] || [ $mode = greedy ]; then
        check_same "S=2 K=4 batch 2 latency 30ms $mode" "$ref" -np 2 $bin pipeline $model --prompts "$tmp/prompts.txt" \
            $samp -n 48 --micro-batches 4 --batch 2 --link-latency-ms 30 --link-mbps 50
        check_same "S=3 auto partition $mode" "$ref" -np 3 $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 \
            --partition auto
    fi
done
[ -z "$short" ] && check_same "S=3 partition 1,2,3" "$tmp/ref_greedy.jsonl" -np 3 $bin pipeline $model \
    --prompts "$tmp/prompts.txt" --temp 0 -n 48 --partition 1,2,3

# every architecture (convert's --arch): Qwen3 (q/k norms, head_dim 32 on dim 64), Llama 3.1 (RoPE
# scaling), Qwen2 (biases): two stages print what one rank prints
for arch in qwen3:64,160,4,4,2,300,128,32 llama3:64,160,4,4,2,300,128 qwen2:64,160,4,4,2,300,128; do
    [ -n "$short" ] && [ "${arch%%:*}" != qwen3 ] && continue
    am="--random-model ${arch#*:} --arch ${arch%%:*}"
    $bin generate $am --prompts "$tmp/prompts.txt" --temp 0 -n 24 > "$tmp/ref_arch.jsonl" 2>/dev/null ||
        bad "generate ${arch%%:*}"
    check_same "S=2 K=2 ${arch%%:*}" "$tmp/ref_arch.jsonl" -np 2 $bin pipeline $am --prompts "$tmp/prompts.txt" \
        --temp 0 -n 24 --micro-batches 2 --chunk 16
done

# the chat flags: pipeline feeds exactly the ids generate feeds for the same flags (tiny's own
# byte-level tokenizer renders the chatml markers as text, which is all this needs); without a
# tokenizer they are refused
$bin convert --init tiny --out "$tmp/tiny.gguf" > /dev/null 2>&1 || bad "convert --init tiny"
printf 'Once upon a time\nThe cat sat\n' > "$tmp/chat.txt"
chat=(--model "$tmp/tiny.gguf" --prompts "$tmp/chat.txt" --chat-template chatml --system "Be brief." --temp 0 -n 110)
$bin generate "${chat[@]}" > "$tmp/ref_chat.jsonl" 2>/dev/null || bad "generate --chat-template chatml"
if grep -q '"text":"<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nOnce upon a time<|im_end|>' \
    "$tmp/ref_chat.jsonl"; then
    check_same "S=2 K=2 --chat-template chatml --system: generate's ids and text" "$tmp/ref_chat.jsonl" -np 2 \
        $bin pipeline "${chat[@]}" --micro-batches 2
else bad "generate --chat-template chatml --system: the rendered prompt"; head -c 300 "$tmp/ref_chat.jsonl"; fi
mpi -np 1 $bin pipeline $model --prompts "$tmp/prompts.txt" --chat-template chatml > /dev/null 2> "$tmp/err.txt"
st=$?
if [ $st = 2 ] && grep -q -- "--chat-template needs the model's tokenizer" "$tmp/err.txt"; then
    ok "--chat-template without a tokenizer refused (status 2)"
else bad "--chat-template without a tokenizer: status $st"; tail -3 "$tmp/err.txt"; fi

# rollouts: the last stage's TOPLOC proofs make the same file as one rank's (but for the
# stage commitments, the last field of each record: one per stage that hands on), and it verifies
samp="--temp 0.9 --top-p 0.9 --seed 11"
$bin generate $model --prompts "$tmp/prompts.txt" $samp -n 48 --rollouts-out "$tmp/r_gen.jsonl" > /dev/null 2>&1 ||
    bad "generate --rollouts-out"
without_stages() { sed 's/,"stage_proofs":\[.*\]}$/}/' "$1"; }
rollout_ss="2 3"
[ -n "$short" ] && rollout_ss=3
n_prompts=$(wc -l < "$tmp/prompts.txt")
for S in $rollout_ss; do
    if mpi -np $S $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 --micro-batches 2 \
           --rollouts-out "$tmp/r_$S.jsonl" > /dev/null 2>&1 && without_stages "$tmp/r_$S.jsonl" | cmp -s - "$tmp/r_gen.jsonl" &&
       [ "$(grep -o '{"rank":[0-9]*,"layers":\[[0-9]*,[0-9]*\],"proofs":"' "$tmp/r_$S.jsonl" | wc -l)" = $(((S - 1) * n_prompts)) ] &&
       $bin verify $model --rollouts "$tmp/r_$S.jsonl" --cpu > /dev/null 2>&1; then
        ok "S=$S rollouts equal one rank's, with $((S - 1)) stage commitment(s) each, and verify"
    else bad "S=$S rollouts"; fi
done

# the f16 KV cache (issue 28): three stages make the rollout file one rank makes with it (stage
# commitments aside; "kv_type":"f16" in the header) and it verifies (GPU and --cpu replay an f16 cache)
$bin generate $model --prompts "$tmp/prompts.txt" $samp -n 48 --kv-type f16 --rollouts-out "$tmp/r_gen16.jsonl" \
    > /dev/null 2>&1 || bad "generate --kv-type f16 --rollouts-out"
if mpi -np 3 $bin pipeline $model --prompts "$tmp/prompts.txt" $samp -n 48 --micro-batches 2 --kv-type f16 \
       --rollouts-out "$tmp/r_16.jsonl" > /dev/null 2>&1 && without_stages "$tmp/r_16.jsonl" | cmp -s - "$tmp/r_gen16.jsonl" &&
   head -1 "$tmp/r_16.jsonl" | grep -q '"kv_type":"f16"' && $bin verify $model --rollouts "$tmp/r_16.jsonl" > /dev/null 2>&1 &&
   $bin verify $model --rollouts "$tmp/r_16.jsonl" --cpu > /dev/null 2>&1; then
    ok "S=3 f16 KV cache rollouts equal one rank's and verify"
else bad "S=3 f16 KV cache rollouts"; fi

# LoRA (issue 25): two stages, each with the adapter's matrices of its layers, write the rollouts of
# one rank's generate --lora; they verify with the adapter and are rejected without it
"$bin" convert $model --out "$tmp/base.bin" > /dev/null 2>&1 && "${1}/tests/lora_adapter" "$tmp/base.bin" "$tmp/adapter" &&
    $bin generate --model "$tmp/base.bin" --lora "$tmp/adapter" --prompts "$tmp/prompts.txt" $samp -n 48 \
        --rollouts-out "$tmp/r_lora_gen.jsonl" > /dev/null 2>&1 || bad "generate --lora"
if mpi -np 2 $bin pipeline --model "$tmp/base.bin" --lora "$tmp/adapter" --prompts "$tmp/prompts.txt" $samp -n 48 \
       --micro-batches 2 --rollouts-out "$tmp/r_lora.jsonl" > /dev/null 2>&1 &&
   without_stages "$tmp/r_lora.jsonl" | cmp -s - "$tmp/r_lora_gen.jsonl" &&
   $bin verify --model "$tmp/base.bin" --lora "$tmp/adapter" --rollouts "$tmp/r_lora.jsonl" --cpu > /dev/null 2>&1 &&
   { $bin verify --model "$tmp/base.bin" --rollouts "$tmp/r_lora.jsonl" --cpu > "$tmp/v_lora.txt" 2>&1; [ $? = 2 ]; } &&
   grep -q "rejected: the rollout file names another model" "$tmp/v_lora.txt"; then
    ok "S=2 --lora rollouts equal one rank's generate --lora, verify with the adapter, rejected without"
else bad "S=2 --lora"; fi

# Stage commitments (issue 27): a cheating middle stage is named. vkswarm-faulty is vkswarm with
# the test-only fault switch (mpi/pipeline_fault.h); VKSWARM_TEST_FAULT=1:KIND makes rank 1 (layers
# [2,4) of 6) skip a layer, perturb what it hands on by 1%, or hold f16 weights. Honest 3-stage
# rollouts pass at the strict thresholds on the GPU path (lavapipe) and --cpu: N of N.
faulty=${1:?build dir}/tests/vkswarm-faulty
n_stage=200
[ -n "$short" ] && n_stage=24
awk -v n=$n_stage 'BEGIN { s = 5; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; len = 1 + s % 11;
    line = ""; for (k = 0; k < len; k++) { s = (s * 1103515245 + 12345) % 2147483648; line = line (k ? " " : "") (3 + s % 290) }
    print line } }' > "$tmp/stage_prompts.txt"
strict="--max-exp-mismatches 2 --max-mant-mean 0.25 --max-mant-median 0"
stage_run() { # name fault(or "") output [pipeline args]; $stage_x: one more variable for the ranks
    local name=$1 fault=$2 out=$3
    shift 3
    VKSWARM_TEST_FAULT=$fault mpi -x VKSWARM_TEST_FAULT ${stage_x:+-x $stage_x} -np 3 $faulty pipeline $model --prompts "$tmp/stage_prompts.txt" \
        $samp -n 48 --rollouts-out "$out" "$@" > /dev/null 2> "$tmp/stage_err.txt" || { bad "$name: pipeline failed"; tail -3 "$tmp/stage_err.txt"; return 1; }
}
verdicts() { # rollouts verify-args...: the verdict lines
    local r=$1
    shift
    $bin verify $model --rollouts "$r" "$@" 2> /dev/null
}
named() { grep -c "	rejected: stage 1 (rank 1, layers \[2,4)): TOPLOC chunk" || true; }
if stage_run "honest" "" "$tmp/s_honest.jsonl"; then
    for how in --cpu ""; do
        acc=$(verdicts "$tmp/s_honest.jsonl" $how $strict | grep -c "	accepted$")
        if [ "$acc" = $n_stage ]; then ok "honest 3-stage rollouts: $acc of $n_stage accepted (strict, ${how:-GPU})"
        else bad "honest 3-stage rollouts: $acc of $n_stage accepted (strict, ${how:-GPU})"; fi
    done
fi
# other subgroup sizes on the generating ranks (4 and 32 lanes, as small and large GPUs have), the
# verifier at lavapipe's default 8 and on --cpu: every stage's commitment still holds (strict)
for width in 128 1024; do
    [ -n "$short" ] && break
    if LP_NATIVE_VECTOR_WIDTH=$width stage_x=LP_NATIVE_VECTOR_WIDTH stage_run "honest lp$width" "" "$tmp/s_lp$width.jsonl"; then
        for how in --cpu ""; do
            acc=$(verdicts "$tmp/s_lp$width.jsonl" $how $strict | grep -c "	accepted$")
            if [ "$acc" = $n_stage ]; then ok "honest 3-stage rollouts at LP_NATIVE_VECTOR_WIDTH=$width: $acc of $n_stage accepted (strict, ${how:-GPU})"
            else bad "honest 3-stage rollouts at LP_NATIVE_VECTOR_WIDTH=$width: $acc of $n_stage accepted (strict, ${how:-GPU})"; fi
        done
    fi
done
# f16 on the wire: each stage commits what it sent (f16); TOPLOC's thresholds accept all (the
# strict profile assumes an f32 wire: measured 199 of 200 there, an exponent rounded the other way)
if [ -z "$short" ] && stage_run "honest f16 wire" "" "$tmp/s_w16.jsonl" --wire f16; then
    acc=$(verdicts "$tmp/s_w16.jsonl" --cpu | grep -c "	accepted$")
    if [ "$acc" = $n_stage ]; then ok "honest 3-stage rollouts, f16 wire: $acc of $n_stage accepted"
    else bad "honest 3-stage rollouts, f16 wire: $acc of $n_stage accepted"; fi
fi
# a layer skipped: caught at TOPLOC's own thresholds, every sample naming stage 1 (rank 1)
if stage_run "skip-layer" 1:skip-layer "$tmp/s_skip.jsonl"; then
    for how in --cpu ""; do
        n=$(verdicts "$tmp/s_skip.jsonl" $how | named)
        if [ "$n" = $n_stage ]; then ok "rank 1 skipping a layer: $n of $n_stage rejected naming stage 1 (rank 1) (${how:-GPU})"
        else bad "rank 1 skipping a layer: $n of $n_stage named (${how:-GPU})"; verdicts "$tmp/s_skip.jsonl" $how | head -3; fi
    done
fi
# 1% perturbation: caught at the strict thresholds (TOPLOC's let most through, as for the final proofs)
if stage_run "perturb" 1:perturb "$tmp/s_pert.jsonl"; then
    n=$(verdicts "$tmp/s_pert.jsonl" --cpu $strict | named)
    d=$(verdicts "$tmp/s_pert.jsonl" --cpu | named)
    if [ "$n" = $n_stage ]; then ok "rank 1 perturbing by 1%: $n of $n_stage named at the strict thresholds ($d at TOPLOC's)"
    else bad "rank 1 perturbing by 1%: $n of $n_stage named (strict)"; verdicts "$tmp/s_pert.jsonl" --cpu $strict | head -3; fi
fi
# f16 weights claimed as f32: below bf16 resolution, as for the final proofs (README); reported,
# and an honest stage is never named
if [ -z "$short" ] && stage_run "f16" 1:f16 "$tmp/s_f16.jsonl"; then
    verdicts "$tmp/s_f16.jsonl" --cpu $strict > "$tmp/f16_verdicts.txt"
    n=$(named < "$tmp/f16_verdicts.txt")
    if ! grep -q "rejected: stage 0" "$tmp/f16_verdicts.txt"; then
        ok "rank 1 with f16 weights: $n of $n_stage named at the strict thresholds (not detectable; stage 0 never named)"
    else bad "rank 1 with f16 weights: an honest stage named"; grep "rejected: stage 0" "$tmp/f16_verdicts.txt" | head -3; fi
fi

# f16 on the wire: runs; how many tokens differ from f32 is reported, not required to be 0
if [ -n "$short" ]; then :
elif mpi -np 2 $bin pipeline $model --prompts "$tmp/prompts.txt" --temp 0 -n 48 --wire f16 > "$tmp/f16.jsonl" 2>/dev/null; then
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
if [ -z "$short" ]; then
t1=$(run_time --micro-batches 1)
t3=$(run_time --micro-batches 3)
if [ "$(echo "$t3 < 0.6 * $t1" | bc)" = 1 ]; then ok "overlap: K=3 ${t3}s vs K=1 ${t1}s"
else bad "overlap: K=3 ${t3}s vs K=1 ${t1}s"; fi
fi

# Faults: a rank killed (-9) or stopped (SIGSTOP) mid-run (at its 10th step of 120 x 7 rows), or
# stopped during start-up (before MPI_Init, or just after it): every rank exits within
# --timeout-s plus a few seconds, non-zero, and the stopped rank is the only one blamed (a rank
# stopped before MPI_Init cannot be named: the others say that a rank did not join). The rank
# signals itself at that point (VKSWARM_TEST_SIGNAL, tests/mpi/common.sh), not after a delay.
fault_run() { # rank KILL|STOP when(init|started|step:N) timeout-s
    local rank=$1 sig=$2 when=$3 t=$4 pid="" rc=0 name="rank $1 $2 at $3"
    local how=$([ "$sig" = STOP ] && echo stop || echo kill)
    rm -f "$tmp/fault.txt" # not an earlier case's (wait_signalled)
    VKSWARM_TEST_SIGNAL=$rank:$how:$when mpi -x VKSWARM_TEST_SIGNAL -np 3 $bin pipeline $model --prompts "$tmp/prompts.txt" \
        --temp 0 -n 120 --link-latency-ms 300 --timeout-s "$t" > /dev/null 2> "$tmp/fault.txt" &
    local job=$!
    wait_signalled "$tmp/fault.txt" $job && pid=$sig_pid
    local stopped_at=$(date +%s.%N)
    wait $job
    rc=$?
    local took=$(echo "$(date +%s.%N) - $stopped_at" | bc)
    release_stopped
    local named=no
    if [ "$sig" = KILL ]; then grep -q "rank $rank" "$tmp/fault.txt" && named=yes
    elif [ "$when" = init ]; then
        grep -q "a rank did not join" "$tmp/fault.txt" && ! grep -q "rank [0-9]* \(did not answer\|stopped answering\)" "$tmp/fault.txt" &&
            named="(before MPI_Init)"
    elif blames_only "$rank" "$tmp/fault.txt"; then named=yes
    fi
    if [ -n "$pid" ] && [ $rc -ne 0 ] && [ "$(echo "$took <= $t + 8" | bc)" = 1 ] && [ "$named" != no ]; then
        ok "$name: the others exited ${took}s later with status $rc, rank named: $named"
    else bad "$name: pid '$pid' status $rc after ${took}s, rank named: $named"; grep vkswarm "$tmp/fault.txt" | tail -5; fi
}
# --timeout-s 10, which bounds MPI_Init too: with 3 (and 5) MPI_Init itself timed out now and
# then on a loaded machine (other MPI jobs beside), before the fault
fault_run 1 KILL step:10 10
fault_run 1 STOP step:10 10
fault_run 1 STOP init 10
[ -z "$short" ] && fault_run 2 STOP init 10
[ -z "$short" ] && fault_run 1 STOP started 10
fault_run 2 STOP started 10

# The blame cascade of start-up exchanges, made deterministic: rank 1's parts of two exchanges
# reach rank 0 only, so rank 0 waits on rank 2 in the second while rank 2 waits on rank 1 in
# the first. Rank 0 asks rank 2 whom it waits for and names rank 1, never the live rank 2.
blame=${1:?build dir}/tests/exchange_blame
if [ -n "$short" ]; then :
elif mpi -np 3 "$blame" > "$tmp/blame.txt" 2>/dev/null; [ "$(grep -c "^rank 0: ok" "$tmp/blame.txt")" = 1 ] &&
   grep -q "^rank 0: rank 1 did not answer within .* (exchange B; rank 2 waits on it too)" "$tmp/blame.txt" &&
   blames_only 1 "$tmp/blame.txt"; then
    ok "start-up exchanges: a rank waiting on a live rank that waits on a silent one names the silent one"
else bad "blame cascade"; cat "$tmp/blame.txt"; fi

if [ -z "$short" ]; then
# A rank stopped (at its 10th step) for 8 s, longer than its own --timeout-s 6 (but not the
# others' 30), blames nobody when it resumes: that time is left out of its silence clocks, and the
# job completes with the usual output. The stop stays under 10 s: the validation layer gives up on
# a fence it waits for after 10 s of steady_clock, which counts a stop too ("UNASSIGNED-VkFence-
# state-timeout ... most likely a validation bug", then VUID-vkResetFences-pFences-01123): with a
# 12 s stop that failed once in 5 stress runs of the MPI suites (two busy loops beside); at 8 s,
# 12 of 12 runs of this case passed under the same load. (Its --timeout-s, which bounds MPI_Init too, was 4
# once: tight for a loaded machine's start-up.)
args="$model --prompts $tmp/prompts.txt --temp 0 -n 48 --link-latency-ms 50"
VKSWARM_TEST_SIGNAL=1:stop:step:10 mpi -x VKSWARM_TEST_SIGNAL -np 1 $bin pipeline $args --timeout-s 30 : \
    -np 1 $bin pipeline $args --timeout-s 6 : -np 1 $bin pipeline $args --timeout-s 30 \
    > "$tmp/resumed.jsonl" 2> "$tmp/resumed.txt" &
job=$!
pid=""
wait_signalled "$tmp/resumed.txt" $job && pid=$sig_pid && sleep 8 && kill -CONT "$pid"
wait $job
rc=$?
release_stopped
if [ -n "$pid" ] && [ $rc -eq 0 ] && cmp -s "$tmp/resumed.jsonl" "$tmp/ref_greedy.jsonl"; then
    ok "rank 1 stopped 8 s, past its 6 s timeout, and resumed: nobody blamed, same output"
else bad "rank 1 stopped and resumed: pid '$pid' status $rc"; grep vkswarm "$tmp/resumed.txt" | tail -3; fi
fi

# different models on different ranks: refused (status 2), naming the rank and both model hashes
# (the check vkswarm rl makes too: vks_mpi_check_ranks)
mpi -np 1 $bin pipeline $model --prompts "$tmp/prompts.txt" -n 8 : \
    -np 1 $bin pipeline --random-model 64,160,6,4,2,301,128 --prompts "$tmp/prompts.txt" -n 8 \
    > /dev/null 2> "$tmp/mm.txt"
rc=$?
if [ $rc -eq 2 ] && grep -q "rank 1 loaded a different model than rank 0: model hash [0-9a-f]\{64\} on rank 1, [0-9a-f]\{64\} on rank 0" "$tmp/mm.txt"; then
    ok "model mismatch refused (status 2), naming rank 1 and both hashes"
else bad "model mismatch: status $rc"; cat "$tmp/mm.txt"; fi

# KV cache too large: refused at start with the bytes needed and available
if mpi -np 2 $bin pipeline --random-model 64,160,6,4,2,300,1000000 --prompts "$tmp/prompts.txt" -n 1000000 \
       --batch 4000 > /dev/null 2> "$tmp/kv.txt"; then bad "oversized KV accepted"
elif grep -q "needs" "$tmp/kv.txt" && grep -q "available\|allows" "$tmp/kv.txt"; then ok "oversized KV refused"
else bad "oversized KV message"; cat "$tmp/kv.txt" | tail -3; fi

echo "pipeline: $passed passed, $failed failed"
[ $failed -eq 0 ]
