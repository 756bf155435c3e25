#!/usr/bin/env bash
# Machines joining a running RL run (issue 37; mpi/rl_join.h), started the
# way users start them: the run under `vkswarm mpirun --join` (which starts
# Open MPI's ompi-server) with `rl --join` and one inference rank; joiners
# are `vkswarm join --run OUT/join.uri` processes of their own (singletons).
# One run: a joiner comes in mid-run (past step 1, so the weights reach it
# over its connection) and produces batches; it is killed (SIGKILL), dropped
# within --timeout-s, and the same command joins again as a new rank that
# produces batches too (the same key: a kill is no ban); a joiner holding
# another model (a checkpoint of this run) is refused naming both hashes; the
# run admits only the keys of --join-allow: another key is refused; a joiner
# that cheats (the test-only --test-garbage: a token outside the vocabulary)
# is refused, its key banned, and its rejoin refused naming why; metrics count
# joins, leaves and bans. At async level 0 every step's sampler
# log-probabilities equal the trainer's (below 1e-4): the joined ranks
# generated with the weights the trainer trained. After the run, join.uri is
# gone, and a join line of the dead run fails within its timeout.
# Usage: test_join.sh BUILD_DIR
set -uo pipefail
bin=${1:?build dir}/vkswarm
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
joiners=()
# the main shell only ($BASHPID): once, in a fresh clone, this directory vanished mid-run after bash
# said "line 1: wait_for: No record of process" (NOTES.md, Next: flaky tests): a subshell that ran this trap
# (a stray signal between fork and exec) would explain both
trap '[ "$BASHPID" = $$ ] || exit; for p in "${joiners[@]}"; do kill -9 "$p" 2>/dev/null; done; [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
# the joiners talk TCP over loopback only, as the run's ranks do (mpi_run's options)
export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo

for i in $(seq 0 7); do echo "{\"prompt\": \"$i+$((i + 1))=\", \"answer\": \"$((2 * i + 1))\", \"task_type\": \"numeric\"}"; done \
    > "$tmp/tasks.jsonl"
for k in k1 k2 k3; do "$bin" keygen --out "$tmp/$k" > /dev/null 2>&1 || bad "keygen $k"; done
{ echo "# contributors"; echo "$(cat "$tmp/k1/shardcast.pub") alice"; echo; cat "$tmp/k2/shardcast.pub"; } > "$tmp/allow"
# lr 1e-6: the policy stays near the start, so its groups keep the length targets' signal for the whole run
cat > "$tmp/run.json" <<EOF
{"task": "file:$tmp/tasks.jsonl", "init": "tiny", "out": "$tmp/out", "steps": 40, "prompts_per_step": 2, "group_size": 4,
 "async_level": 0, "max_new_tokens": 12, "length_targets": [4, 12], "lr": 1e-6, "save_every": 4,
 "roles": {"orchestrator": 0, "trainer": 0, "inference": [[1]]}}
EOF

# join_mpirun SECONDS ARGS...: `vkswarm mpirun --join` (it starts the run's ompi-server) over loopback
# under timeout, as mpi_run; exec: started with &, $! is timeout's pid (its child: vkswarm mpirun)
join_mpirun() {
    local t=$1
    shift
    exec env -u MALLOC_PERTURB_ timeout -k 15 "$t" "$bin" mpirun --join ${mpi_rank_env[@]+"${mpi_rank_env[@]}"} \
        --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$@"
}

# wait_for SECONDS CONDITION...: polls the condition every 0.1 s while the run lives
wait_for() {
    local t=$1 i
    shift
    for i in $(seq 1 $((t * 10))); do
        "$@" && return 0
        kill -0 $run 2>/dev/null || { "$@"; return; }
        sleep 0.1
    done
    return 1
}
# join_until_end URI DIR RANK: a machine (key k1) joins the run ($run) until it ends; then rc (the
# run's status), rca (the joiner's), joined (the batches the run's summary counts for joined rank
# RANK, from $run_err); the joiner's stderr in DIR.err
join_until_end() {
    "$bin" join --run "$1" --key "$tmp/k1" --out "$2" --timeout-s 30 > /dev/null 2> "$2.err" &
    local j=$!
    joiners+=("$j")
    wait $run
    rc=$?
    wait "$j"
    rca=$?
    joined=$(sed -n "s/.*joined rank $3 (key [0-9a-f]*): \([0-9]*\) batches.*/\1/p" "$run_err")
}

