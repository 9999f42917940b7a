# benches/lib.sh: what the benchmark scripts share. Sourced, not run.
# shellcheck shell=bash

# bench_profile ARGS...: the build profile the arguments ask for (`--release`, else debug); exits
# with usage on anything else.
bench_profile() {
    local a profile=debug
    for a in "$@"; do
        case $a in
            --release) profile=release ;;
            *) echo "usage: $0 [--release]" >&2; exit 2 ;;
        esac
    done
    echo "$profile"
}

# gid_index DEV IPV4: the index of IPV4's RoCE v2 GID on device DEV (port 1), as the plugin's own
# discovery chooses it (`$rivet info` limited to DEV:1, RoCE v2, IPv4), so any device libibverbs
# lists is found, wherever its sysfs tree is; fails (with a reason on stderr) when Rivet's GID
# there is not IPV4's, e.g. when the netdev has another IPv4 address first. Needs $rivet, the
# rivet command the benchmark runs.
gid_index() {
    local dev=$1 want=::ffff:$2 line
    line=$(env -u RIVET_MESH -u RIVET_DISABLE -u NCCL_IB_DISABLE -u NCCL_IB_GID_INDEX \
        NCCL_IB_HCA="=$dev:1" NCCL_IB_ROCE_VERSION_NUM=2 NCCL_IB_ADDR_FAMILY=AF_INET \
        "${rivet:?gid_index needs \$rivet}" info | grep -F " $dev port 1 RoCE ") || true
    if [[ $line =~ gid\[([0-9]+)\]\ ([^ ]+) && ${BASH_REMATCH[2]} == "$want" ]]; then
        echo "${BASH_REMATCH[1]}"
        return 0
    fi
    echo "gid_index: Rivet uses no RoCE v2 GID $want on $dev port 1 (rivet info: ${line:-no such RoCE port})" >&2
    return 1
}

# bench_in_rig TOPOLOGY TIMEOUT MULTI_SH_ARGS...: unless this process already runs inside that rig,
# boot it (vm/multi.sh --topology TOPOLOGY --timeout TIMEOUT MULTI_SH_ARGS..., which end with
# `-- COMMAND...`, the benchmark script again) in place of this process.
bench_in_rig() {
    local topology=$1 timeout=$2 repo
    shift 2
    [[ ${RIVET_VM_TOPOLOGY:-} == "$topology" ]] && return 0
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    exec bash "$repo/vm/multi.sh" --topology "$topology" --timeout "$timeout" "$@"
}
