#!/usr/bin/env bash
# The RL run across MPI ranks (mpi/rl_roles.c): a trainer rank and two
# inference ranks with the tiny model and short user tasks (length targets, so
# that untrained groups have signal). The happy path ends 0 with finite losses
# and a metrics line per step (k = 0: lag 0, and the sampler's log-probabilities
# on the inference ranks equal the trainer's: the weights arrived intact, through
# Shardcast and a relay rank); an
# inference rank that sends a token outside the vocabulary is named, refused,
# and the run finishes on the other; an inference rank killed (-9) mid-run is
# dropped under --enable-recovery and the run finishes on the other; ranks
# with different models are refused at start, and a rank refusing the weights
# broadcast (an adapter) is named with its reason.
# Usage: test_rl.sh BUILD_DIR
set -uo pipefail
bin=${1:?build dir}/vkswarm
cheat_bin=$1/tests/vkswarm_cheat # TEST ONLY: inference ranks that cheat (tests/rl_cheat.c)
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'release_stopped; rm -rf "$tmp"' EXIT

for i in $(seq 0 7); do echo "{\"prompt\": \"$i+$((i + 1))=\", \"answer\": \"$((2 * i + 1))\", \"task_type\": \"numeric\"}"; done \
    > "$tmp/tasks.jsonl"
config() { # OUT STEPS K [VERIFIER RANKS] [RELAY RANKS]
    cat > "$tmp/run.json" <<EOF
{"task": "file:$tmp/tasks.jsonl", "init": "tiny", "out": "$1", "steps": $2, "prompts_per_step": 2, "group_size": 4,
 "async_level": $3, "max_new_tokens": 12, "length_targets": [4, 12], "lr": 1e-3,
 "roles": {"orchestrator": 0, "trainer": 0, "inference": [[1], [2]], "verifiers": [${4:-}], "relays": [${5:-}]}}
EOF
}
# end_if_only NAME: with VKSWARM_TEST_ONLY=NAME, the cases of NAME were the run: the totals, and the end
end_if_only() {
    [ "${VKSWARM_TEST_ONLY:-}" = "$1" ] || return 0
    echo "rl across ranks: $passed passed, $failed failed"
    [ $failed -eq 0 ]
    exit
}
# own_orchestrator: the config's rank 0 orchestrates alone, rank 1 trains, rank 2 generates
own_orchestrator() {
    sed -i 's/"orchestrator": 0, "trainer": 0, "inference": \[\[1\], \[2\]\]/"orchestrator": 0, "trainer": 1, "inference": [[2]]/' "$tmp/run.json"
}
# metrics_ok FILE STEPS MAX_LAG: one line per step 1..STEPS, finite losses, lag <= MAX_LAG
metrics_ok() {
    awk -v steps="$2" -v lag="$3" '
        { if (!match($0, /"step":[0-9]+/)) exit 1; s = substr($0, RSTART + 7, RLENGTH - 7)
          if (s != NR) exit 1
          if (!match($0, /"loss":-?[0-9.]+(e-?[0-9]+)?[,}]/)) exit 1
          if (!match($0, /"policy_lag":[0-9.]+/)) exit 1; l = substr($0, RSTART + 13, RLENGTH - 13) + 0
          if (l > lag) exit 1 }
        END { if (NR != steps) exit 1 }' "$1"
}
# the sampler's logp against the trainer's, at k = 0: below 1e-4 on every step
mismatch_ok() {
    awk '{ if (!match($0, /"logp_mismatch":[0-9.]+(e-?[0-9]+)?/)) exit 1
           v = substr($0, RSTART + 16, RLENGTH - 16) + 0; if (v >= 1e-4) exit 1 }' "$1"
}
# no group went stale or off-policy (at k = 0 the trainer grants one batch at a time: a second rank's would)
stale_none() { grep -q '"off_policy_dropped":0' "$1" && ! grep -q '"groups_stale":[1-9]' "$1" && ! grep -q '"off_policy_dropped":[1-9]' "$1"; }

# the weights went through Shardcast: a line per published step (0..STEPS) naming every receiver
# and the relays, the wire bytes in every metrics line, and each receiver's version store holding
# the last step's weights (its current version: the last one sent)
# shardcast_ok ERR METRICS STEPS RECEIVERS RELAYS STORE...
shardcast_ok() {
    local err=$1 metrics=$2 steps=$3 receivers=$4 relays=$5 s
    shift 5
    for s in $(seq 0 "$steps"); do
        grep -q "shardcast: step $s (version [0-9]*): [1-9][0-9]* bytes to $receivers of $receivers ranks through $relays relay" "$err" || return 1
    done
    [ "$(grep -c '"broadcast_bytes":[1-9]' "$metrics")" = "$steps" ] || return 1
    for s in "$@"; do [ -f "$s/current/model.bin" ] || return 1; done
}


# a clean stop across ranks (docs/multi-machine.md "7."): Ctrl-C typed in the terminal of
# `vkswarm mpirun` (a pty of script(1), whose line discipline turns the byte 0x03 into SIGINT to
# the foreground process group, as a terminal does) after the trainer's "step 1" line: the
# wrapper sends mpirun SIGUSR1, mpirun passes it on to every rank, the trainer finishes the step,
# saves it and tells every rank to stop; every rank exits (status 130, not killed by timeout), the
# trainer's line names the checkpoint, and --resume continues from it to the last step. (Plain
# mpirun takes SIGINT as its abort: CONT, TERM a second later, KILL a second after; measured,
# NOTES.) VKSWARM_TEST_ONLY=stop runs only this case.
if [ -z "${VKSWARM_TEST_ONLY:-}" ] || [ "$VKSWARM_TEST_ONLY" = stop ]; then
config "$tmp/stop" 4 0
rm -f "$tmp/keys.fifo" && mkfifo "$tmp/keys.fifo"
cmd=$(printf '%q ' exec "$bin" mpirun ${mpi_rank_env[@]+"${mpi_rank_env[@]}"} --oversubscribe --mca btl tcp,self \
      --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 3 "$bin" rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60)
env -u MALLOC_PERTURB_ timeout -k 15 300 script -qefc "$cmd" /dev/null < "$tmp/keys.fifo" > "$tmp/tty.txt" 2>&1 &
job=$!
exec 7> "$tmp/keys.fifo" # the terminal's keyboard
for i in $(seq 1 2400); do grep -q "rl: step 1/4" "$tmp/tty.txt" && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
printf '\003' >&7
wait $job
rc=$?
exec 7>&-
tr -d '\r' < "$tmp/tty.txt" > "$tmp/err.txt"
at=$(sed -n "s|^vkswarm: rl: stopped at step \([0-9]*\); checkpoint $tmp/stop/step-0*[0-9]*; continue with the same mpirun command and --resume$|\1|p" "$tmp/err.txt")
if [ $rc -eq 130 ] && [ -n "$at" ] && [ "$at" -ge 1 ] && [ "$at" -lt 4 ] &&
   grep -q "vkswarm: mpirun: stopping cleanly: SIGUSR1 to every rank" "$tmp/err.txt" && # after the echoed ^C
   [ "$(grep -c "^vkswarm: stopping after this step" "$tmp/err.txt")" = 1 ] &&
   [ -f "$tmp/stop/step-$(printf %09d "$at")/state.json" ]; then
    mpi_run 300 -np 3 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --resume > "$tmp/out2.txt" 2> "$tmp/err2.txt"
    rc2=$?
    if [ $rc2 -eq 0 ] && grep -q "resumed from step $at" "$tmp/err2.txt" &&
       grep -q "^final checkpoint: $tmp/stop/step-000000004" "$tmp/out2.txt" && metrics_ok "$tmp/stop/metrics.jsonl" 4 0; then
        ok "Ctrl-C to vkswarm mpirun after step 1: every rank ended (status $rc), checkpoint of step $at, --resume went on to step 4"
    else bad "clean stop: the resume from step $at: status $rc2"; tail -5 "$tmp/err2.txt"; fi