# ---- a LoRA run takes a join: the joiner is sent the newest adapter (the GGUF LoRA file the run
# broadcasts, streamed as full weights are) and loads it on its own base. Its rollout files of a policy
# step past 0 verify with that step's adapter (`vkswarm verify --lora OUT/step-N`, lr 1e-3 so that the
# adapter moves the logits): it generated with the run's adapter, not its base. ----
# VKSWARM_TEST_ONLY=lora runs only this case.
lora_join_case() {
    sed -e 's/"lr": 1e-6,/"lr": 1e-3, "lora": {"rank": 4}, "keep": 100000,/' -e 's/"steps": 40/"steps": 100000/' \
        -e 's/"save_every": 4/"save_every": 1/' -e "s|$tmp/out\"|$tmp/out7\"|" "$tmp/run.json" > "$tmp/run7.json"
    grep -q '"lora": {"rank": 4}' "$tmp/run7.json" || bad "run7.json: no LoRA"
    run_err=$tmp/run7.err
    join_mpirun 240 -np 2 "$bin" rl --config "$tmp/run7.json" --join --eval-n 0 --timeout-s 30 > /dev/null 2> "$run_err" &
    run=$!
    wait_for 120 test -s "$tmp/out7/join.uri" || bad "the LoRA run opened no join point"
    "$bin" join --run "$tmp/out7/join.uri" --key "$tmp/k1" --out "$tmp/jl" --timeout-s 30 > /dev/null 2> "$tmp/jl.err" &
    jl=$!
    joiners+=("$jl")
    past_step0() { [ "$(cat "$tmp"/jl/rollouts-rank2/batch-*.jsonl 2>/dev/null | grep -c '"policy_step":[1-9]')" -ge 3 ]; }
    wait_for 180 past_step0 || bad "the LoRA joiner made no batch past policy step 0"
    # a pipeline group may not join a LoRA run yet: refused, naming why
    env -u MALLOC_PERTURB_ timeout -k 15 120 "$bin" mpirun --join-run "$tmp/out7/join.uri" --oversubscribe --mca btl tcp,self \
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2 \
        "$bin" join --run "$tmp/out7/join.uri" --key "$tmp/k3" --out "$tmp/jlg" --timeout-s 30 > /dev/null 2> "$tmp/jlg.err"
    rcg=$?
    [ $rcg -eq 2 ] && grep -q "a pipeline group cannot join a LoRA run yet" "$tmp/jlg.err" &&
        ok "a pipeline group's join of a LoRA run was refused: exit 2, naming why" ||
        { bad "a pipeline group joining a LoRA run: rc $rcg"; grep -v '^ \|^-\|^$' "$tmp/jlg.err" | tail -5; }
    kill -INT "$(pgrep -P $run | head -1)"
    wait $run
    rc=$?
    for i in $(seq 1 300); do kill -0 "$jl" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$jl" 2>/dev/null && kill -INT "$jl"
    wait "$jl"
    "$bin" convert --init tiny --seed 1 --out "$tmp/tinyhf" 2> /dev/null || bad "convert --init tiny"
    n_ok=0 n_bad=0
    for f in "$tmp"/jl/rollouts-rank2/batch-*.jsonl; do
        step=$(head -1 "$f" | sed -n 's/.*"policy_step":\([0-9]*\).*/\1/p')
        dir=$(printf '%s/out7/step-%09d' "$tmp" "${step:-0}")
        [ "${step:-0}" -ge 1 ] && [ -d "$dir" ] || continue
        if "$bin" verify --model "$tmp/tinyhf" --rollouts "$f" --lora "$dir" > /dev/null 2> "$tmp/jl-verify.err"; then
            n_ok=$((n_ok + 1))
        else n_bad=$((n_bad + 1)); cat "$tmp/jl-verify.err"; fi
    done
    [ $rc -eq 130 ] && [ $n_ok -ge 1 ] && [ $n_bad -eq 0 ] && grep -q "inference rank 2 joined" "$run_err" &&
        ok "a LoRA run took a join; the joiner's $n_ok rollout files past step 0 verify with their step's adapter" ||
        { bad "the LoRA join: rc $rc, $n_ok files verified, $n_bad not"; grep "rank 2" "$run_err" | tail -5; tail -5 "$tmp/jl.err"; }
}

# ---- a trainer alone (roles.inference empty, -np 1) open to joins: its whole pool joins. It waits for the
# first joiner, trains on what joiners send, and finishes; without --join the config is refused (exit 2)
# naming the way out. VKSWARM_TEST_ONLY=alone runs only this case. ----
alone_case() {
    sed -e 's/"inference": \[\[1\]\]}/"inference": []}/' -e 's/"steps": 40/"steps": 6/' -e "s|$tmp/out\"|$tmp/out8\"|" \
        "$tmp/run.json" > "$tmp/run8.json"
    grep -q '"inference": \[\]' "$tmp/run8.json" || bad "run8.json: inference ranks left"
    "$bin" rl --config "$tmp/run8.json" --eval-n 0 > /dev/null 2> "$tmp/e8"
    rc=$?
    [ $rc -eq 2 ] && grep -q "no inference ranks (name some in roles.inference, or open the run to joins: --join)" "$tmp/e8" &&
        ok "a trainer alone without --join: refused (exit 2), naming --join" ||
        { bad "a trainer alone without --join: rc $rc"; cat "$tmp/e8"; }
    run_err=$tmp/run8.err
    join_mpirun 240 -np 1 "$bin" rl --config "$tmp/run8.json" --join --eval-n 0 --timeout-s 30 > "$tmp/run8.out" 2> "$run_err" &
    run=$!
    wait_for 120 test -s "$tmp/out8/join.uri" || bad "the trainer alone opened no join point"
    join_until_end "$tmp/out8/join.uri" "$tmp/ja8" 1
    [ $rc -eq 0 ] && [ $rca -eq 0 ] && grep -q "no inference rank yet: waiting up to [0-9]* s for one to join" "$run_err" &&
        [ "$(wc -l < "$tmp/out8/metrics.jsonl")" -eq 6 ] && grep -q "^final checkpoint: $tmp/out8/step-000000006" "$tmp/run8.out" &&
        [ "${joined:-0}" -ge 6 ] &&
        ok "a trainer alone waited for its first joiner and trained 6 steps on what it sent ($joined batches)" ||
        { bad "the trainer alone: rc $rc, the joiner's $rca, ${joined:-no} batches"; tail -5 "$run_err"; tail -3 "$tmp/ja8.err"; }
}

