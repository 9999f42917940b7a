#!/usr/bin/env bash
# scripts/miri.sh: run the tests that can run under Miri (undefined behaviour, aliasing, leaks in
# unsafe code) on a nightly toolchain with the `miri` component (docs/testing.md, "Miri"). Not part of
# scripts/test.sh: it needs a nightly toolchain and takes ~6 minutes on the 2-core host.
#
# Miri stops the whole test process at the first call it cannot emulate (dlopen, sockets,
# getifaddrs, SSE fences), so each run names the tests that make none, and leaves out those that
# would take too long interpreted (a million WQEs, 65,536 messages).
#
#   scripts/miri.sh            install miri (rustup) if needed, then run
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

toolchain=${RIVET_MIRI_TOOLCHAIN:-nightly}
if ! cargo "+$toolchain" miri --version >/dev/null 2>&1; then
  rustup toolchain install "$toolchain" --profile minimal --component miri,rust-src
fi
cargo "+$toolchain" miri setup
# Handles are integers NCCL holds as `void*`; turning them into pointers is by design and they
# are never dereferenced.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-permissive-provenance}"
miri() { cargo "+$toolchain" miri test --locked "$@"; }

# The plugin: the handle tables, the mlx5 direct path on the software model (raw queue memory),
# the ports' property strings, queue-pair attributes, interface choice, profiler events.
miri -p rivet-plugin --lib -- \
  handle:: backend::qp_params backend::mlx5::pair_tests backend::mlx5::endpoint::tests::model \
  devices::tests::the_pfs oob::iface profiler:: \
  --skip this_machine_has_some_address --skip stream_through_minimal_rings \
  --skip thousands_of_messages --skip sequence_wraps_16_bits --skip pools_exhausted \
  --skip receive_slots_256 --skip unsignaled_cts_stream_drains --skip unsignaled_data_writes_drain
# verbs-ffi: the C layouts, work-request chains, the mlx5 formats and the software mlx5 model.
miri -p rivet-verbs-ffi --lib -- qp:: sys:: error:: discover::gid discover::identity discover::speed mlx5::direct
miri -p rivet-verbs-ffi --test mlx5_formats
miri -p rivet-verbs-ffi --test mlx5_model -- --skip a_million_wqes
echo "miri: passed"