else bad "clean stop: status $rc, stopped at '$at'"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -15; fi
end_if_only stop
fi

# Ranks with different models (issue 40). Two working directories each hold a model under the
# same relative path "model" (convert --init tiny, seeds 1 and 2: the same tokenizer, other
# weights); ranks 0 and 1 start in A, rank 2 in B (mpirun --wdir A ... : --wdir B ...). The
# start-up check compares every rank's model hash, as `vkswarm pipeline` does: the run is refused
# (status 2) before any broadcast, naming rank 2 and both hashes (it used to hang until
# --trainer-timeout-s and blame the trainer). VKSWARM_TEST_ONLY=models runs only these cases.
mkdir -p "$tmp/wdA" "$tmp/wdB"
$bin convert --init tiny --seed 1 --out "$tmp/wdA/model" 2> /dev/null &&
    $bin convert --init tiny --seed 2 --out "$tmp/wdB/model" 2> /dev/null || bad "models: convert failed"
config "$tmp/models" 2 0
sed -i 's/"init": "tiny",/"model": "model",/; s/"lr": 1e-3,/"lr": 1e-3, "lora": {"rank": 4},/' "$tmp/run.json"
rl_args=(rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --trainer-timeout-s 30)
mpi_run 300 --wdir "$tmp/wdA" -np 2 "$(realpath "$bin")" "${rl_args[@]}" : \
    --wdir "$tmp/wdB" -np 1 "$(realpath "$bin")" "${rl_args[@]}" > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
hashes=$(grep -o "^vkswarm: rl: rank 2 loaded a different model than rank 0: model hash [0-9a-f]\{64\} on rank 2, [0-9a-f]\{64\} on rank 0" "$tmp/err.txt" |
         grep -o "[0-9a-f]\{64\}" | sort -u | wc -l)
if [ $rc -eq 2 ] && [ "$hashes" = 2 ] && ! grep -q "shardcast: step\|^rl: step" "$tmp/err.txt" && [ ! -e "$tmp/models" ]; then
    ok "another model file on rank 2 (mpirun --wdir): refused at start (status 2) naming rank 2 and both hashes, nothing broadcast"
else bad "ranks with different models: status $rc, $hashes hashes named"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -5; fi

# A rank that refuses the adapter (the test build's vkswarm_cheat: VKSWARM_TEST_CHEAT=2:base changes
# rank 2's base model after the start-up check, so it fails the check every receiver makes before
# it acknowledges a broadcast: the manifest names another base). A delivery counts only when the
# receiver acknowledges it: step 0's adapter reached 1 of 2 ranks, and the trainer names rank 2 with
# its reason (both base hashes). Under --enable-recovery the run goes on without it and finishes on
# rank 1; without, it stops at once with status 3 (it used to log "to 2 of 2 ranks" and hang until
# --trainer-timeout-s, blaming the trainer).
refusal_ok() { # the trainer's lines: 1 of 2 ranks, rank 2 named with both hashes
    grep -q "shardcast: step 0 (version [0-9]*): adapter, [1-9][0-9]* bytes to 1 of 2 ranks" "$tmp/err.txt" &&
        grep -q "rank 2 refused\(: it refused\)\? the adapter of step 0: .*weights-rank2: version [0-9]*: the adapter is for base model [0-9a-f]\{64\}, this rank loaded [0-9a-f]\{64\}" "$tmp/err.txt"
}
config "$tmp/refuse" 2 0
sed -i 's/"lr": 1e-3,/"lr": 1e-3, "lora": {"rank": 4},/' "$tmp/run.json"
VKSWARM_TEST_CHEAT=2:base mpi_run 300 -x VKSWARM_TEST_CHEAT --enable-recovery -np 3 $cheat_bin rl --config "$tmp/run.json" \
    --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && refusal_ok && grep -q "^vkswarm: rl: inference rank 2 refused: it refused the adapter of step 0: .*; the run goes on without it" "$tmp/err.txt" &&
   grep -q "^final checkpoint: $tmp/refuse/step-000000002" "$tmp/out.txt" && metrics_ok "$tmp/refuse/metrics.jsonl" 2 0 &&
   ! grep -q "inference rank 1 \(refused\|dropped\)\|did not answer" "$tmp/err.txt"; then
    ok "a rank refusing the adapter (another base): named with both hashes, delivered to 1 of 2, the run finishes on rank 1 (--enable-recovery)"
else bad "a rank refusing the adapter, --enable-recovery: status $rc"; grep -v "^\[vm\|device 0\|^rl: step" "$tmp/err.txt" | tail -8; fi
config "$tmp/refuse3" 2 0
sed -i 's/"lr": 1e-3,/"lr": 1e-3, "lora": {"rank": 4},/' "$tmp/run.json"
VKSWARM_TEST_CHEAT=2:base mpi_run 300 -x VKSWARM_TEST_CHEAT -np 3 $cheat_bin rl --config "$tmp/run.json" \
    --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 3 ] && refusal_ok && grep -q "^vkswarm: rl: rank 2 refused the adapter of step 0: .*; the run stops" "$tmp/err.txt" &&
   ! grep -q "^final checkpoint\|^rl: step" "$tmp/out.txt" "$tmp/err.txt" && ! grep -q "did not answer" "$tmp/err.txt"; then
    ok "a rank refusing the adapter without --enable-recovery: named with its reason, the run stops at once with status 3"
else bad "a rank refusing the adapter, no recovery: status $rc"; grep -v "^\[vm\|device 0\|^rl: step" "$tmp/err.txt" | tail -8; fi
end_if_only models

# Multi-turn episodes across ranks (issue 38): environment tasks (a program of two turns: a tool
# message after the first, done after the second with a reward from the length of what the model
# wrote) on a trainer and two inference ranks, from a tiny model taught in 30 SFT steps to end its
# turns (short lines of x: an untrained one rarely stops, so its episodes never reach a reply). The
# episodes reach the trainer with their masks: the sampler's log-probabilities of the trained tokens
# equal the trainer's (< 1e-4), and no completion is left out for a far record (a reply trained on,
# or a turn's record off by a token, would be nats off). A rank that writes its own tool results (vkswarm_cheat, VKSWARM_TEST_CHEAT=2:reply: a reply's
# token moved) is refused by the trainer, which replays every episode through the environment, and
# the run finishes on rank 1 (--enable-recovery); then the same with a verifier rank (below).
# VKSWARM_TEST_ONLY=episodes runs only these cases.
if [ -z "${VKSWARM_TEST_ONLY:-}" ] || [ "$VKSWARM_TEST_ONLY" = episodes ]; then
mkdir -p "$tmp/ep"
python3 -c "
import json, random
r = random.Random(1)
for i in range(64): print(json.dumps({'prompt': 'say %d' % (i % 8), 'completion': 'x' * r.randint(1, 6)}))" > "$tmp/ep/stop.jsonl"
cat > "$tmp/ep/two.py" <<'EOF'
import json, sys
said = {}
for line in sys.stdin:
    r = json.loads(line)
    e = r['episode']
    if r['type'] == 'reset':
        said[e] = ''
        print(json.dumps({'messages': [{'role': 'user', 'content': r['task']['prompt']}]}), flush=True)
        continue
    said[e] += r['completion']
    if len(said[e]) == len(r['completion']):
        print(json.dumps({'messages': [{'role': 'tool', 'content': 'once more'}], 'done': False}), flush=True)
    else:
        print(json.dumps({'messages': [], 'done': True, 'reward': min(len(said[e]), 12) / 12}), flush=True)
EOF
for i in $(seq 0 7); do echo "{\"prompt\": \"say $i\", \"task_type\": \"environment\", \"environment\": \"python3 two.py\"}"; done \
    > "$tmp/ep/env.jsonl"