if [ "${VKSWARM_TEST_ONLY:-}" = alone ]; then
    alone_case
    echo "test_join: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

if [ "${VKSWARM_TEST_ONLY:-}" = lora ]; then
    lora_join_case
    echo "test_join: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

# ---- refusals before any work ----
"$bin" rl --config "$tmp/run.json" --join > /dev/null 2> "$tmp/e0"
rc=$?
[ $rc -eq 2 ] && grep -q "mpirun" "$tmp/e0" && ok "rl --join without mpirun: exit 2" ||
    { bad "rl --join without mpirun: rc $rc"; cat "$tmp/e0"; }
mpi_run 60 -np 2 "$bin" rl --config "$tmp/run.json" --join > /dev/null 2> "$tmp/e1"
rc=$?
[ $rc -eq 2 ] && grep -q "no ompi-server" "$tmp/e1" && ok "rl --join under mpirun without an ompi-server: exit 2" ||
    { bad "rl --join without an ompi-server: rc $rc"; cat "$tmp/e1"; }

# ---- the run ----
run_err=$tmp/run.err
join_mpirun 240 -np 2 "$bin" rl --config "$tmp/run.json" --join --join-allow "$tmp/allow" --eval-n 0 --timeout-s 5 \
    > "$tmp/run.out" 2> "$run_err" &
run=$!
steps_at_least() { [ -s "$tmp/out/metrics.jsonl" ] && [ "$(wc -l < "$tmp/out/metrics.jsonl")" -ge "$1" ]; }
batches_of() { find "$tmp/j/rollouts-rank$1" -name 'batch-*.jsonl' 2>/dev/null | wc -l; }
has_batches() { [ "$(batches_of "$1")" -ge "$2" ]; }

wait_for 120 steps_at_least 2 || bad "the run did not reach step 2"
cp "$tmp/out/join.uri" "$tmp/join.line" 2>/dev/null
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k1" --out "$tmp/j" --timeout-s 5 > /dev/null 2> "$tmp/j1.err" &
j1=$!
joiners+=("$j1")
wait_for 60 has_batches 2 1
kill -9 "$j1" 2>/dev/null
wait "$j1" 2>/dev/null
grep -q "admitted as rank 2 of the run (policy step [1-9]" "$tmp/j1.err" && has_batches 2 1 &&
    ok "a joiner came in past step 1 and generated" || { bad "the first joiner"; cat "$tmp/j1.err"; }
wait_for 30 grep -q "inference rank 2 dropped" "$run_err" && ok "the killed joiner was dropped" ||
    bad "the killed joiner was not dropped"
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k1" --out "$tmp/j" --timeout-s 5 > /dev/null 2> "$tmp/j2.err" &
j2=$!
joiners+=("$j2")
# a checkpoint of this run is another model
wait_for 60 test -s "$tmp/out/step-000000004/model.safetensors" || bad "no checkpoint at step 4"
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k1" --out "$tmp/j3" --model "$tmp/out/step-000000004" --timeout-s 5 > /dev/null \
    2> "$tmp/j3.err"
rc=$?
[ $rc -eq 2 ] && grep -Eq "another model: its hash [0-9a-f]{64}, the run's [0-9a-f]{64}" "$tmp/j3.err" &&
    ok "a joiner with another model was refused naming both hashes" || { bad "another model: rc $rc"; cat "$tmp/j3.err"; }
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k3" --out "$tmp/j5" --timeout-s 5 > /dev/null 2> "$tmp/j5.err"
rc=$?
[ $rc -eq 2 ] && grep -q "key $(cat "$tmp/k3/shardcast.pub") is not in the run's join.allow" "$tmp/j5.err" &&
    ok "a key not in join.allow was refused" || { bad "join.allow: rc $rc"; cat "$tmp/j5.err"; }
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k2" --out "$tmp/j6" --timeout-s 5 --test-garbage > /dev/null \
    2> "$tmp/j6.err"
rc=$?
[ $rc -eq 2 ] && grep -q "the run refused this machine: batch [0-9]*: .*outside the vocabulary" "$tmp/j6.err" &&
    ok "a cheating joiner was refused" || { bad "the cheater: rc $rc"; cat "$tmp/j6.err"; }
