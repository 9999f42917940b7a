#!/usr/bin/env bash
# shellcheck disable=SC2016 # single-quoted $ are meant literally (they expand in the VM)
# vm/selftest.sh: checks vm/run.sh's contract (from the host; three VM boots, ~40 s):
#   exit status passed back, stdout and stderr kept apart, working directory, arguments and selected
#   environment carried in, others not; a hung VM killed at --timeout with exit 124 and no QEMU left.
# Exits non-zero on the first broken promise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run=(bash "$here/run.sh")
failures=0
check() { # check WHAT GOT WANT
    if [[ $2 == "$3" ]]; then
        echo "selftest: ok   $1"
    else
        echo "selftest: FAIL $1: got [$2], want [$3]" >&2
        failures=$((failures + 1))
    fi
}

work=$(mktemp -d /tmp/rivet-selftest.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/dir with space"

# 1. Exit status, stdout/stderr, cwd, arguments, environment: one boot.
rc=0
(
    cd "$work/dir with space"
    RIVET_SELFTEST='a b $c' NCCL_SELFTEST=n RUST_SELFTEST=r CARGO_TARGET_DIR=/x/y NOT_PASSED=secret \
        "${run[@]}" --timeout 300 -e 'EXTRA=e 1' -- bash -c '
            echo "cwd=$PWD"
            printf "arg=<%s>\n" "$@"
            echo "env=$RIVET_SELFTEST|$NCCL_SELFTEST|$RUST_SELFTEST|$CARGO_TARGET_DIR|$EXTRA|${NOT_PASSED-unset}|$RIVET_IN_VM"
            echo "to-stderr" >&2
            exit 42' argv0 "it's" '' '$HOME'
) >"$work/out" 2>"$work/err" || rc=$?
check "exit status" "$rc" 42
check "stdout" "$(cat "$work/out")" "cwd=$work/dir with space
arg=<it's>
arg=<>
arg=<\$HOME>
env=a b \$c|n|r|/x/y|e 1|unset|1"
check "stderr" "$(cat "$work/err")" "to-stderr"

# 2. A command that is killed by a signal inside the VM reports 128+N, like a shell.
rc=0
"${run[@]}" --timeout 300 -- bash -c 'kill -TERM $$' || rc=$?
check "signal exit status" "$rc" 143

# 3. Timeout: exit 124, message, and no QEMU left over (found by its run directory).
rc=0
RIVET_VM_KEEP=1 "${run[@]}" --timeout 20 -- sleep 600 2>"$work/err" || rc=$?
check "timeout exit status" "$rc" 124
check "timeout message" "$(grep -c 'TIMEOUT' "$work/err")" 1
rundir=$(sed -n 's/.*run directory kept: //p' "$work/err")
left=0
if [[ -n $rundir ]]; then
    for f in /proc/[0-9]*/cmdline; do
        if tr '\0' ' ' <"$f" 2>/dev/null | grep -q "qemu-system.*$rundir"; then left=$((left + 1)); fi
    done
    rm -rf "$rundir"
fi
check "no QEMU left after timeout" "$left" 0

((failures == 0)) || { echo "selftest: $failures failure(s)" >&2; exit 1; }
echo "selftest: OK"