$bin train sft --init tiny --data "$tmp/ep/stop.jsonl" --steps 30 --batch 8 --lr 3e-3 --out "$tmp/ep/warm" > /dev/null 2>&1 ||
    bad "episodes: the warm-up failed"
episodes_config() { # OUT
    cat > "$tmp/run.json" <<EOF
{"task": "file:$tmp/ep/env.jsonl", "model": "$tmp/ep/warm/step-000000030", "out": "$1", "steps": 2, "prompts_per_step": 2,
 "group_size": 4, "async_level": 0, "max_new_tokens": 24, "lr": 1e-3,
 "roles": {"orchestrator": 0, "trainer": 0, "inference": [[1], [2]]}}
EOF
}
episodes_config "$tmp/episodes"
mpi_run 300 -np 3 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/episodes/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/episodes/metrics.jsonl" 2 0 && mismatch_ok "$tmp/episodes/metrics.jsonl" &&
   grep -q '"reward":0\.[0-9]*[1-9]' "$tmp/episodes/metrics.jsonl" && ! grep -q '"logp_excluded":[1-9]' "$tmp/episodes/metrics.jsonl" &&
   [ "$(grep -c '"logp_excluded":0' "$tmp/episodes/metrics.jsonl")" = 2 ] && ! grep -q "dropped\|refused" "$tmp/err.txt"; then
    ok "episodes across ranks: 2 steps, rewards from the environment's second turns, logp mismatch < 1e-4 and none left out for it (the mask on the wire)"
else bad "episodes across ranks: status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -8; fi
episodes_config "$tmp/episodes-cheat"
VKSWARM_TEST_CHEAT=2:reply mpi_run 300 -x VKSWARM_TEST_CHEAT --enable-recovery -np 3 $cheat_bin rl --config "$tmp/run.json" \
    --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "^vkswarm: rl: inference rank 2 refused: batch [0-9]*: group [0-9]*, completion [0-9]*: its conversation is not what the environment gave (a forged reply); the run goes on without it" "$tmp/err.txt" &&
   grep -q "^final checkpoint: $tmp/episodes-cheat/step-000000002" "$tmp/out.txt" && ! grep -q "inference rank 1 \(refused\|dropped\)" "$tmp/err.txt"; then
    ok "episodes across ranks: a rank writing its own tool results is refused by the trainer's replay, the run finishes on rank 1"
else bad "episodes, a forged reply: status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -8; fi
# A verifier rank replays episodes: the inference ranks send it every turn file of a batch; it rebuilds each
# episode from its environment, replays every turn (TOPLOC, the sampler), and holds the groups against
# them. Honest: every episode accepted, the run finishes. A rank that claims log-probabilities its sampler
# did not give (VKSWARM_TEST_CHEAT=2:logp: the turn files are honest, the groups are not) is refused by the
# verifier naming the replay's value, and one writing its own tool results (2:reply) too; the run
# finishes on rank 1 (--enable-recovery).
episodes_verifier_config() { # OUT
    episodes_config "$1"
    sed -i 's/"inference": \[\[1\], \[2\]\]}/"inference": [[1], [2]], "verifiers": [3]}/' "$tmp/run.json"
}
episodes_verifier_config "$tmp/episodes-verifier"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
replayed=$(grep -c "^vkswarm: rl: verifier rank 3: batch [0-9]*: 8 episodes, [1-9][0-9]* turn files replayed, 8 accepted" "$tmp/err.txt")
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/episodes-verifier/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/episodes-verifier/metrics.jsonl" 2 0 && mismatch_ok "$tmp/episodes-verifier/metrics.jsonl" &&
   [ "$replayed" -ge 2 ] && grep -q "verifier rank 3: batch [0-9]*: 8 episodes, 2 turn files replayed" "$tmp/err.txt" &&
   ! grep -q "dropped\|refused" "$tmp/err.txt"; then
    ok "episodes with a verifier rank: $replayed batches, every turn file replayed, every episode accepted"
else bad "episodes with a verifier rank: status $rc, $replayed batches replayed"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -8; fi
for kind in logp reply; do
    episodes_verifier_config "$tmp/episodes-verifier-$kind"
    VKSWARM_TEST_CHEAT=2:$kind mpi_run 300 -x VKSWARM_TEST_CHEAT --enable-recovery -np 4 $cheat_bin rl --config "$tmp/run.json" \
        --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
    rc=$?
    case $kind in
    logp) why="log-probability -3e+38 of output [0-9]*, the replay gives" ;;
    reply) why="its conversation is not what the environment gave (a forged reply)" ;;
    esac
    if [ $rc -eq 0 ] && grep -q "^vkswarm: rl: verifier rank 3: batch [0-9]* of rank 2 refused: .*$why" "$tmp/err.txt" &&
       grep -q "^final checkpoint: $tmp/episodes-verifier-$kind/step-000000002" "$tmp/out.txt" &&
       ! grep -q "inference rank 1 \(refused\|dropped\)" "$tmp/err.txt"; then
        ok "episodes with a verifier rank: a rank sending $kind the turns do not hold is refused by the verifier, the run finishes on rank 1"
    else bad "episodes with a verifier rank, cheat $kind: status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -8; fi
done
end_if_only episodes
fi

# LoRA across ranks (lora.rank 4): the same 4 ranks (a relay) as the happy path below; Shardcast
# carries each step's adapter (a GGUF LoRA file in every receiver's store), not the weights: a
# line per step names it, broadcast_bytes is under a tenth of the full weights' file (the tiny
# model: 820736 f32 parameters); checkpoints are adapter directories; the inference ranks' rollouts
# of policy step 1 verify with `vkswarm verify --lora` of step 1's adapter (base: the tiny model
# written by convert with the run's seed), those of step 0 are rejected with it (another adapter).
# VKSWARM_TEST_ONLY=lora runs only this case.
config "$tmp/lora" 2 0 "" 3
sed -i 's/"lr": 1e-3,/"lr": 1e-3, "save_every": 1, "lora": {"rank": 4},/' "$tmp/run.json"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
lora_cast_ok() {
    local s
    for s in 0 1 2; do
        grep -q "shardcast: step $s (version [0-9]*): adapter, [1-9][0-9]* bytes to 3 of 3 ranks" "$tmp/err.txt" || return 1
    done
    [ "$(grep -c '"broadcast_bytes":[1-9]' "$tmp/lora/metrics.jsonl")" = 2 ] || return 1
    awk '{ if (!match($0, /"broadcast_bytes":[0-9]+/)) exit 1; b = substr($0, RSTART + 18, RLENGTH - 18) + 0
           if (b * 10 >= 820736 * 4) exit 1 }' "$tmp/lora/metrics.jsonl" || return 1
    for s in 1 2; do [ "$(head -c 4 "$tmp/lora/weights-rank$s/current/model.bin")" = GGUF ] || return 1; done
}
# lora_verify_ok: every rollout file verifies with step 1's adapter, or is policy step 0's (the
# model hash of batch 0; its header and every record say policy_step 0, from Shardcast step 0) and
# is refused with it (status 2, naming the step it needs); at least one of each
lora_verify_ok() {
    $bin convert --init tiny --seed 1 --out "$tmp/tinyhf" 2> /dev/null || return 1
    local f first n_ok=0 n_old=0 h
    first=$(head -1 "$tmp/lora/rollouts-rank1/batch-000000.jsonl" | grep -o '"model_hash":"[0-9a-f]*"')
    for f in "$tmp"/lora/rollouts-rank[12]/batch-*.jsonl; do
        $bin verify --model "$tmp/tinyhf" --rollouts "$f" --lora "$tmp/lora/step-000000001" > /dev/null 2>&1
        case $? in
        0) n_ok=$((n_ok + 1)) ;;
        2) h=$(head -1 "$f" | grep -o '"model_hash":"[0-9a-f]*"'); [ "$h" = "$first" ] || return 1
           # wrong weights (issue 36): status 2 naming the step the file needs and where it came from
           head -1 "$f" | grep -q '"policy_step":0,"policy_weights":"shardcast step 0 ' || return 1
           [ "$(grep -c '"policy_step":0' "$f")" = "$(wc -l < "$f")" ] || return 1
           $bin verify --model "$tmp/tinyhf" --rollouts "$f" --lora "$tmp/lora/step-000000001" 2> "$tmp/verify_err.txt" > /dev/null
           grep -q "wrong weights: .* it needs the weights of policy step 0: shardcast step 0 " "$tmp/verify_err.txt" || return 1
           n_old=$((n_old + 1)) ;;
        *) return 1 ;;
        esac
    done
    [ $n_ok -ge 1 ] && [ $n_old -ge 1 ]
}
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/lora/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/lora/metrics.jsonl" 2 0 && mismatch_ok "$tmp/lora/metrics.jsonl" && lora_cast_ok &&
   [ -f "$tmp/lora/step-000000002/adapter_config.json" ] && [ -f "$tmp/lora/step-000000002/adapter_model.safetensors" ] &&
   ! grep -q "dropped\|refused\|broadcast failed" "$tmp/err.txt" && lora_verify_ok; then
    ok "LoRA across 4 ranks (a relay): adapters through Shardcast (under a tenth of the weights), adapter checkpoints, rollouts verify with verify --lora"
