#!/usr/bin/env bash
# docs/multi-machine.md's walk-through, run as written with each of its two
# machines a Linux network namespace of this host (tools/lib-netns.sh): the
# page's hostfile (its addresses replaced by the namespaces'), its config, and
# its two mpirun lines (the run, then --resume) taken from the page itself, with
# Open MPI's ports pinned as the page pins them. mpirun starts each machine's
# daemon through an ssh stand-in that enters the namespace holding the host's
# address, so the hostfile and the pinned ports are what connect the ranks.
# Needs root (ip netns): exits 0, saying why, where not permitted (as
# tools/netem-pipeline does; tools/test runs both).
# Usage: tests/two_machines.sh [BUILD_DIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
page=$src/docs/multi-machine.md
cd "$src"
. tools/lib-netns.sh
if ! netns_permitted; then
    echo "two_machines: SKIP: 'ip netns' is not permitted here (needs root and CAP_NET_ADMIN)" >&2
    exit 0
fi
work=$(mktemp -d /tmp/vkswarm-two.XXXXXX)
trap 'netns_cleanup; rm -rf "$work"' EXIT
netns_setup 2

# the ssh stand-in: `AGENT [options] HOST COMMAND...` runs COMMAND in HOST's namespace
cat > "$work/netns-ssh" <<AGENT
#!/usr/bin/env bash
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
exec ip netns exec ${netns_tag}n\$((\${host##*.} - 1)) /bin/sh -c "\$*"
AGENT
chmod +x "$work/netns-ssh"

# the page's sh blocks of sections 4 (hostfile) and 6 (the run), and its `vkswarm mpirun` lines
block() { # the lines of the sh block that follows the line matching $1
    awk -v pat="$1" 'index($0, pat) {f = 1} f && /^```sh$/ {b = 1; next} b && /^```$/ {exit} b' "$page"
}
mpirun_line() { # the Nth mpirun command of the page's section 6-7, continuation lines joined
    awk '/^build\/vkswarm mpirun --hostfile hosts -np 2/ {c = 1} c {printf "%s", $0; if ($0 !~ /\\$/) {print ""; c = 0}}' "$page" |
        sed 's/\\//g' | sed -n "$1p"
}
mkdir -p "$work/build" && ln -s "$build/vkswarm" "$work/build/vkswarm"
cd "$work"
export PATH=$work/build:$PATH
block "## 4. A hostfile" | sed 's/10\.8\.0\./10.211.0./' | bash -e
block "## 6. The run" | bash -e
cat hosts >&2
run=$(mpirun_line 1)
resume=$(mpirun_line 2)
[ -n "$run" ] && [ -n "$resume" ] || { echo "two_machines: FAIL: no mpirun lines in $page" >&2; exit 1; }
# the namespaces reach mpirun over the bridge; ssh is the stand-in
extra="--mca plm_rsh_agent $work/netns-ssh --mca oob_tcp_if_include 10.211.0.0/24 --mca btl_tcp_if_include vkslink"
launch() { # mpirun line, output file
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 400 bash -c "${1/mpirun/mpirun $extra}" >"$2" 2>"$2.err"
}
go() { # mpirun line, output file: the line as the page has it, the extra options after "mpirun"
    echo "two_machines: ${1/mpirun/mpirun $extra}" >&2
    launch "$@" && return 0
    local rc=$?
    # Open MPI's daemons failing to start in the namespaces (seen twice: in CI, and on
    # a fresh machine's first run, with nothing of vkswarm started yet: no "vkswarm:" line)
    # is the harness's network, not the run: say so, keep its words, and launch once more
    if grep -q 'unable to reliably start one or more daemons' "$2.err" && ! grep -q '^vkswarm:' "$2.err"; then
        sed 's/^/two_machines: first launch: /' "$2.err" >&2
        echo "two_machines: Open MPI's daemons did not start (exit $rc); launching again in 5 s" >&2
        sleep 5
        launch "$@" && return 0
        rc=$?
    fi
    cat "$2.err" >&2
    echo "two_machines: FAIL: exit $rc from the run" >&2
    exit 1
}
go "$run" run.out
grep -q 'final checkpoint: rl-two/step-000000002' run.out ||
    { cat run.out run.out.err >&2; echo "two_machines: FAIL: no final checkpoint of step 2" >&2; exit 1; }
grep -q 'inference rank 1' run.out.err && grep 'dropped\|refused' run.out.err >&2 &&
    { echo "two_machines: FAIL: the inference rank was lost" >&2; exit 1; }
# the pinned ports are free again once the first run's connections have left TCP's TIME_WAIT
# (up to 60 s; docs/multi-machine.md says so): a run started before that cannot bind them
ports_busy() {
    { ss -tanH; for i in 0 1; do ip netns exec ${netns_tag}n$i ss -tanH; done; } | grep -q ':41000\b'
}
for i in $(seq 1 90); do ports_busy || break; sleep 1; done
ports_busy && echo "two_machines: port 41000 still busy after 90 s" >&2
go "$resume" resume.out
grep -q -- '--resume: continuing from rl-two/step-000000002' resume.out.err ||
    { cat resume.out.err >&2; echo "two_machines: FAIL: the resume did not continue from step 2" >&2; exit 1; }
grep -q 'final checkpoint: rl-two/step-000000003' resume.out ||
    { cat resume.out resume.out.err >&2; echo "two_machines: FAIL: no final checkpoint of step 3" >&2; exit 1; }
echo "two_machines: rl on two namespaces through the hostfile with pinned ports: 2 steps, then resumed to 3"
