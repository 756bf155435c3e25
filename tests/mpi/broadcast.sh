#!/usr/bin/env bash
# Shardcast under mpirun (issue 6): a clean transfer, a tampered shard, a
# short chunk, a replayed version, a manifest signed by another key, a
# tampered signature, a delta, a relay killed or stopped mid-transfer and the
# origin stopped or killed mid-transfer (issue 9: each ends within
# --timeout-s plus a few seconds, names the silent rank, and fails where
# mpirun can say so, in the status file where it cannot), and a receiver
# that died while the origin made no MPI call (tests/dead_receiver). Each case is under
# `timeout`; a receiver's store must hold only verified versions, and what a
# transfer cut short left in it is gone after the next broadcast.
# Usage: tests/mpi/broadcast.sh path/to/vkswarm
set -uo pipefail
V=${1:?usage: broadcast.sh path/to/vkswarm}
. "$(dirname "$0")/common.sh"
T=$(mktemp -d /tmp/vks-bcast.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
M=(mpi_run 120)
"$V" keygen --out "$T/k" >/dev/null || exit 1
"$V" keygen --out "$T/evil" >/dev/null || exit 1
head -c 3000000 /dev/urandom >"$T/v1.bin"
python3 -c "
b=bytearray(open('$T/v1.bin','rb').read())
for i in range(0,len(b),997): b[i]^=1
open('$T/v2.bin','wb').write(b)"
A=(--pub "$T/k/shardcast.pub" --out "$T/out" --relays 2 --shard-mb 0.25 --chunk-kb 64 --timeout-s 3)
K=(--key "$T/k/shardcast.key")
hash() { b2sum -l 256 "$1" | cut -d' ' -f1; }
# expect_store VERSION FILE: every receiver's current file is FILE at VERSION
expect_store() {
    for r in 3 4 5; do
        [ "$(readlink "$T/out/rank-$r/current")" = "v$1" ] || fail "$case: rank $r current is not v$1"
        cmp -s "$T/out/rank-$r/current/model.bin" "$2" || fail "$case: rank $r holds other bytes"
    done
    for r in 3 4 5; do
        ls -a "$T/out/rank-$r" | grep -q partial && fail "$case: rank $r: partial version left behind"
    done
}
# status_is RANK OUTCOME: the origin's status file gives RANK that outcome
status_is() {
    python3 -c "
import json, sys
s = json.load(open('$T/status.json'))
r = [x for x in s['ranks'] if x['rank'] == $1]
sys.exit(0 if r and r[0]['outcome'] == '$2' else 1)" || fail "$case: status file: rank $1 is not '$2'"
}
status_field() { # KEY VALUE (JSON literal)
    python3 -c "
import json, sys
sys.exit(0 if json.load(open('$T/status.json'))['$1'] == $2 else 1)" || fail "$case: status file: $1 is not $2"
}
# fault_run NAME FAULT VERSION [mpirun options]: a broadcast of v1.bin as
# VERSION, with --status-out, under the fault, timed from it. The fault (die: or
# stop:RANK) fires at a chunk, not a time: the rank passes on the first half
# of the chunks to each child (a leaf: receives them), never more, then dies or
# stops (mpi/broadcast_internal.h), so no rank below it can complete from it
# on any machine or load (it once fired only when the slower relay had half,
# after the faster one had passed on the whole version). The rank the fault
# stopped names its pid; it is killed afterwards whatever happened, so
# nothing is left stopped. Every rank but a stopped one must be gone within
# --timeout-s (3) plus a few seconds (12 s) of the fault. mpirun then normally ends too: the
# origin's MPI_Abort makes Open MPI kill the stopped rank, but Open MPI 4.1.4
# under --enable-recovery misses that kill now and then (measured 1 in 16-25
# runs: the stopped rank gets no signal at all); then mpirun must end as soon
# as that rank is killed, and the case says so.
# live_ranks PID EXCEPT: vkswarm processes under PID (mpirun's ranks), zombies and EXCEPT left out
live_ranks() {
    ps -eo pid=,ppid=,stat=,comm= | awk -v root="$1" -v except="$2" '
        { ppid[$1] = $2; stat[$1] = $3; comm[$1] = $4 }
        END {
            n = 0
            for (p in ppid) {
                if (p == except || comm[p] != "vkswarm" || stat[p] ~ /^Z/) continue
                for (q = ppid[p]; q > 1; q = ppid[q]) if (q == root) { n++; break }
            }
            print n
        }'
}
fault_run() {
    case=$1 fault=$2 version=$3
    shift 3
    rm -f "$T/status.json"
    start=$SECONDS
    mpi_run 60 -x VKSWARM_FAULT="$fault" "$@" -np 6 "$V" broadcast --file "$T/v1.bin" "${K[@]}" "${A[@]}" \
        --weights-version "$version" --link-mbps 200 --status-out "$T/status.json" >"$T/stdout" 2>"$T/stderr" &
    local job=$! pid="" left fired=""
    # the bound counts from the fault (its stderr line), not from the launch: MPI start-up of 6
    # ranks takes seconds more on a loaded machine, and a lagging rank delays the fault
    within() { if [ -n "$fired" ]; then [ $((SECONDS - fired)) -le "$1" ]; else [ $((SECONDS - start)) -le 50 ]; fi; }
    while kill -0 $job 2>/dev/null && within 12; do
        sleep 0.2
        [ -n "$fired" ] || ! grep -q "fault injection" "$T/stderr" || fired=$SECONDS
        [ -n "$pid" ] || pid=$(sed -n 's/.*fault injection: stopping now (pid \([0-9]*\)).*/\1/p' "$T/stderr" | head -1)
        left=$(live_ranks $job "$pid")
        [ -n "$pid" ] && [ "$left" = 0 ] && ! within 8 && break
    done
    took=$((SECONDS - ${fired:-$start}))
    if kill -0 $job 2>/dev/null && [ -n "$pid" ]; then
        echo "$case: NOTE: ${took}s after the fault only the stopped rank (pid $pid) is left: Open MPI did not kill it; killing it"
        kill -9 "$pid" 2>/dev/null
        for _ in $(seq 1 25); do kill -0 $job 2>/dev/null || break; sleep 0.2; done
        kill -0 $job 2>/dev/null && fail "$case: mpirun did not end once the stopped rank was killed"
    fi
    wait $job
    rc=$?
    echo "$case: exit $rc ${took}s after the fault"
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    grep -q "fault injection" "$T/stderr" || fail "$case: the fault did not fire"
    [ $rc -ne 124 ] || fail "$case: mpirun hung"
    [ -n "$fired" ] && [ $took -le 12 ] || fail "$case: took ${took}s after the fault, expected --timeout-s 3 plus a few seconds"
}
run() { # name expected-status [env] args...
    case=$1 want=$2; shift 2
    "$@" >"$T/stdout" 2>"$T/stderr"
    local rc=$?
    [ $rc -eq "$want" ] || { fail "$case: exit $rc, expected $want"; tail -5 "$T/stderr" >&2; }
}

run clean 0 "${M[@]}" -np 6 "$V" broadcast --file "$T/v1.bin" "${K[@]}" "${A[@]}" --weights-version 1
[ "$(grep -c "version 1 $(hash "$T/v1.bin")" "$T/stdout")" = 3 ] || fail "clean: 3 receivers must print the hash"
expect_store 1 "$T/v1.bin"

run corrupt 0 "${M[@]}" -x VKSWARM_FAULT=corrupt:1:3 -np 6 "$V" broadcast --file "$T/v2.bin" "${K[@]}" "${A[@]}" --weights-version 2
grep -q "shard 3 from rank 1 fails its hash" "$T/stderr" || fail "corrupt: not detected"
expect_store 2 "$T/v2.bin"

run short 0 "${M[@]}" -x VKSWARM_FAULT=short:0 -np 6 "$V" broadcast --file "$T/v1.bin" "${K[@]}" "${A[@]}" --weights-version 3
grep -q "wrong length" "$T/stderr" || fail "short: not detected"
expect_store 3 "$T/v1.bin"

run replay 2 "${M[@]}" -np 6 "$V" broadcast --file "$T/v2.bin" "${K[@]}" "${A[@]}" --weights-version 2
grep -q "not newer than version 3" "$T/stderr" || fail "replay: no message"
expect_store 3 "$T/v1.bin"

run otherkey 2 "${M[@]}" -np 6 "$V" broadcast --file "$T/v2.bin" --key "$T/evil/shardcast.key" "${A[@]}" --weights-version 9
grep -q "bad signature" "$T/stderr" || fail "otherkey: no message"
grep -q "MB/s" "$T/stderr" && fail "otherkey: a transfer rate although no rank got the version"
expect_store 3 "$T/v1.bin"

run badsig 2 "${M[@]}" -x VKSWARM_FAULT=badsig -np 6 "$V" broadcast --file "$T/v2.bin" "${K[@]}" "${A[@]}" --weights-version 9
grep -q "rank 5: manifest: bad signature" "$T/stderr" || fail "badsig: no message"
expect_store 3 "$T/v1.bin"

run delta 0 "${M[@]}" -np 6 "$V" broadcast --file "$T/v2.bin" "${K[@]}" "${A[@]}" --weights-version 4 --delta xor --base "$T/v1.bin"
grep -q "delta saves" "$T/stderr" || fail "delta: no savings reported"
expect_store 4 "$T/v2.bin"

# Open MPI 4.1 aborts the job when a rank dies unless --enable-recovery;
# with it, mpirun exits 0 whatever happened, so the outcome is read from the
# origin's status file (and the receivers' output). The survivors hear from
# the origin (GO) that a rank was lost, leave without MPI_Finalize, which
# Open MPI cannot complete then, and the origin aborts the job, which is what
# ends a rank that is stopped rather than dead.
fault_run relay-dies die:1 5 --enable-recovery
[ "$(grep -c "version 5 $(hash "$T/v1.bin")" "$T/stdout")" = 3 ] || fail "relay-dies: 3 receivers must print the hash"
grep -q "rank 1 silent" "$T/stderr" || fail "relay-dies: the origin was not told"
grep -q "relay 1 silent" "$T/stderr" || fail "relay-dies: no failover"
[ "$(grep -c "rank [345]: version 5 .*failed over\\|rank [345]: version 5 in" "$T/stderr")" = 3 ] ||
    fail "relay-dies: 3 receivers must finish"
status_field complete True
status_field ok False
status_is 1 silent
for r in 2 3 4 5; do status_is $r ok; done
expect_store 5 "$T/v1.bin"

# A relay stopped (SIGSTOP) mid-transfer: its children turn to the origin
# after --timeout-s, the origin names it, and the job ends although it lives.
fault_run relay-stopped stop:1 6 --enable-recovery
grep -q "rank 0: 1 rank(s) silent, aborting the job" "$T/stderr" || fail "relay-stopped: the origin did not end the job"
grep -q "broadcast: rank 1 silent for\\|rank 1 silent" "$T/stderr" || fail "relay-stopped: rank 1 not named"
[ "$(grep -c "version 6 $(hash "$T/v1.bin")" "$T/stdout")" = 3 ] || fail "relay-stopped: 3 receivers must print the hash"
status_field complete True
status_field ok False
status_is 1 silent
for r in 3 4 5; do status_is $r ok; done
expect_store 6 "$T/v1.bin"
# Without --enable-recovery mpirun's status carries the failure.
fault_run relay-stopped-plain stop:1 7
[ $rc -ne 0 ] || fail "relay-stopped-plain: exit 0 for a failed broadcast"
grep -q "rank 1 silent" "$T/stderr" || fail "relay-stopped-plain: rank 1 not named"
status_is 1 silent

# The origin stopped, then killed, mid-transfer: every rank gives up within
# --timeout-s, naming it; no rank is reported ok (a stopped origin that
# mpirun resumes to end it may still write its view: every rank silent); no
# receiver switches.
for kind in stop die; do
    fault_run origin-$kind $kind:0 8 --enable-recovery
    grep -q "the origin (rank 0) silent" "$T/stderr" || fail "$case: the origin is not named"
    status_field ok False
    status_field ranks_ok 0
    grep -q "version 8" "$T/stdout" && fail "$case: a receiver claims version 8"
    for r in 3 4 5; do [ "$(readlink "$T/out/rank-$r/current")" = v7 ] || fail "$case: rank $r switched"; done
done
# The origin dies while relay 2 lags (it stops on taking the plan and resumes 2 s later, within
# --timeout-s): relay 1 is never sent more than half either, so no receiver switches. (The fault
# once fired only when the slower relay had half, after relay 1 had passed on the whole version:
# ranks 3 and 4 switched, as on a loaded machine.)
rm -f "$T/stderr"
( for _ in $(seq 1 600); do
      p=$(sed -n 's/.*test signal: stopping .* (pid \([0-9]*\)).*/\1/p' "$T/stderr" 2>/dev/null | head -1)
      [ -n "$p" ] && { sleep 2; kill -CONT "$p"; break; }
      sleep 0.05
  done ) &
lagging=$!
fault_run origin-die-lagging-relay die:0 8 --enable-recovery -x VKSWARM_TEST_SIGNAL=2:stop:plan
wait $lagging
grep -q "rank 2: test signal: stopping at plan" "$T/stderr" || fail "$case: relay 2 did not lag (test premise)"
grep -q "the origin (rank 0) silent" "$T/stderr" || fail "$case: the origin is not named"
grep -q "version 8" "$T/stdout" && fail "$case: a receiver claims version 8"
for r in 3 4 5; do [ "$(readlink "$T/out/rank-$r/current")" = v7 ] || fail "$case: rank $r switched"; done
fault_run origin-stop-plain stop:0 8
[ $rc -ne 0 ] || fail "origin-stop-plain: exit 0 for a failed broadcast"
grep -q "the origin (rank 0) silent" "$T/stderr" || fail "origin-stop-plain: the origin is not named"

# A receiver killed mid-transfer leaves its staging directory (issue 9 item
# 4): the others finish, the origin names it, and the next broadcast sweeps it.
fault_run receiver-dies die:4 8 --enable-recovery
status_is 4 silent
for r in 3 5; do status_is $r ok; done
[ -d "$T/out/rank-4/.v8.partial" ] || fail "receiver-dies: no staged version left (test premise)"

# Emulated home uplinks (one wire per sender) down a chain (fan-out 1).
run shared-uplink 0 "${M[@]}" -np 6 "$V" broadcast --file "$T/v2.bin" "${K[@]}" "${A[@]}" --weights-version 9 \
    --fanout 1 --link-mbps 400 --link-latency-ms 2 --shared-uplink
[ "$(grep -c "version 9 $(hash "$T/v2.bin")" "$T/stdout")" = 3 ] || fail "shared-uplink: 3 receivers must print the hash"
expect_store 9 "$T/v2.bin" # and the .v8.partial the origin faults left is gone

# A receiver that died while the origin made no MPI call (the RL trainer trains between
# broadcasts): the origin's next manifest and beat go to the closed connection, whose second
# write raised SIGPIPE and ended the origin without a word before vks_mpi_start ignored it.
# The origin must finish the broadcast with the live receiver within its bounds (timeout_s 2).
case=dead-receiver
rm -rf "$T/dead"
mkdir -p "$T/dead"
mpi_run 60 --enable-recovery -np 3 "$(dirname "$V")/tests/dead_receiver" "$T/dead" > "$T/stdout" 2> "$T/stderr"
grep -q "^rank 0: version 2: rank 1 ok, rank 2 not in [0-9.]* s" "$T/stdout" && grep -q "^rank 1: version 2 ok" "$T/stdout" ||
    { fail "$case: the origin did not outlive a dead receiver"; cat "$T/stdout"; }

echo "broadcast.sh: $fails failures"
[ $fails -eq 0 ]