else bad "LoRA across ranks: status $rc"; tail -5 "$tmp/err.txt"; cat "$tmp/lora/metrics.jsonl" 2>/dev/null; fi
# LoRA with a verifier rank (3): it keeps the adapters it receives and replays every batch on the
# base with the batch's adapter (the rollouts name base + adapter): nothing rejected
config "$tmp/lorav" 2 0 3
sed -i 's/"lr": 1e-3,/"lr": 1e-3, "lora": {"rank": 4},/' "$tmp/run.json"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/lorav/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/lorav/metrics.jsonl" 2 0 && mismatch_ok "$tmp/lorav/metrics.jsonl" &&
   grep -q "rollouts; [1-9][0-9]* checked by a verifier: [1-9][0-9]* accepted, 0 rejected" "$tmp/err.txt" &&
   grep -q "shardcast: step 2 (version [0-9]*): adapter, [1-9][0-9]* bytes to 3 of 3 ranks" "$tmp/err.txt" &&
   ! grep -q "dropped\|refused\|broadcast failed" "$tmp/err.txt"; then
    ok "LoRA with a verifier rank: it replays every batch with the batch's adapter, nothing rejected"
else bad "LoRA with a verifier rank: status $rc"; tail -5 "$tmp/err.txt"; fi
# LoRA in a pipeline group ([[1, 2]]) with a verifier rank (3): both stages take each adapter through
# Shardcast and swap their layers' part in; the verifier accepts everything and the losses of every
# step equal the first LoRA case's (two single ranks) to the last digit
config "$tmp/lorag" 2 0 3
sed -i 's/"lr": 1e-3,/"lr": 1e-3, "lora": {"rank": 4},/; s/"inference": \[\[1\], \[2\]\]/"inference": [[1, 2]]/' "$tmp/run.json"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
lora_losses() { grep -o '"loss":[^,]*' "$1"; }
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/lorag/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/lorag/metrics.jsonl" 2 0 && mismatch_ok "$tmp/lorag/metrics.jsonl" &&
   grep -q "rollouts; [1-9][0-9]* checked by a verifier: [1-9][0-9]* accepted, 0 rejected" "$tmp/err.txt" &&
   ! grep -q "dropped\|refused\|broadcast failed" "$tmp/err.txt" &&
   [ "$(lora_losses "$tmp/lorag/metrics.jsonl")" = "$(lora_losses "$tmp/lora/metrics.jsonl")" ]; then
    ok "LoRA in a pipeline group of 2 ranks + a verifier: nothing rejected, the 2 single ranks' losses"
else bad "LoRA pipeline group: status $rc"; tail -5 "$tmp/err.txt"; lora_losses "$tmp/lorag/metrics.jsonl"; lora_losses "$tmp/lora/metrics.jsonl"; fi
# LoRA with the orchestrator on its own rank (0; the trainer on 1, one inference rank 2): the
# trainer sends the adapters, the orchestrator the grants; the first LoRA case's losses
config "$tmp/lorao" 2 0
sed -i 's/"lr": 1e-3,/"lr": 1e-3, "lora": {"rank": 4},/' "$tmp/run.json"
own_orchestrator
mpi_run 300 -np 3 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/lorao/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/lorao/metrics.jsonl" 2 0 && mismatch_ok "$tmp/lorao/metrics.jsonl" &&
   grep -q "shardcast: step 2 (version [0-9]*): adapter, [1-9][0-9]* bytes to 1 of 1 ranks" "$tmp/err.txt" &&
   ! grep -q "dropped\|refused\|broadcast failed" "$tmp/err.txt" &&
   [ "$(lora_losses "$tmp/lorao/metrics.jsonl")" = "$(lora_losses "$tmp/lora/metrics.jsonl")" ]; then
    ok "LoRA with the orchestrator on its own rank: adapters from the trainer, the first LoRA case's losses"
else bad "LoRA, own orchestrator: status $rc"; tail -5 "$tmp/err.txt"; lora_losses "$tmp/lorao/metrics.jsonl"; fi
end_if_only lora

# happy path: trainer + 2 inference ranks + a Shardcast relay (rank 3: inference rank 2 gets the
# weights through it), k = 0, 2 steps
# (issue 36) with a 0.1 s status interval the trainer says what it waits for: step, groups
# generated / discarded / kept, the batches each inference rank has in flight
config "$tmp/k0" 2 0 "" 3
VKSWARM_STATUS_INTERVAL_S=0.1 mpi_run 300 -x VKSWARM_STATUS_INTERVAL_S -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 \
    --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
status_re='^rl: step [12]/2, [0-9]+ s without a step: generated [0-9]+ groups, discarded [0-9]+ \(no signal\), kept [0-2]/2; in flight: '
if grep -Eq "$status_re"'rank 1 [01] batch(es)?, rank 2 [01] batch' "$tmp/err.txt"; then
    ok "4 ranks: a status line while the trainer waits (step, groups, batches in flight per rank)"
else bad "4 ranks: no status line"; grep '^rl: step' "$tmp/err.txt" | head -3; fi
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/k0/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/k0/metrics.jsonl" 2 0 && mismatch_ok "$tmp/k0/metrics.jsonl" && stale_none "$tmp/k0/metrics.jsonl" &&
   shardcast_ok "$tmp/err.txt" "$tmp/k0/metrics.jsonl" 2 3 1 "$tmp/k0/weights-rank1" "$tmp/k0/weights-rank2" &&
   [ "$(grep -c "^vkswarm: rl: shardcast: the weights are signed with a key made for this run" "$tmp/err.txt")" = 1 ] &&
   grep -q "^report: $tmp/k0/report.html" "$tmp/out.txt" && grep -q '<tr class="live"><td>2</td><td>inference</td>' "$tmp/k0/report.html" &&
   ! grep -q "dropped\|refused\|broadcast failed" "$tmp/err.txt"; then
    ok "4 ranks (a relay), k=0: 2 steps, weights through Shardcast, finite losses, lag 0, logp mismatch < 1e-4, no stale group"
else bad "4 ranks (a relay), k=0: status $rc"; tail -5 "$tmp/err.txt"; cat "$tmp/k0/metrics.jsonl" 2>/dev/null; fi

