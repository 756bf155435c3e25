# Sourced by tools/netem-pipeline and tools/bench-broadcast: MPI ranks in
# separate Linux network namespaces, each joined by a veth pair to a bridge
# in the root namespace (where mpirun and its PMIx server listen), so that
# ranks talk over real TCP links that `tc` can shape. Needs root.
#   netns_permitted          0 when `ip netns` works here
#   netns_setup N            namespaces 0..N-1 (addresses 10.211.0.1..N)
#   netns_qdisc I ARGS...    `tc qdisc replace dev vkslink root ARGS` in namespace I
#                            (the rank's uplink: what it sends)
#   netns_app I CMD...       appends "-np 1 ip netns exec NS CMD" to netns_apps
#   netns_mpirun SECONDS     mpirun over the namespaces' links, the apps of netns_apps
#   netns_cleanup            removes what netns_setup made (also on EXIT)
netns_tag=vks$$
netns_count=0
netns_apps=()

netns_permitted() {
    ip netns add ${netns_tag}probe 2>/dev/null || return 1
    ip netns del ${netns_tag}probe
}

netns_cleanup() {
    local i
    for ((i = 0; i < netns_count; i++)); do ip netns del ${netns_tag}n$i 2>/dev/null || true; done
    ip link del ${netns_tag}br 2>/dev/null || true
    netns_count=0
}

netns_setup() {
    local n=$1 i ns
    ip link add ${netns_tag}br type bridge
    ip addr add 10.211.0.254/24 dev ${netns_tag}br
    ip link set ${netns_tag}br up
    for ((i = 0; i < n; i++)); do
        ns=${netns_tag}n$i
        ip netns add $ns
        netns_count=$((i + 1))
        ip link add ${netns_tag}h$i type veth peer name vkslink netns $ns
        ip link set ${netns_tag}h$i master ${netns_tag}br up
        ip -n $ns addr add 10.211.0.$((i + 1))/24 dev vkslink
        ip -n $ns link set vkslink up
        ip -n $ns link set lo up
    done
}

netns_qdisc() {
    local i=$1
    shift
    ip netns exec ${netns_tag}n$i tc qdisc replace dev vkslink root "$@"
}

netns_app() {
    local i=$1
    shift
    [ ${#netns_apps[@]} -gt 0 ] && netns_apps+=(":")
    netns_apps+=(-np 1 ip netns exec ${netns_tag}n$i "$@")
}

netns_mpirun() {
    # ranks reach mpirun's PMIx server over the bridge, not over loopback
    PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=10.211.0.0/24 \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout "$1" mpirun --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include vkslink \
        --mca oob_tcp_if_include 10.211.0.0/24 "${netns_apps[@]}"
    local rc=$?
    netns_apps=()
    return $rc
}
