//! Loopback RDMA WRITE WITH IMM between two RC QPs on the first usable port (or the port named by
//! `RIVET_LOOPBACK_PORT=dev:port`): writes 1 MiB (or `RIVET_LOOPBACK_BYTES`) and checks every byte.
//!
//! Run inside the Soft-RoCE VM: `vm/run.sh -- target/debug/examples/loopback`.

use std::process::ExitCode;
use std::time::Duration;

use rivet_verbs_ffi::discover;
use rivet_verbs_ffi::discover::DiscoverOptions;
use rivet_verbs_ffi::selftest::loopback_write_imm;

fn main() -> ExitCode {
    let bytes = std::env::var("RIVET_LOOPBACK_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    let ports = match discover(&DiscoverOptions::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("loopback: no usable port: {e}");
            return ExitCode::FAILURE;
        }
    };
    let wanted = std::env::var("RIVET_LOOPBACK_PORT").ok();
    let Some(port) = ports.iter().find(|p| {
        wanted
            .as_deref()
            .is_none_or(|w| w == format!("{}:{}", p.name, p.port))
    }) else {
        eprintln!("loopback: port {wanted:?} not found");
        return ExitCode::FAILURE;
    };
    println!(
        "loopback on {}:{} gid[{}] {} ({} bytes)",
        port.name, port.port, port.gid_index, port.gid_string, bytes
    );
    match loopback_write_imm(port, bytes, Duration::from_secs(30)) {
        Ok(r) => {
            println!(
                "ok: {} bytes verified, qp {} -> {}, max_inline_data {}, {:?}",
                r.bytes, r.qp_nums.0, r.qp_nums.1, r.max_inline_data, r.elapsed
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("loopback failed: {e}");
            ExitCode::FAILURE
        }
    }
}