# a pipeline group: ranks 1 and 2 are the two stages of one inference group (layers split in two),
# rank 3 verifies. The same config as the happy path otherwise, so the same rollouts: the verifier
# accepts every completion (the pipeline's tokens and TOPLOC proofs are one rank's), the last
# stage's log-probabilities match the trainer's, and the loss of every step equals the happy
# path's to the last digit.
config "$tmp/group" 2 0 3
sed -i 's/"inference": \[\[1\], \[2\]\]/"inference": [[1, 2]]/' "$tmp/run.json"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
losses() { grep -o '"loss":[^,]*' "$1"; }
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/group/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/group/metrics.jsonl" 2 0 && mismatch_ok "$tmp/group/metrics.jsonl" &&
   grep -q "rollouts; [0-9]* checked by a verifier: [0-9]* accepted, 0 rejected" "$tmp/err.txt" && ! grep -q "dropped\|refused" "$tmp/err.txt" &&
   [ "$(losses "$tmp/group/metrics.jsonl")" = "$(losses "$tmp/k0/metrics.jsonl")" ]; then
    ok "a pipeline group of 2 ranks + a verifier: nothing rejected, logp mismatch < 1e-4, the 2 single ranks' losses"
else bad "pipeline group: status $rc"; tail -5 "$tmp/err.txt"; losses "$tmp/group/metrics.jsonl"; losses "$tmp/k0/metrics.jsonl"; fi

# the orchestrator on a rank of its own (rank 0; rl_orchestrator.c): the trainer (rank 1) asks it for
# each step's groups and re-checks them; the inference rank (2) takes grants from it and the
# weights from the trainer. k = 0 with the same config otherwise: the losses of every step equal
# the happy path's to the last digit (one inference rank or two: the same batches, in order).
config "$tmp/orch" 2 0
own_orchestrator
VKSWARM_STATUS_INTERVAL_S=0.1 mpi_run 300 -x VKSWARM_STATUS_INTERVAL_S -np 3 $bin rl --config "$tmp/run.json" --eval-n 0 \
    --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
# (issue 36) the status line comes from the orchestrator's rank, which holds the queue
if grep -Eq "$status_re"'rank 2 [01] batch' "$tmp/err.txt"; then
    ok "own orchestrator: a status line from the orchestrator's rank while the trainer waits"
else bad "own orchestrator: no status line"; grep '^rl: step' "$tmp/err.txt" | head -3; fi
if [ $rc -eq 0 ] && grep -q "^final checkpoint: $tmp/orch/step-000000002" "$tmp/out.txt" &&
   metrics_ok "$tmp/orch/metrics.jsonl" 2 0 && mismatch_ok "$tmp/orch/metrics.jsonl" && stale_none "$tmp/orch/metrics.jsonl" &&
   shardcast_ok "$tmp/err.txt" "$tmp/orch/metrics.jsonl" 2 1 0 "$tmp/orch/weights-rank2" && [ ! -d "$tmp/orch/weights-rank0" ] &&
   tail -1 "$tmp/orch/metrics.jsonl" | grep -q '"rank2.batches":[1-9]' &&
   grep -q '<tr class="live"><td>2</td><td>inference</td><td>live</td><td>[1-9]' "$tmp/orch/report.html" &&
   ! grep -q "dropped\|refused\|broadcast failed" "$tmp/err.txt" &&
   [ "$(losses "$tmp/orch/metrics.jsonl")" = "$(losses "$tmp/k0/metrics.jsonl")" ]; then
    ok "the orchestrator on its own rank: the happy path's losses, lag 0, logp mismatch < 1e-4, weights from the trainer, its per-rank counts in metrics and report"
else bad "own orchestrator: status $rc"; tail -5 "$tmp/err.txt"; losses "$tmp/orch/metrics.jsonl"; losses "$tmp/k0/metrics.jsonl"; fi

# kill_run RANK NP ARGS...: `vkswarm rl` with the current config and ARGS on NP ranks under
# --enable-recovery, rank RANK killed (-9; stopped, SIGSTOP, when $stop_rank is set) as soon as
# the trainer has logged step 1 (mid-run whatever the machine's speed: a fixed delay once let a
# fast machine finish all 3 steps first); sets pid, rc and took (seconds from the kill or stop to
# the end), output in $tmp/out.txt
# and $tmp/err.txt
pids=$tmp/pids
kill_run() {
    local rank=$1 np=$2 job i
    shift 2
    rm -rf "$pids"
    mkdir -p "$pids"
    VKSWARM_PID_DIR=$pids mpi_run 300 -x VKSWARM_PID_DIR --enable-recovery -np "$np" $bin rl --config "$tmp/run.json" \
        --eval-n 0 "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" &
    job=$!
    pid=$(pid_file_pid "$pids" "$rank")
    for i in $(seq 1 6000); do # up to 300 s (mpi_run's limit): a cold shader cache on a loaded machine
        grep -q "^rl: step 1/" "$tmp/err.txt" && break
        kill -0 $job 2>/dev/null || break
        sleep 0.05
    done
    killed=$(date +%s)
    if [ -n "${stop_rank:-}" ]; then
        stop_pid "$pid"
        # mpirun waits for a stopped rank whatever the others did: once the trainer has printed
        # its result or error (or after 120 s), the stopped rank is killed
        for i in $(seq 1 2400); do
            grep -q "^final checkpoint" "$tmp/out.txt" || grep -q "^vkswarm: rl: trainer: " "$tmp/err.txt" ||
                ! kill -0 $job 2>/dev/null || { sleep 0.05; continue; }
            break
        done
        release_stopped
    elif [ -n "$pid" ]; then kill -9 "$pid"; fi
    wait $job
    rc=$?
    took=$(($(date +%s) - killed))
}

# VKSWARM_TEST_SHORT (tools/test's ASan run): the happy path (Shardcast with a relay) and the
# verifier case (cheats rejected, a rank's unearned reward refused by the same unpacking code
# that refuses the garbage token) only; the faults' drop paths run in the normal build.
short=${VKSWARM_TEST_SHORT:-}

# the k = 0 run resumed from its final checkpoint (step 2) for one more step: the trainer rank
# restores its state and the inference ranks continue from step 2's weights (Shardcast versions
# start above what the receivers' stores kept from the first run: versions 4 and 5)
if [ -z "$short" ]; then
config "$tmp/k0" 3 0 "" 3
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --resume > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "resumed from step 2" "$tmp/err.txt" && grep -q "^final checkpoint: $tmp/k0/step-000000003" "$tmp/out.txt" &&
   metrics_ok "$tmp/k0/metrics.jsonl" 3 0 && mismatch_ok "$tmp/k0/metrics.jsonl" &&
   grep -q "shardcast: step 2 (version 4): .* to 3 of 3 ranks" "$tmp/err.txt" &&
   grep -q "shardcast: step 3 (version 5): .* to 3 of 3 ranks" "$tmp/err.txt"; then
    ok "4 ranks (a relay), k=0: resumed from step 2, step 3 trained (lag 0, logp mismatch < 1e-4)"
else bad "4 ranks, resume: status $rc"; tail -5 "$tmp/err.txt"; cat "$tmp/k0/metrics.jsonl" 2>/dev/null; fi
fi

if [ -z "$short" ]; then
# a rank that sends garbage (a token id >= vocab) is named and refused; the run finishes
config "$tmp/garbage" 2 0
mpi_run 300 -np 3 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --test-garbage-rank 2 \
    > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "inference rank 2 refused: batch [0-9]*: group [0-9]*, completion 0: token [0-9]* outside the vocabulary" "$tmp/err.txt" &&
   ! grep -q "inference rank 1 \(refused\|dropped\)" "$tmp/err.txt" && metrics_ok "$tmp/garbage/metrics.jsonl" 2 0; then
    ok "a rank sending a token outside the vocabulary is refused, the run finishes"
else bad "garbage rank: status $rc"; tail -5 "$tmp/err.txt"; fi
fi