k2=$(cut -c1-16 "$tmp/k2/shardcast.pub")
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k2" --out "$tmp/j7" --timeout-s 5 > /dev/null 2> "$tmp/j7.err"
rc=$?
[ $rc -eq 2 ] && grep -q "key $k2 was banned at step [0-9]*: batch [0-9]*: " "$tmp/j7.err" &&
    ok "the banned key's rejoin was refused naming why" || { bad "the banned rejoin: rc $rc"; cat "$tmp/j7.err"; }
wait $run
rc=$?
wait "$j2"
rc2=$?
[ $rc -eq 0 ] && ok "the run finished" || { bad "the run: rc $rc"; tail -20 "$run_err"; }
[ $rc2 -eq 0 ] && grep -q "the run said stop" "$tmp/j2.err" && ok "the rejoined machine left when the run ended" ||
    { bad "the rejoined machine: rc $rc2"; cat "$tmp/j2.err"; }
joined3=$(sed -n 's/.*joined rank 3 (key [0-9a-f]*): \([0-9]*\) batches.*/\1/p' "$run_err")
[ "${joined3:-0}" -ge 1 ] && [ "$(batches_of 3)" -ge 1 ] && ok "the rejoined machine's batches were accepted ($joined3)" ||
    { bad "the rejoined machine made no accepted batch"; grep "joined" "$run_err"; }
grep -q "inference rank 4 refused: another model" "$run_err" && ok "the run named the refused joiner" ||
    bad "the run did not name the refused joiner"
mismatch_ok() {
    awk '{ if (!match($0, /"logp_mismatch":[0-9.]+(e-?[0-9]+)?/)) exit 1
           v = substr($0, RSTART + 16, RLENGTH - 16) + 0; if (v >= 1e-4) exit 1 }' "$1"
}
[ "$(wc -l < "$tmp/out/metrics.jsonl")" -eq 40 ] && mismatch_ok "$tmp/out/metrics.jsonl" &&
    ok "40 steps, the sampler's logp equal to the trainer's on each (k = 0)" ||
    { bad "metrics"; cat "$tmp/out/metrics.jsonl" | head -5; }
# three joins admitted (rank 2, killed; rank 3; the cheater, rank 6), two left, one banned
tail -1 "$tmp/out/metrics.jsonl" | grep -q '"joins":3,"leaves":2,"bans":1' && ok "metrics: joins 3, leaves 2, bans 1" ||
    { bad "metrics: joins"; tail -1 "$tmp/out/metrics.jsonl"; }
