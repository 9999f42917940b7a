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

# gid_index DEV IPV4: the RoCE v2 GID index of IPV4 on device DEV (port 1); fails when none.
gid_index() {
    local ports=/sys/class/infiniband/$1/ports/1 a b c d want g
    IFS=. read -r a b c d <<<"$2"
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
    for g in "$ports"/gids/*; do
        if [[ $(cat "$g") == "$want" && $(cat "$ports/gid_attrs/types/${g##*/}" 2>/dev/null) == "RoCE v2" ]]; then
            echo "${g##*/}"
            return
        fi
    done
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