if [ -z "$short" ]; then
# a pipeline group of three ranks [1, 2, 3] whose middle stage (rank 2, layer 1 of the tiny model's
# 4) hands on what it received (tests/vkswarm-faulty, mpi/pipeline_fault.h; the fault names the
# world rank): the verifier rank (4) rejects the completions naming stage 1 by its world rank 2 and
# refuses the batch blaming that stage; the orchestrator refuses rank 2 (not the group's first, rank
# 1: issue 27), the group re-forms as [1, 3] (layers [0,2) and [2,4); the cheat stays with rank 2's
# process) and the run finishes on it. Every rejection and refusal names rank 2; ranks 1 and 3 never
# are refused (nor dropped).
config "$tmp/stage" 2 0 4
sed -i 's/"inference": \[\[1\], \[2\]\]/"inference": [[1, 2, 3]]/' "$tmp/run.json"
VKSWARM_TEST_FAULT=2:skip-layer mpi_run 300 -x VKSWARM_TEST_FAULT -np 5 ${1:?build dir}/tests/vkswarm-faulty rl \
    --config "$tmp/run.json" --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
named=$(grep -c "stage 1 (rank 2, layers \[1,2)): TOPLOC chunk" "$tmp/err.txt")
others=$(grep "rejected:\|refused" "$tmp/err.txt" | grep -vc "stage 1 (rank 2, layers \[1,2)): TOPLOC chunk")
if [ $rc -eq 0 ] && [ "$named" -gt 0 ] && [ "$others" = 0 ] &&
   grep -q "verifier rank 4: batch [0-9]* from rank 1: stage rank 2 refused: .*stage 1 (rank 2" "$tmp/err.txt" &&
   grep -q "inference group \[1, 2, 3\]: stage rank 2 refused: verifier rank 4: batch [0-9]*: .*stage 1 (rank 2.*; the group goes on as \[1, 3\]" "$tmp/err.txt" &&
   grep -q "inference group \[1, 2, 3\]: re-formed without rank 2 as \[1, 3\] (layers \[0,2) \[2,4))" "$tmp/err.txt" &&
   ! grep -q "rank [13] \(refused\|dropped\)\|stage rank [13] refused\|no inference rank is left" "$tmp/err.txt" &&
   metrics_ok "$tmp/stage/metrics.jsonl" 2 0; then
    ok "a pipeline group's cheating middle stage: rank 2 refused ($named rejections name it), the group re-formed as [1, 3] finishes the run"
else bad "cheating stage in the RL run: $named named, $others others, status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -5; fi
fi

# a verifier rank (3) checks every batch: both inference ranks cheat (the first generated token
# of every 5th completion, global index (batch * 8 + q + 1) % 5 == 0, is not the sampler's draw;
# they keep groups without signal, so that every batch holds cheated completions the verifier
# sees) and rank 2 also claims a reward of 1 it did not earn (the check that refuses it,
# vks_rl_check_samples re-scoring every completion inside vks_rl_wire_unpack_groups, is the
# trainer's own too: the garbage case above goes through that path without a verifier). The verifier rejects cheated
# completions and nothing else, hands the trainer only accepted ones (the trainer refuses any
# sample not marked accepted), records each rejection in OUT/verifier-rank3/rejected.jsonl, and
# refuses rank 2's batch: the trainer refuses rank 2 and the run finishes on rank 1.
config "$tmp/verifier" 2 0 3
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --test-cheat-every 5 --test-garbage-rank 2 \
    --test-garbage-reward > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
rejections=$(grep -c "verifier rank 3: batch [0-9]* of rank 1: completion [0-9]* rejected: .*not the seeded sampler's draw" "$tmp/err.txt")
false_rejections=$(grep -o "verifier rank 3: batch [0-9]* of rank [12]: completion [0-9]* rejected" "$tmp/err.txt" |
    awk '{ b = $5; q = $10; if ((b * 8 + q + 1) % 5 != 0) n++ } END { print n + 0 }')