# per identity: k1's two joins (ranks 2 and 3) on one line; k2's batch refused
metric() { tail -1 "$tmp/out/metrics.jsonl" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
k1=$(cut -c1-16 "$tmp/k1/shardcast.pub")
[ -n "$(metric "key.$k1.batches_accepted")" ] &&
    [ "$(metric "key.$k1.batches_accepted")" -eq $(($(metric rank2.batches) + $(metric rank3.batches))) ] &&
    [ "$(metric "key.$k1.batches_rejected")" = 0 ] && [ "$(metric "key.$k2.batches_rejected")" = 1 ] &&
    ok "metrics per key: $(metric "key.$k1.batches_accepted") batches of $k1 over its two joins, one refused of $k2" ||
    { bad "metrics per key"; tail -1 "$tmp/out/metrics.jsonl"; }
grep -q "joined rank 6 (key $k2): .*, banned; " "$run_err" && ok "the summary names the banned key" ||
    { bad "the summary"; grep "joined rank" "$run_err"; }

# ---- after the run ----
[ ! -e "$tmp/out/join.uri" ] && ok "join.uri removed at the end" || bad "join.uri left behind"
"$bin" join --run "$tmp/out/join.uri" --out "$tmp/j4" > /dev/null 2> "$tmp/j4.err"
rc=$?
[ $rc -eq 2 ] && grep -q "no such file" "$tmp/j4.err" && ok "join of an ended run (no join.uri): exit 2" ||
    { bad "join without join.uri: rc $rc"; cat "$tmp/j4.err"; }
t0=$SECONDS
timeout -k 5 60 "$bin" join --run "$tmp/join.line" --out "$tmp/j5" --timeout-s 3 > /dev/null 2> "$tmp/j5.err"
rc=$?
[ $rc -eq 3 ] && [ $((SECONDS - t0)) -le 20 ] && grep -q "vkswarm: join: " "$tmp/j5.err" &&
    ok "join of a dead run's line: exit 3 in $((SECONDS - t0)) s" || { bad "join of a dead run: rc $rc"; cat "$tmp/j5.err"; }

# ---- the run resumed (rl --resume): open to joins again, and the key banned before is still banned ----
[ -s "$tmp/out/bans.jsonl" ] && grep -q "\"key\": *\"$(cat "$tmp/k2/shardcast.pub")\"" "$tmp/out/bans.jsonl" &&
    ok "the ban is in OUT/bans.jsonl" || { bad "no bans.jsonl"; ls "$tmp/out"; }
run_err=$tmp/run3.err
join_mpirun 240 -np 2 "$bin" rl --config "$tmp/run.json" --resume --steps 52 --join --eval-n 0 --timeout-s 5 \
    > /dev/null 2> "$run_err" &
run=$!
wait_for 120 test -s "$tmp/out/join.uri" || bad "the resumed run opened no join point"
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k2" --out "$tmp/j8" --timeout-s 5 > /dev/null 2> "$tmp/j8.err"
rc=$?
[ $rc -eq 2 ] && grep -q "key $k2 was banned at step [0-9]*: batch [0-9]*: " "$tmp/j8.err" &&
    ok "the resumed run refused the key banned before the resume" || { bad "the banned key, resumed: rc $rc"; cat "$tmp/j8.err"; }
"$bin" join --run "$tmp/out/join.uri" --key "$tmp/k1" --out "$tmp/j9" --timeout-s 5 > /dev/null 2> "$tmp/j9.err" &
j9=$!
joiners+=("$j9")
wait $run
rc=$?
wait "$j9"
rc9=$?
joined=$(sed -n 's/.*joined rank [0-9]* (key [0-9a-f]*): \([0-9]*\) batches.*/\1/p' "$run_err" | tail -1)
[ $rc -eq 0 ] && [ $rc9 -eq 0 ] && [ "${joined:-0}" -ge 1 ] && grep -q "resum" "$run_err" &&
    [ "$(wc -l < "$tmp/out/metrics.jsonl")" -eq 52 ] &&
    ok "the resumed run took a join ($joined accepted batches) and finished" ||
    { bad "the resumed run: rc $rc, the joiner's $rc9, ${joined:-no} batches"; tail -5 "$run_err"; cat "$tmp/j9.err"; }

# ---- a run with a verifier rank: joined ranks' batches reach it through the trainer; probation ----
# verify_sample 0.25 checks 2 of a batch's 8 completions; a key's first probation_batches = 3 accepted
# batches have all 8 replayed. An honest joiner ends its probation; a cheater (--test-cheat-every 8,
# test only: one completion a batch carries a token the sampler did not draw, which only the replay
# sees, and a 2-of-8 sample misses 54% of the time) is caught in its first batch and banned.
# Timeouts of 30 s here: with a cold shader cache this run once went 40 s without a step (three ranks
# and two joiners on two cores), and a joiner given 10 s heard nothing (its welcome unsent; the
# trainer, reaching it late, logged Open MPI's "failed to TCP connect" to the joiner that had gone).
sed -e 's/"steps": 40/"steps": 100000/' -e "s|$tmp/out\"|$tmp/out5\"|" \
    -e 's/"roles": {"orchestrator": 0, "trainer": 0, "inference": \[\[1\]\]}/"verify_sample": 0.25, "probation_batches": 3, "roles": {"orchestrator": 0, "trainer": 0, "inference": [[1]], "verifiers": [2]}/' \
    "$tmp/run.json" > "$tmp/run5.json"
grep -q '"verifiers": \[2\]' "$tmp/run5.json" || bad "run5.json: no verifier rank"
run_err=$tmp/run5.err
join_mpirun 240 -np 3 "$bin" rl --config "$tmp/run5.json" --join --eval-n 0 --timeout-s 30 > /dev/null 2> "$run_err" &
run=$!
wait_for 120 test -s "$tmp/out5/join.uri" || bad "the run with a verifier rank opened no join point"
"$bin" join --run "$tmp/out5/join.uri" --key "$tmp/k1" --out "$tmp/jv" --timeout-s 30 > /dev/null 2> "$tmp/jv.err" &
jv=$!
joiners+=("$jv")
wait_for 120 grep -q "key $k1 (rank 3): probation over, 3 batches accepted with every group replayed" "$run_err"
probation=$(grep -c "verifier rank 2: batch [0-9]* of joined rank 3: its key is on probation, every completion replayed" "$run_err")
[ "$probation" -ge 3 ] && grep -q "key $k1 (rank 3): probation over" "$run_err" &&
    ok "an honest joiner's first batches were replayed whole ($probation), then its probation ended" ||
    { bad "probation of an honest joiner ($probation batches replayed whole)"; grep "rank 3" "$run_err" | tail -5; }
"$bin" join --run "$tmp/out5/join.uri" --key "$tmp/k2" --out "$tmp/jw" --timeout-s 30 --test-cheat-every 8 > /dev/null \
    2> "$tmp/jw.err"
rc=$?
[ $rc -eq 2 ] && grep -q "the run refused this machine: batch [0-9]*: verifier rank 2 rejected 1 of its 8 completions checked, on probation" "$tmp/jw.err" &&
    grep -q "key $k2 (rank 4) banned" "$run_err" && ok "a cheating joiner was caught in its first batch, on probation, and banned" ||
    { bad "the cheater on probation: rc $rc"; cat "$tmp/jw.err"; grep "rank 4" "$run_err" | tail -5; }
# a pipeline group of two joins as one rank (rank 5): its own mpirun, given the run's ompi-server
# (--join-run); stage 0 talks to the run and passes the weights on to stage 1. Its batches carry the
# stages' proofs and reach the verifier through the trainer, every group replayed on probation.
env -u MALLOC_PERTURB_ timeout -k 15 200 "$bin" mpirun --join-run "$tmp/out5/join.uri" ${mpi_rank_env[@]+"${mpi_rank_env[@]}"} \
    --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2 \
    "$bin" join --run "$tmp/out5/join.uri" --key "$tmp/k3" --out "$tmp/jg" --timeout-s 30 > /dev/null 2> "$tmp/jg.err" &
jg=$!
joiners+=("$jg")
k3=$(cut -c1-16 "$tmp/k3/shardcast.pub")
wait_for 120 grep -q "key $k3 (rank 5): probation over" "$run_err"
[ "$(grep -c "admitted as rank 5 of the run, stage [01] of its 2" "$tmp/jg.err")" -eq 2 ] &&
    grep -q "key $k3 (rank 5): probation over, 3 batches accepted with every group replayed" "$run_err" &&
    ok "a pipeline group of two joined as one rank; its batches passed the verifier's replay" ||
    { bad "the joined pipeline group"; grep "rank 5" "$run_err" | tail -5; grep -v '^ \|^-\|^$' "$tmp/jg.err" | tail -8; }
kill -INT "$(pgrep -P $run | head -1)"
wait $run
rc=$?
# they end at the run's STOP; a signal only if they have not (to a pid that ended, it could reach another process)
for i in $(seq 1 300); do kill -0 "$jv" 2>/dev/null || kill -0 "$jg" 2>/dev/null || break; sleep 0.1; done
kill -0 "$jv" 2>/dev/null && kill -INT "$jv"
wait "$jv"
for i in $(seq 1 300); do kill -0 "$jg" 2>/dev/null || break; sleep 0.1; done
wait "$jg"
rcg=$?
[ $rcg -eq 0 ] && [ "$(grep -c "the run said stop" "$tmp/jg.err")" -eq 2 ] &&
    ok "both stages of the joined group left at the run's stop" ||
    { bad "the joined group's end: rc $rcg"; grep -v '^ \|^-\|^$' "$tmp/jg.err" | tail -8; }
[ $rc -eq 130 ] && tail -1 "$tmp/out5/metrics.jsonl" | grep -q "\"key.$k2.batches_accepted\":0,\"key.$k2.batches_rejected\":1" &&
    ok "the run with a verifier rank stopped cleanly; the cheater's key: 0 batches accepted, 1 rejected" ||
    { bad "the run with a verifier rank: rc $rc"; tail -3 "$run_err"; tail -1 "$tmp/out5/metrics.jsonl"; }

lora_join_case
alone_case

# ---- churn: 30 joins and clean leaves (SIGINT) in one run; the trainer's memory ----
# (VKSWARM_TEST_SHORT, the ASan build: 8, and no memory bound: ASan's quarantine keeps freed memory).
# This run has the validation layer without its synchronization validation, whose own bookkeeping
# grows by about 0.5 MB a second in the trainer (measured with no join at all: 16 MB over 60 s,
# 0.5 MB with it off) and would be counted as the joins' (11 MB in CI); the run above has both.
churn=30
[ "${VKSWARM_TEST_SHORT:-0}" = 1 ] && churn=8
sed -e 's/"steps": 40/"steps": 100000/' -e 's/"save_every": 4/"save_every": 100000/' -e "s|$tmp/out|$tmp/out2|" \
    "$tmp/run.json" > "$tmp/run2.json"
mkdir -p "$tmp/pids"
run_err=$tmp/run2.err
VKSWARM_VALIDATION_SYNC=0 join_mpirun 300 -x VKSWARM_PID_DIR="$tmp/pids" -x VKSWARM_VALIDATION_SYNC -np 2 \
    "$bin" rl --config "$tmp/run2.json" --join --eval-n 0 --timeout-s 5 > "$tmp/run2.out" 2> "$run_err" &
run=$!
steps_at_least() { [ -s "$tmp/out2/metrics.jsonl" ] && [ "$(wc -l < "$tmp/out2/metrics.jsonl")" -ge "$1" ]; }
# a join as soon as the join point opens, mostly before the first step: admitted at policy step 0,
# it has only its model and no policy until the trainer sends it step 0's weights (it used to wait
# for a step past 0, while the run, at async level 0, waited for its batch: 120 s, then a drop)
wait_for 120 test -s "$tmp/out2/join.uri" || bad "the churn run opened no join point"
"$bin" join --run "$tmp/out2/join.uri" --key "$tmp/k1" --out "$tmp/jc" --timeout-s 5 > /dev/null 2> "$tmp/jc.err" &
jc=$!
joiners+=("$jc")
wait_for 60 grep -q "joined rank 2: its first batch accepted" "$run_err"
kill -INT "$jc"
wait "$jc"
rc=$?
at=$(sed -n 's/.*admitted as rank 2 of the run (policy step \([0-9]*\)).*/\1/p' "$tmp/jc.err")
[ $rc -eq 130 ] && grep -q "joined rank 2: its first batch accepted" "$run_err" &&
    ok "a join when the join point opened (policy step ${at:-?}) had a batch accepted" ||
    { bad "the early join: rc $rc, policy step ${at:-?}"; cat "$tmp/jc.err"; grep "rank 2" "$run_err"; }
wait_for 120 steps_at_least 1 || bad "the churn run did not start"
trainer=$(pid_file_pid "$tmp/pids" 0)
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$trainer/status"; }
left=0
# each join's stderr in a file of its own: a file reused (jc.err) once held the last join's "admitted"
# and "said goodbye" while the next joiner, not yet started, was signalled and died before its
# redirection: counted as a clean leave that never joined (CI: joins 30 of 31)
for i in $(seq 1 $churn); do
    err=$tmp/jc$i.err
    "$bin" join --run "$tmp/out2/join.uri" --key "$tmp/k1" --out "$tmp/jc" --timeout-s 5 > /dev/null 2> "$err" &
    jc=$!
    joiners+=("$jc")
    for w in $(seq 1 300); do grep -qs "admitted as rank" "$err" && break; sleep 0.1; done
    kill -INT "$jc"
    wait "$jc"
    rc=$?
    [ $rc -eq 130 ] && grep -q "admitted as rank" "$err" && grep -q "said goodbye" "$err" && left=$((left + 1)) ||
        { echo "join $i: rc $rc"; cat "$err"; }
    [ "$i" -eq 5 ] && rss5=$(rss)
done
rss30=$(rss)
[ "$left" -eq $churn ] && ok "$churn joins, each left cleanly (exit 130, goodbye)" || bad "churn: $left of $churn left cleanly"
# ompi-server dies: the run goes on, a join fails within its timeout
# this run's: the child of its `vkswarm mpirun` (a child of timeout, $run); not another suite's on the machine
server=$(pgrep -P "$(pgrep -P $run | head -1)" -f "^ompi-server --no-daemonize --report-uri /tmp/vkswarm-ompi-server-")
[ -n "$server" ] && kill -9 "$server"
now=$(wc -l < "$tmp/out2/metrics.jsonl")
wait_for 60 steps_at_least $((now + 3)) && grep -q "vkswarm: mpirun: ompi-server ended" "$run_err" &&
    ok "ompi-server killed: vkswarm mpirun said so, the run went on" || { bad "ompi-server killed: the run"; tail -3 "$run_err"; }
t0=$SECONDS
timeout -k 5 60 "$bin" join --run "$tmp/out2/join.uri" --key "$tmp/k1" --out "$tmp/jc" --timeout-s 3 > /dev/null 2> "$tmp/jd.err"
rc=$?
[ $rc -eq 3 ] && [ $((SECONDS - t0)) -le 20 ] && ok "a join after ompi-server died: exit 3 in $((SECONDS - t0)) s" ||
    { bad "a join after ompi-server died: rc $rc in $((SECONDS - t0)) s"; cat "$tmp/jd.err"; }
# the clean stop: SIGINT to vkswarm mpirun itself ($run is timeout, which would pass it on to its
# whole process group as well: a second signal, Open MPI's abort)
kill -INT "$(pgrep -P $run | head -1)"
wait $run
rc=$?
[ $rc -eq 130 ] && ok "the churned run stopped cleanly" || { bad "the churned run: rc $rc"; tail -5 "$run_err"; }
tail -1 "$tmp/out2/metrics.jsonl" | grep -q "\"joins\":$((churn + 1)),\"leaves\":$((churn + 1)),\"bans\":0" &&
    ok "metrics: joins $((churn + 1)), leaves $((churn + 1))" || { bad "churn metrics"; tail -1 "$tmp/out2/metrics.jsonl"; }
grow=$((rss30 - rss5))
if [ "$churn" -lt 30 ]; then echo "skipped: the trainer's memory over 30 joins (VKSWARM_TEST_SHORT)"
elif [ "$grow" -lt 10240 ]; then ok "the trainer's memory grew by $grow kB from the 5th to the 30th join"
else bad "the trainer's memory grew by $grow kB from the 5th to the 30th join"; fi

# ---- the pool from nothing again: the run's only inference rank dies (SIGKILL, under
# --enable-recovery); the trainer waits for a joiner instead of ending, and goes on with it ----
if [ "${VKSWARM_TEST_SHORT:-0}" = 1 ]; then
    echo "skipped: a run left without inference ranks, joined again (VKSWARM_TEST_SHORT)"
else
    sed -e 's/"steps": 40/"steps": 16/' -e "s|$tmp/out\"|$tmp/out6\"|" "$tmp/run.json" > "$tmp/run6.json"
    run_err=$tmp/run6.err
    join_mpirun 240 --enable-recovery -np 2 "$bin" rl --config "$tmp/run6.json" --join --eval-n 0 --timeout-s 15 \
        --trainer-timeout-s 120 > /dev/null 2> "$run_err" &
    run=$!
    steps_at_least() { [ -s "$tmp/out6/metrics.jsonl" ] && [ "$(wc -l < "$tmp/out6/metrics.jsonl")" -ge "$1" ]; }
    wait_for 120 steps_at_least 2 || bad "the run to be left alone did not reach step 2"
    for p in $(pgrep -f "rl --config $tmp/run6.json"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && kill -9 "$p"
    done
    wait_for 60 grep -q "no inference rank is left: waiting up to 120 s for one to join" "$run_err"
    join_until_end "$tmp/out6/join.uri" "$tmp/ja" 2
    [ $rc -eq 0 ] && [ $rca -eq 0 ] && grep -q "an inference rank again after [0-9]* s without one" "$run_err" &&
        [ "${joined:-0}" -ge 1 ] && [ "$(wc -l < "$tmp/out6/metrics.jsonl")" -eq 16 ] &&
        ok "the run's only inference rank died; the run waited, a machine joined ($joined batches) and it finished" ||
        { bad "the run left alone: rc $rc, the joiner's $rca"; grep "inference rank\|joined" "$run_err" | tail -5; tail -3 "$tmp/ja.err"; }
fi

# ---- across network namespaces (tools/lib-netns.sh): the run's two ranks and the joiner each in
# a namespace of its own, over real TCP links through a bridge (ompi-server and mpirun in the
# root namespace), 100 ms one-way delay on every link where the kernel has netem; the join as the
# join point opens ----
. "$(dirname "$0")/../../tools/lib-netns.sh"
if [ "${VKSWARM_TEST_SHORT:-0}" = 1 ]; then
    echo "skipped: a join across network namespaces (VKSWARM_TEST_SHORT: the same code as over loopback)"
elif ! netns_permitted; then
    echo "skipped: a join across network namespaces ('ip netns' is not permitted here: needs root and CAP_NET_ADMIN)"
else
    trap '[ "$BASHPID" = $$ ] || exit; for p in "${joiners[@]}"; do kill -9 "$p" 2>/dev/null; done; netns_cleanup
          [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
    netns_setup 3
    delay="100 ms one-way delay on each link"
    for i in 0 1 2; do netns_qdisc $i netem delay 100ms 2>/dev/null || delay="no added delay: this kernel has no netem"; done
    sed -e 's/"steps": 40/"steps": 12/' -e "s|$tmp/out\"|$tmp/out4\"|" "$tmp/run.json" > "$tmp/run4.json"
    run_err=$tmp/run4.err
    links=(--mca btl tcp,self --mca btl_tcp_if_include vkslink --mca oob_tcp_if_include 10.211.0.0/24)
    rank() { echo -np 1 ip netns exec "${netns_tag}n$1" "$bin" rl --config "$tmp/run4.json" --join --eval-n 0 --timeout-s 20; }
    env -u MALLOC_PERTURB_ -u OMPI_MCA_btl_tcp_if_include -u OMPI_MCA_oob_tcp_if_include PMIX_MCA_ptl_tcp_remote_connections=1 \
        PMIX_MCA_ptl_tcp_if_include=10.211.0.0/24 timeout -k 15 240 "$bin" mpirun --join ${mpi_rank_env[@]+"${mpi_rank_env[@]}"} \
        --oversubscribe "${links[@]}" $(rank 0) : $(rank 1) > /dev/null 2> "$run_err" &
    run=$!
    wait_for 120 test -s "$tmp/out4/join.uri" || bad "the run across namespaces opened no join point"
    ip netns exec "${netns_tag}n2" env OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=vkslink \
        OMPI_MCA_oob_tcp_if_include=10.211.0.0/24 "$bin" join --run "$tmp/out4/join.uri" --key "$tmp/k1" --out "$tmp/jn" \
        --timeout-s 20 > /dev/null 2> "$tmp/jn.err" &
    jn=$!
    joiners+=("$jn")
    wait $run
    rc=$?
    wait "$jn"
    rcn=$?
    joined=$(sed -n 's/.*joined rank 2 (key [0-9a-f]*): \([0-9]*\) batches.*/\1/p' "$run_err")
    first=$(sed -n 's/.*joined rank 2: its first batch accepted, \([0-9.]*\) s after.*/\1/p' "$run_err")
    at=$(sed -n 's/.*admitted as rank 2 of the run (policy step \([0-9]*\)).*/\1/p' "$tmp/jn.err")
    [ $rc -eq 0 ] && [ $rcn -eq 0 ] && [ "${joined:-0}" -ge 1 ] &&
        ok "a join across network namespaces ($delay; admitted at policy step ${at:-?}, first batch accepted ${first:-?} s after it connected, $joined in all)" ||
        { bad "the join across namespaces: run rc $rc, joiner rc $rcn"; tail -5 "$run_err"; tail -5 "$tmp/jn.err"; }
    netns_cleanup
fi

echo "test_join: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
