//! `rivet`: the command-line companion of the Rivet NCCL net plugin.
//!
//! - `rivet info`: the RDMA ports the plugin would expose to NCCL, one line each, or why there are none.
//! - `rivet doctor`: the machine configuration RDMA jobs usually fail on, one verdict per check.
//! - `rivet bench`: bandwidth and latency between two processes through the plugin's C table.
//! - `rivet selftest`: every data path checked byte by byte over loopback, PASS/FAIL per path.

mod bench;
mod doctor;
mod selftest;
mod stats;

use std::process::ExitCode;

const USAGE: &str = "usage: rivet <command>

commands:
  info      list the RDMA ports the plugin exposes to NCCL (or say why there are none)
            --stats: per-port counters (bytes, packets, errors, retries) instead
  doctor    check the machine's RDMA/GPU configuration (rivet doctor --help)
  bench     bandwidth and latency through the plugin (rivet bench --help)
  selftest  check every data path on this machine's devices, byte by byte (rivet selftest --help)
  version   print the version: crate, commit, net/CollNet ABI and wire versions, features
  help      print this text
";

fn info() -> ExitCode {
    println!("{}", nccl_net_rivet::version::line());
    match nccl_net_rivet::devices::discover() {
        Ok(ports) => {
            for (index, port) in ports.iter().enumerate() {
                println!("{index}: {port}");
            }
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("Rivet: {why}.");
            // Not a failure of the command: it answered the question.
            ExitCode::SUCCESS
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("info") if args.get(1).is_some_and(|a| a == "--stats") => {
            print!("{}", stats::report());
            ExitCode::SUCCESS
        }
        Some("info") => info(),
        Some("bench") => bench::main(&args[1..]),
        Some("selftest") => selftest::main(&args[1..]),
        Some("doctor") => doctor::main(&args[1..]),
        Some("version" | "--version" | "-V") => {
            println!("{}", nccl_net_rivet::version::line());
            ExitCode::SUCCESS
        }
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("rivet: unknown command {other:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