all_rejections=$(grep -c "verifier rank 3: batch [0-9]* of rank [12]: completion [0-9]* rejected" "$tmp/err.txt")
recorded=$(grep -c '"reason":' "$tmp/verifier/verifier-rank3/rejected.jsonl" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$rejections" -ge 1 ] && [ "$false_rejections" = 0 ] && [ "$recorded" = "$all_rejections" ] &&
   grep -q "inference rank 2 refused: verifier rank 3: batch [0-9]*: group [0-9]*, completion 0: rewards 1 / 1, the task gives" "$tmp/err.txt" &&
   ! grep -q "inference rank 1 \(refused\|dropped\)\|verifier rank 3 \(refused\|dropped\)" "$tmp/err.txt" &&
   grep -q "[1-9][0-9]* rejected" "$tmp/err.txt" && metrics_ok "$tmp/verifier/metrics.jsonl" 2 0 &&
   mismatch_ok "$tmp/verifier/metrics.jsonl"; then
    ok "a verifier rank rejects exactly the cheated completions ($rejections), refuses a rank's unearned reward, the run finishes"
else bad "verifier rank: status $rc, $rejections rejections, $false_rejections false, $recorded recorded"; tail -5 "$tmp/err.txt"; fi

# a forged code reward (issue 38): the same with the built-in code task and no cheated tokens: rank 2
# claims a reward of 1 for a completion of a code task; the verifier rank scores it itself through the
# code task's check (the tiny model writes no fenced block: 0, nothing to run) and refuses rank 2.
if [ -z "$short" ]; then
config "$tmp/verifier-code" 2 0 3
sed -i "s|\"task\": \"file:$tmp/tasks.jsonl\"|\"task\": \"code:2:short\"|" "$tmp/run.json"
grep -q '"task": "code:2:short"' "$tmp/run.json" || bad "verifier-code: the config's task"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --test-garbage-rank 2 --test-garbage-reward \
    > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
if [ $rc -eq 0 ] && grep -q "inference rank 2 refused: verifier rank 3: batch [0-9]*: group [0-9]*, completion 0: rewards 1 / 1, the task gives 0" "$tmp/err.txt" &&
   ! grep -q "inference rank 1 \(refused\|dropped\)" "$tmp/err.txt" && metrics_ok "$tmp/verifier-code/metrics.jsonl" 2 0; then
    ok "a rank's forged code reward is refused by the verifier rank's own scoring, the run finishes on rank 1"
else bad "a forged code reward: status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -6; fi
fi

# dishonest inference ranks (the test build's vkswarm_cheat, VKSWARM_TEST_CHEAT) without a verifier
# rank, at async level 1: rank 1 claims a log-probability of -3e38 for every token it sends (each
# passes the wire's "finite and <= 0"): the trainer checks every completion against the weights that
# sampled it (lag 0: its own; lag 1: the version before, kept for the check) and leaves out every
# one far from them (counted: logp_excluded), so none is trained on: one would put a mismatch of
# ~1e37 in the metrics, while honest ones stay below VKS_RL_MAX_LOGP_MISMATCH (5); rank 2 claims 0
# completions checked and 0 accepted while it sends accepted ones: refused by name. The run
# finishes on rank 1's groups, each step's left out whole: its loss and its mismatch are 0.
# (Issue 40, item 1: honest off-policy completions are kept; test_rl test_off_policy_kept.)
if [ -z "$short" ]; then
config "$tmp/cheat" 4 1
VKSWARM_TEST_CHEAT=1:logp,2:counts mpi_run 300 -x VKSWARM_TEST_CHEAT -np 3 $cheat_bin rl --config "$tmp/run.json" \
    --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
excluded=$(grep -o '"logp_excluded":[0-9]*' "$tmp/cheat/metrics.jsonl" 2>/dev/null | awk -F: '{ n += $2 } END { print n + 0 }')
# steps whose groups an older version made (policy_lag > 0) and that left completions out: the check
# against a kept version caught them
lagged=$(awk '/"policy_lag":(0\.[0-9]*[1-9]|[1-9])/ && /"logp_excluded":[1-9]/' "$tmp/cheat/metrics.jsonl" 2>/dev/null | wc -l)
far_trained=$(awk '{ if (!match($0, /"logp_mismatch":[0-9.]+(e-?[0-9]+)?/)) { n++; next }
                     if (substr($0, RSTART + 16, RLENGTH - 16) + 0 >= 5) n++ } END { print n + 0 }' "$tmp/cheat/metrics.jsonl")
if [ $rc -eq 0 ] && grep -q "inference rank 2 refused: batch [0-9]*: counts of 0 checked and 0 accepted" "$tmp/err.txt" &&
   ! grep -q "inference rank 1 \(refused\|dropped\)" "$tmp/err.txt" && [ "$excluded" -ge 1 ] &&
   [ "$far_trained" = 0 ] && metrics_ok "$tmp/cheat/metrics.jsonl" 4 1; then
    ok "a rank's log-probabilities of -3e38 left out by the trainer ($excluded completions, $lagged steps of an older version's), a rank's false counts refused"
    # the scheduler decides whether a step trains on an older version's groups: very likely at
    # k = 1, not certain, so a run without one says so instead of failing (test_rl's
    # test_off_policy_kept checks the kept versions deterministically)
    [ "$lagged" -ge 1 ] || echo "note: no step trained on an older version's groups in this run: the kept-version check was not reached here" >&2
else bad "cheating ranks without a verifier: status $rc, $excluded left out, $lagged lagged steps, $far_trained steps trained far"
     grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -5; cat "$tmp/cheat/metrics.jsonl"; fi

# the same with a verifier rank (5), each lie by its own rank: rank 1 sends the groups that carry
# signal without their completions (the verifier scores every record of the batch's rollout file),
# rank 2 log-probabilities of -3e38 (the replay recomputes them), rank 3 a task reward sum one
# higher than its rollouts give (the verifier sums its own). Each is refused by name, rank 4 is not,
# and the run finishes on rank 4.
config "$tmp/vcheat" 3 1 5
sed -i 's/"inference": \[\[1\], \[2\]\]/"inference": [[1], [2], [3], [4]]/' "$tmp/run.json"
VKSWARM_TEST_CHEAT=1:hide,2:logp,3:sum mpi_run 300 -x VKSWARM_TEST_CHEAT -np 6 $cheat_bin rl --config "$tmp/run.json" \
    --eval-n 0 --timeout-s 60 > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
refused() { grep -q "inference rank $1 refused: verifier rank 5: batch [0-9]*: $2" "$tmp/err.txt"; }
if [ $rc -eq 0 ] && refused 1 "group [0-9] came without its completions, but its rollout records carry signal" &&
   refused 2 "group [0-9], completion [0-9]: log-probability -3e+38 of output 0, the replay gives" &&
   refused 3 "a task reward sum of [0-9.]*, its completions give" &&
   ! grep -q "inference rank 4 \(refused\|dropped\)\|verifier rank 5 \(refused\|dropped\)" "$tmp/err.txt" &&
   metrics_ok "$tmp/vcheat/metrics.jsonl" 3 1; then
    ok "a verifier rank refuses hidden groups with signal, false log-probabilities, a false reward sum"
else bad "cheating ranks with a verifier: status $rc"; grep "refused\|dropped" "$tmp/err.txt"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -5; fi
fi

# group verdicts (issue 27): the verifier rank checks ceil(0.25 n) of each batch's n judged
# completions (verify_sample 0.25) and accepts or rejects the batch whole; both inference ranks
# cheat as above. Each batch's line says how many were checked and failed; a batch is rejected
# exactly when a checked completion failed, and then every one of its completions is rejected
# (the rejection lines add up to the rejected batches' sizes); accepted batches reject none. Every
# 3rd completion cheats (about 2 in 3 batches rejected), 8 steps: none rejected in 8 batches has
# odds of 0.36^8 (at 4 steps 2%: seen once).
# The model: the episodes' warm-up (it ends its lines, so groups differ in length and carry signal);
# from the untrained one, whose completions rarely stop, a run with about half its batches rejected
# whole once found no useful group in 20 batches and stopped (CI; the secret each batch is checked
# with is random, as it must be).
config "$tmp/sampled" 8 0 3
[ -d "$tmp/ep/warm/step-000000030" ] && sed -i "s|\"init\": \"tiny\"|\"model\": \"$tmp/ep/warm/step-000000030\"|" "$tmp/run.json"
mpi_run 300 -np 4 $bin rl --config "$tmp/run.json" --eval-n 0 --timeout-s 60 --test-cheat-every 3 --set verify_sample=0.25 \
    > "$tmp/out.txt" 2> "$tmp/err.txt"
rc=$?
batches=$(grep -c "verifier rank 3: batch \(accepted\|rejected\): [0-9]* of [0-9]* completions checked" "$tmp/err.txt")
wrong=$(grep -o "verifier rank 3: batch [a-z]*: [0-9]* of [0-9]* completions checked ([0-9]* failed); a batch with >= 10% bad completions passes with probability <= [0-9.e-]*" "$tmp/err.txt" |
    awk '{ v = $5; m = $6; n = $8; f = substr($11, 2) + 0; k = int(n * 0.1); if (k < n * 0.1) k++; if (k < 1) k = 1
           p = 1; for (i = 0; i < m; i++) p *= (n - k - i > 0) ? (n - k - i) / (n - i) : 0
           want = sprintf("%.4g", p); got = $NF
           if (m != int((n + 3) / 4) || (v == "rejected:") != (f > 0) || got != want) bad++ }
         END { print bad + 0 }')
in_rejected=$(grep -o "verifier rank 3: batch rejected: [0-9]* of [0-9]*" "$tmp/err.txt" | awk '{ s += $NF } END { print s + 0 }')
rejected_lines=$(grep -c "verifier rank 3: batch [0-9]* of rank [12]: completion [0-9]* rejected" "$tmp/err.txt")
# the summary's counts agree with the step lines: checked = accepted + rejected (every completion of
# a batch judged whole counts as checked), the last step's accept rate = accepted / checked (issue
# 26: the summary said "120 rollouts, 24 accepted, 0 rejected" beside "accepted 1.000")
counts_agree=$(grep -o "^vkswarm: rl: [0-9]* rollouts; [0-9]* checked by a verifier: [0-9]* accepted, [0-9]* rejected" "$tmp/err.txt" |
    awk -v acc="$(grep -o '^rl: step 8/8: .*accepted [0-9.]*' "$tmp/err.txt" | awk '{ print $NF }')" \
        '{ n = $3; c = $5; a = $10; r = $12
           if (c <= n && c == a + r && c > 0 && sprintf("%.3f", a / c) == acc) print "yes" }')
if [ $rc -eq 0 ] && [ "$batches" -ge 8 ] && [ "$wrong" = 0 ] && [ "$in_rejected" -gt 0 ] &&
   [ "$rejected_lines" = "$in_rejected" ] && [ "$counts_agree" = yes ] && metrics_ok "$tmp/sampled/metrics.jsonl" 8 0; then
    ok "verify_sample 0.25: $batches batches judged whole on a sampled quarter, $in_rejected completions in rejected batches, bounds as C(n-k,m)/C(n,m)"
else bad "verify_sample: status $rc, $batches batches, $wrong wrong lines, $rejected_lines rejections vs $in_rejected, counts agree '$counts_agree'"; grep "rollouts;\|^rl: step" "$tmp/err.txt"; tail -5 "$tmp/err.txt"; fi

if [ -z "$short" ]; then
# an inference rank killed mid-run: the second stage (rank 3) of the pipeline group [2, 3]. Its
# first stage's pipeline names it (by its world rank, 3) and that rank ends; the trainer drops the group (rank 2, for its
# silence), grants its batch again, and the run finishes on rank 1 (--enable-recovery)
config "$tmp/kill" 3 0
sed -i 's/"inference": \[\[1\], \[2\]\]/"inference": [[1], [2, 3]]/' "$tmp/run.json"
kill_run 3 4 --timeout-s 5 --trainer-timeout-s 120
# who names the dead stage depends on when it dies: rank 2's pipeline (during a batch) or the
# trainer (rank 3 missed a weights broadcast)
if [ -n "$pid" ] && [ $rc -eq 0 ] && grep -q "inference rank 2 dropped" "$tmp/err.txt" &&
   grep -q "inference rank 2: .*inference group 1 (ranks 2 3): .*rank 3 \(stopped answering\|did not answer\)\|inference rank 2 dropped: its stage rank 3 did not take the weights" "$tmp/err.txt" &&
   grep -q "^final checkpoint: $tmp/kill/step-000000003" "$tmp/out.txt" && metrics_ok "$tmp/kill/metrics.jsonl" 3 0 &&
   grep -q "shardcast: step 3 (version [0-9]*): [0-9]* bytes to 1 of 3 ranks" "$tmp/err.txt"; then
    ok "a pipeline group's stage killed mid-run: the group is dropped (also from the weights broadcasts), the run finishes on the other rank"
else bad "killed stage: pid '$pid' status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -20; fi
fi

# one inference rank of two killed (-9), then stopped (SIGSTOP), mid-run at k = 1: the trainer's
# next weights broadcast waits --timeout-s for it, while the live rank 1 has taken the weights and
# keeps beating from inside the broadcast (before, it was dropped for that wait's silence and the
# run ended, "no inference rank is left"). Only rank 2 is dropped; the run finishes its 3 steps.
if [ -z "$short" ]; then
for how in killed stopped; do
    config "$tmp/one-of-two" 3 1
    stop_rank=$([ $how = stopped ] && echo 1) kill_run 2 3 --timeout-s 5 --trainer-timeout-s 60
    # the summary names it by its world rank with the reason, and so do metrics.jsonl and the report
    if [ -n "$pid" ] && [ $rc -eq 0 ] && grep -q "inference rank 2 dropped" "$tmp/err.txt" &&
       ! grep -q "inference rank 1 \(refused\|dropped\)\|no inference rank is left" "$tmp/err.txt" &&
       grep -q "^vkswarm: rl: inference rank 2 dropped at step [0-9]*: rank 2 went silent\|^vkswarm: rl: inference rank 2 dropped at step [0-9]*: it did not take the weights" "$tmp/err.txt" &&
       [ "$(grep -c "^vkswarm: rl: [a-z]* rank [0-9]* \(dropped\|refused\) at step" "$tmp/err.txt")" = 1 ] &&
       tail -1 "$tmp/one-of-two/metrics.jsonl" | grep -q '"rank2.dropped":1' &&
       tail -1 "$tmp/one-of-two/metrics.jsonl" | grep -q '"rank1.dropped":0' &&
       grep -q '<tr class="dropped"><td>2</td><td>inference</td><td>dropped</td>' "$tmp/one-of-two/report.html" &&
       grep -q "^final checkpoint: $tmp/one-of-two/step-000000003" "$tmp/out.txt" && metrics_ok "$tmp/one-of-two/metrics.jsonl" 3 1; then
        ok "one inference rank of two $how mid-run (k=1): only it is dropped (named in the summary, metrics and report), the run finishes on the other (${took}s)"
    else bad "one inference rank of two $how: pid '$pid' status $rc"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -8; fi
    rm -rf "$tmp/one-of-two"
done
fi

# a verifier rank killed mid-run: dropped, its batches granted again (to the other verifier), and
# the inference rank whose send to it times out goes on beating and generating: the run finishes.
# The same run is the k = 1 case (lag at most 1) and signs the weights with a configured key
# (vkswarm keygen): every step's weights reach the inference rank and the live verifier.
if [ -z "$short" ]; then
config "$tmp/vkill" 3 1 "2, 3"
sed -i 's/"inference": \[\[1\], \[2\]\]/"inference": [[1]]/' "$tmp/run.json"
$bin keygen --out "$tmp/keys" > /dev/null 2>&1
kill_run 3 4 --timeout-s 5 --trainer-timeout-s 120 --set "shardcast_key=$tmp/keys"
if [ -n "$pid" ] && [ $rc -eq 0 ] && grep -q "verifier rank 3 dropped" "$tmp/err.txt" &&
   ! grep -q "inference rank 1 \(refused\|dropped\)\|verifier rank 2 \(refused\|dropped\)" "$tmp/err.txt" &&
   grep -q "^final checkpoint: $tmp/vkill/step-000000003" "$tmp/out.txt" && metrics_ok "$tmp/vkill/metrics.jsonl" 3 1 &&
   grep -q "shardcast: step 3 (version [0-9]*): [1-9][0-9]* bytes to 2 of [23] ranks" "$tmp/err.txt" &&
   grep -qF "vkswarm: rl: shardcast: the weights are signed with your key $tmp/keys/shardcast.key (the other ranks check them with $tmp/keys/shardcast.pub)" "$tmp/err.txt" &&
   grep -q "^vkswarm: rl: verifier rank 3 dropped at step [0-9]*: " "$tmp/err.txt" &&
   [ -f "$tmp/vkill/weights-rank1/current/model.bin" ] && [ -f "$tmp/vkill/weights-rank2/current/model.bin" ]; then
    ok "a verifier rank killed mid-run is dropped (named in the summary), the run finishes with the other (k=1: lag <= 1; a configured key, said on stderr)"
else bad "killed verifier (k=1, configured key): pid '$pid' status $rc"; tail -5 "$tmp/err.txt"; fi
fi

# the trainer killed mid-run ends the run: idle inference ranks give up after --trainer-timeout-s
if [ -z "$short" ]; then
config "$tmp/trainer" 3 0
kill_run 0 3 --timeout-s 5 --trainer-timeout-s 10
if [ -n "$pid" ] && [ $rc -ne 124 ] && [ $took -le 60 ] && [ "$(grep -c "inference rank [12]: rank 0 did not answer" "$tmp/err.txt")" = 2 ] &&
   ! grep -q "^final checkpoint" "$tmp/out.txt"; then
    ok "the trainer killed mid-run: both inference ranks give up after ${took}s (status $rc)"
else bad "killed trainer: pid '$pid' status $rc after ${took}s"; tail -5 "$tmp/err.txt"; fi
fi

# the orchestrator on its own rank killed mid-run: the trainer's wait for its groups ends after
# 2 x --timeout-s + 2 s of silence with a line naming it (MPI_Abort then ends every rank)
if [ -z "$short" ]; then
config "$tmp/okill" 3 0
own_orchestrator
# --trainer-timeout-s 120: the orchestrator waits that long for the trainer's steps (with 10 it
# gave up on a first step slowed by a cold shader cache before the kill, and the run ended early)
kill_run 0 3 --timeout-s 5 --trainer-timeout-s 120
if [ -n "$pid" ] && [ $rc -ne 124 ] && [ $took -le 60 ] &&
   grep -q "^vkswarm: rl: the orchestrator (rank 0): .*; the run ends (the last checkpoint stays)" "$tmp/err.txt" &&
   ! grep -q "^final checkpoint" "$tmp/out.txt"; then
    ok "the orchestrator (own rank) killed mid-run: the trainer names it, the run ends after ${took}s (status $rc)"
else bad "killed orchestrator: pid '$pid' status $rc after ${took}s"; grep -v "^\[vm\|device 0" "$tmp/err.txt" | tail -20; fi
fi

echo "rl across ranks: $passed passed, $failed failed"
[ $failed -eq 0 ]
