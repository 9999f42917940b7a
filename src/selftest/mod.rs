//! `rivet selftest`: qualify each data path on this machine's own devices before using it.
//!
//! For each data path (libibverbs; mlx5 direct where the device is an mlx5 device) a child process
//! (`rivet selftest --child PATH`, with `RIVET_MLX5_DIRECT` set for it: the plugin reads it when a
//! port is first opened) loads the plugin through its C table as NCCL does, connects one
//! connection to itself and moves a pattern set: every size from 0 B to 64 MiB (powers of two and
//! their neighbours), grouped receives (several buffers, tags, smaller sends than posted), and a
//! stream of small messages with 8 in flight, enough to wrap every ring of the connection many
//! times. Every byte of every receive, the bytes past its end, and every completion's size are
//! checked ([`check`]). The parent prints one PASS/FAIL/SKIP line per path and compares the two
//! paths' completion sequences (A/B) when both ran.

mod check;

use crate::bench::measure::{STALL, idle, post_until, wait};
use crate::bench::plugin::{Comm, Plugin, Request};
use crate::bench::{Error, find_plugin};
use check::{Completion, POISON, check_receive, fill};
use std::io::Write;
use std::os::raw::c_int;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

const USAGE: &str = "usage: rivet selftest [--dev D] [--quick] [--plugin PATH]

Moves a pattern set through each data path of device D (default 0) over a loopback connection and
checks every byte and completion: PASS, FAIL or SKIP per path, then an A/B of the paths'
completions. Exit status 1 on any FAIL, or when no path could be tested (no device).
  --quick   fewer messages: 5000 small messages instead of 100000, 64 grouped receives instead
            of 256, the neighbours of powers of two (2^k-1, 2^k+1) only up to 1 MiB (every power
            of two up to 64 MiB still)
";

const MIB: usize = 1 << 20;
/// Largest message of the size sweep.
const MAX_SIZE: usize = 64 * MIB;
/// Bytes after each receive that must keep [`POISON`].
const GUARD: usize = 64;
/// Outstanding messages in the stream phase (as NCCL keeps per channel).
const WINDOW: usize = 8;
/// Slot of one stream message (sizes below it; the rest is guard).
const STREAM_SLOT: usize = 512;
/// Largest receive a grouped receive takes per buffer, and the buffers per group (NCCL's maximum).
const LANE: usize = 64 * 1024 + GUARD;
const GROUP_MAX: usize = 8;
/// Message-number spaces of the phases, so no two messages share a pattern.
const SIZES_BASE: u64 = 0;
const GROUPED_BASE: u64 = 1 << 20;
const STREAM_BASE: u64 = 1 << 24;

/// The two data paths, in the order they run: (name, value of `RIVET_MLX5_DIRECT`).
const PATHS: [(&str, &str); 2] = [("verbs", "0"), ("mlx5-direct", "1")];

#[derive(Debug, Clone)]
struct Options {
    dev: i32,
    quick: bool,
    plugin: Option<PathBuf>,
    child: Option<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        dev: 0,
        quick: false,
        plugin: std::env::var_os("RIVET_PLUGIN_LIB")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        child: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dev" => {
                o.dev = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--dev needs a device index")?;
            }
            "--quick" => o.quick = true,
            "--plugin" => o.plugin = Some(it.next().ok_or("--plugin needs a path")?.into()),
            "--child" => o.child = Some(it.next().ok_or("--child needs a path name")?.clone()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

/// The size sweep: 0-3 B, then each power of two up to 64 MiB with its neighbours (`quick`: the
/// neighbours only up to 1 MiB, as checking bytes dominates the time under an emulator).
fn sweep_sizes(quick: bool) -> Vec<usize> {
    let neighbours_up_to = if quick { MIB } else { MAX_SIZE };
    let mut sizes = vec![0, 1, 2, 3];
    let mut p = 4;
    while p <= MAX_SIZE {
        if p <= neighbours_up_to {
            sizes.push(p - 1);
        }
        sizes.push(p);
        if p < neighbours_up_to {
            sizes.push(p + 1);
        }
        p *= 2;
    }
    sizes
}

/// Posted and sent size of buffer `j` of group `g` (sent ≤ posted; zero-byte buffers included).
fn group_sizes(g: usize, j: usize) -> (usize, usize) {
    const POSTED: [usize; 8] = [0, 1, 4096, 65536, 13, 4097, 8, 30000];
    let posted = POSTED[(g + j) % POSTED.len()];
    (posted, posted.saturating_sub((g + j) % 3))
}

/// Size of stream message `i` (0 B to 299 B).
fn stream_size(i: usize) -> usize {
    (i * 37 + 11) % 300
}

/// What one path's child saw.
struct Outcome {
    completions: Vec<Completion>,
    failure: Option<String>,
}

/// Wait for `req` on `comm`, returning every buffer's reported size.
fn wait_sizes(comm: &Comm<'_>, req: &Request, what: &str) -> Result<[c_int; 8], Error> {
    let start = Instant::now();
    loop {
        if let Some(sizes) = comm.test_sizes(req)? {
            return Ok(sizes);
        }
        idle();
        if start.elapsed() > STALL {
            return Err(Error::Stalled(format!(
                "{what}: no completion for {} s",
                STALL.as_secs()
            )));
        }
    }
}

fn size_of(reported: c_int) -> usize {
    usize::try_from(reported).unwrap_or(usize::MAX)
}

/// The pattern set on one connection; completions are appended to `out` as they are checked.
struct Run<'a, 'p> {
    send: &'a Comm<'p>,
    recv: &'a Comm<'p>,
    out: Vec<Completion>,
}

impl Run<'_, '_> {
    fn sizes(&mut self, quick: bool) -> Result<(), String> {
        let mut sbuf = self.send.register(MAX_SIZE).map_err(|e| e.to_string())?;
        let mut rbuf = self
            .recv
            .register(MAX_SIZE + GUARD)
            .map_err(|e| e.to_string())?;
        for (i, len) in sweep_sizes(quick).into_iter().enumerate() {
            let msg = SIZES_BASE + i as u64;
            let tag = i as c_int;
            fill(&mut sbuf.bytes_mut()[..len], msg);
            rbuf.bytes_mut()[..len + GUARD].fill(POISON);
            let what = format!("{len}-byte message");
            let r = post_until(&what, || self.recv.irecv(&rbuf, 0, len, tag))
                .map_err(|e| e.to_string())?;
            let s = post_until(&what, || self.send.isend(&sbuf, 0, len, tag))
                .map_err(|e| e.to_string())?;
            wait(self.send, &s, &what).map_err(|e| e.to_string())?;
            let got = wait_sizes(self.recv, &r, &what).map_err(|e| e.to_string())?;
            let got = size_of(got[0]);
            check_receive(&rbuf.bytes_mut()[..len + GUARD], msg, len, got)
                .map_err(|m| format!("{what}: {m}"))?;
            self.out.push(Completion {
                phase: "sizes",
                index: i as u64,
                buffer: 0,
                size: got,
                tag,
            });
        }
        Ok(())
    }

    fn grouped(&mut self, groups: usize) -> Result<(), String> {
        let mut sbuf = self
            .send
            .register(LANE * GROUP_MAX)
            .map_err(|e| e.to_string())?;
        let mut rbuf = self
            .recv
            .register(LANE * GROUP_MAX)
            .map_err(|e| e.to_string())?;
        for g in 0..groups {
            let n = 1 + g % GROUP_MAX;
            let tag = |j: usize| (1000 + g * GROUP_MAX + j) as c_int;
            let msg = |j: usize| GROUPED_BASE + (g * GROUP_MAX + j) as u64;
            let mut buffers = Vec::with_capacity(n);
            for j in 0..n {
                let (posted, sent) = group_sizes(g, j);
                fill(&mut sbuf.bytes_mut()[j * LANE..j * LANE + sent], msg(j));
                rbuf.bytes_mut()[j * LANE..(j + 1) * LANE].fill(POISON);
                buffers.push((j * LANE, posted, tag(j)));
            }
            let what = format!("grouped receive {g} ({n} buffers)");
            let r = post_until(&what, || self.recv.irecv_group(&rbuf, &buffers))
                .map_err(|e| e.to_string())?;
            // Odd groups send in reverse buffer order: the tags, not the order, pick the buffer.
            let order: Vec<usize> = if g % 2 == 1 {
                (0..n).rev().collect()
            } else {
                (0..n).collect()
            };
            let mut sends = Vec::with_capacity(n);
            for &j in &order {
                let (_, sent) = group_sizes(g, j);
                sends.push(
                    post_until(&what, || self.send.isend(&sbuf, j * LANE, sent, tag(j)))
                        .map_err(|e| e.to_string())?,
                );
            }
            for s in &sends {
                wait(self.send, s, &what).map_err(|e| e.to_string())?;
            }
            let got = wait_sizes(self.recv, &r, &what).map_err(|e| e.to_string())?;
            for (j, &reported) in got.iter().enumerate().take(n) {
                let (_, sent) = group_sizes(g, j);
                let size = size_of(reported);
                check_receive(
                    &rbuf.bytes_mut()[j * LANE..(j + 1) * LANE],
                    msg(j),
                    sent,
                    size,
                )
                .map_err(|m| format!("{what}, buffer {j}: {m}"))?;
                self.out.push(Completion {
                    phase: "grouped",
                    index: g as u64,
                    buffer: j as u8,
                    size,
                    tag: tag(j),
                });
            }
        }
        Ok(())
    }

    fn stream(&mut self, count: usize) -> Result<(), String> {
        let e = |e: Error| e.to_string();
        let mut sbuf = self.send.register(STREAM_SLOT * WINDOW).map_err(e)?;
        let mut rbuf = self.recv.register(STREAM_SLOT * WINDOW).map_err(e)?;
        let tag: c_int = 7;
        let slot = |i: usize| (i % WINDOW) * STREAM_SLOT;
        let mut recvs: std::collections::VecDeque<(usize, Request)> = Default::default();
        let mut sends: std::collections::VecDeque<Request> = Default::default();
        let (mut next_recv, mut next_send, mut done) = (0, 0, 0);
        let mut last_progress = Instant::now();
        while done < count {
            let mut progressed = false;
            while next_recv < count && recvs.len() < WINDOW {
                let at = slot(next_recv);
                rbuf.bytes_mut()[at..at + STREAM_SLOT].fill(POISON);
                let Some(r) = self.recv.irecv(&rbuf, at, STREAM_SLOT, tag).map_err(e)? else {
                    break;
                };
                recvs.push_back((next_recv, r));
                next_recv += 1;
                progressed = true;
            }
            while next_send < next_recv && sends.len() < WINDOW {
                let (at, len) = (slot(next_send), stream_size(next_send));
                fill(
                    &mut sbuf.bytes_mut()[at..at + len],
                    STREAM_BASE + next_send as u64,
                );
                let Some(s) = self.send.isend(&sbuf, at, len, tag).map_err(e)? else {
                    break;
                };
                sends.push_back(s);
                next_send += 1;
                progressed = true;
            }
            if let Some(s) = sends.front() {
                if self.send.test(s).map_err(e)?.is_some() {
                    sends.pop_front();
                    progressed = true;
                }
            }
            if let Some((i, r)) = recvs.front() {
                let i = *i;
                if let Some(got) = self.recv.test_sizes(r).map_err(e)? {
                    recvs.pop_front();
                    let size = size_of(got[0]);
                    let at = slot(i);
                    check_receive(
                        &rbuf.bytes_mut()[at..at + STREAM_SLOT],
                        STREAM_BASE + i as u64,
                        stream_size(i),
                        size,
                    )
                    .map_err(|m| format!("small message {i} of {count}: {m}"))?;
                    self.out.push(Completion {
                        phase: "stream",
                        index: i as u64,
                        buffer: 0,
                        size,
                        tag,
                    });
                    done += 1;
                    progressed = true;
                }
            }
            if progressed {
                last_progress = Instant::now();
            } else {
                idle();
                if last_progress.elapsed() > STALL {
                    return Err(format!(
                        "small messages: no progress for {} s at message {done} of {count}",
                        STALL.as_secs()
                    ));
                }
            }
        }
        for s in &sends {
            wait(self.send, s, "last small sends").map_err(e)?;
        }
        Ok(())
    }
}

/// Counts of one run, for the PASS line.
fn workload(quick: bool) -> (usize, usize) {
    if quick { (64, 5_000) } else { (256, 100_000) }
}

/// The child: run the pattern set on `path` and print `C <completion>` lines, then one
/// `PASS`/`FAIL`/`SKIP` line.
fn child(o: &Options, path: &str) -> ExitCode {
    // What the plugin will do on this device with the environment we were given (the same
    // decision the loaded library makes when it opens the port).
    let ports = match nccl_net_rivet::devices::discover() {
        Ok(p) => p,
        Err(why) => {
            println!("FAIL no RDMA device: {why}");
            return ExitCode::FAILURE;
        }
    };
    let Some(port) = usize::try_from(o.dev).ok().and_then(|d| ports.get(d)) else {
        println!("FAIL --dev {}: there are {} device(s)", o.dev, ports.len());
        return ExitCode::FAILURE;
    };
    let name = port.info.name.clone();
    let actual = port.data_path();
    if actual != path {
        if path == "mlx5-direct" {
            println!("SKIP {name} is not an mlx5 device (or libmlx5 is missing)");
            return ExitCode::SUCCESS;
        }
        println!("FAIL {name}: the plugin takes the {actual} path, not {path}");
        return ExitCode::FAILURE;
    }
    let started = Instant::now();
    let (groups, count) = workload(o.quick);
    let outcome = run_path(o, groups, count);
    let mut stdout = std::io::stdout().lock();
    for c in &outcome.completions {
        let _ = writeln!(stdout, "C {c}");
    }
    match outcome.failure {
        Some(why) => {
            let _ = writeln!(stdout, "FAIL {name}: {why}");
            ExitCode::FAILURE
        }
        None => {
            let _ = writeln!(
                stdout,
                "PASS {name}: {} sizes 0 B-64 MiB, {groups} grouped receives, {count} small messages \
                 (window {WINDOW}), {} completions and every byte checked, {:.1} s",
                sweep_sizes(o.quick).len(),
                outcome.completions.len(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
    }
}

fn run_path(o: &Options, groups: usize, count: usize) -> Outcome {
    let mut outcome = Outcome {
        completions: Vec::new(),
        failure: None,
    };
    let setup = || -> Result<Plugin, Error> {
        let path = find_plugin(o.plugin.as_ref())?;
        Plugin::load(&path, o.dev, None)
    };
    let plugin = match setup() {
        Ok(p) => p,
        Err(e) => {
            outcome.failure = Some(e.to_string());
            return outcome;
        }
    };
    let result = (|| -> Result<Vec<Completion>, String> {
        let (listener, handle) = plugin.listen().map_err(|e| e.to_string())?;
        let mut peer = handle;
        let (send, recv) = crate::bench::measure::establish(&plugin, &listener, &mut peer)
            .map_err(|e| e.to_string())?;
        let mut run = Run {
            send: &send,
            recv: &recv,
            out: Vec::new(),
        };
        let result = run
            .sizes(o.quick)
            .and_then(|()| run.grouped(groups))
            .and_then(|()| run.stream(count));
        match result {
            Ok(()) => Ok(run.out),
            Err(why) => {
                outcome.completions = run.out;
                Err(why)
            }
        }
    })();
    match result {
        Ok(c) => outcome.completions = c,
        Err(why) => outcome.failure = Some(why),
    }
    outcome
}

/// One path's result as the parent reads it from the child.
struct PathResult {
    verdict: String,
    completions: Vec<Completion>,
    passed: bool,
}

fn run_child(o: &Options, path: &str, direct: &str) -> Result<PathResult, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating rivet: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["selftest", "--child", path, "--dev", &o.dev.to_string()])
        .env("RIVET_MLX5_DIRECT", direct)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if o.quick {
        cmd.arg("--quick");
    }
    if let Some(p) = &o.plugin {
        cmd.arg("--plugin").arg(p);
    }
    let output = cmd
        .output()
        .map_err(|e| format!("starting the child: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut completions = Vec::new();
    let mut verdict = None;
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("C ") {
            completions.push(Completion::parse(c).ok_or_else(|| format!("bad line {line:?}"))?);
        } else if !line.is_empty() {
            verdict = Some(line.to_owned());
        }
    }
    let verdict = verdict.unwrap_or_else(|| {
        format!(
            "FAIL the child printed no verdict (exit status {})",
            output.status
        )
    });
    let passed = verdict.starts_with("PASS") && output.status.success();
    Ok(PathResult {
        verdict,
        completions,
        passed,
    })
}

/// `rivet selftest …`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let o = match parse(args) {
        Ok(o) => o,
        Err(why) => {
            eprintln!("rivet selftest: {why}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &o.child {
        return child(&o, path);
    }
    if let Err(why) = nccl_net_rivet::devices::discover() {
        println!("FAIL rivet selftest: no RDMA device to test: {why}.");
        return ExitCode::FAILURE;
    }
    let mut failed = false;
    let mut ran: Vec<(&str, Vec<Completion>)> = Vec::new();
    for (path, direct) in PATHS {
        let result = run_child(&o, path, direct).unwrap_or_else(|why| PathResult {
            verdict: format!("FAIL {why}"),
            completions: Vec::new(),
            passed: false,
        });
        let (word, rest) = result
            .verdict
            .split_once(' ')
            .unwrap_or((&result.verdict, ""));
        println!("{word} {path}: {rest}");
        failed |= word != "PASS" && word != "SKIP";
        if result.passed {
            ran.push((path, result.completions));
        }
    }
    match ran.as_slice() {
        [(a, x), (b, y)] => match check::compare_paths((a, x), (b, y)) {
            Ok(n) => println!("PASS A/B: {n} completions identical (sizes, order, tags)"),
            Err(why) => {
                println!("FAIL A/B: {why}");
                failed = true;
            }
        },
        [_] => println!("SKIP A/B: only one data path ran"),
        _ => {}
    }
    if failed || ran.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_covers_zero_to_64_mib_and_the_page_edges() {
        for quick in [false, true] {
            let sizes = sweep_sizes(quick);
            for s in [0, 1, 2, 3, 4095, 4096, 4097, MIB - 1, MIB, MAX_SIZE] {
                assert!(sizes.contains(&s), "{s} missing (quick {quick})");
            }
            assert_eq!(sizes.iter().max(), Some(&MAX_SIZE));
        }
        assert!(sweep_sizes(false).contains(&(MAX_SIZE - 1)));
    }

    #[test]
    fn grouped_sends_fit_their_buffers_and_the_stream_its_slots() {
        for g in 0..64 {
            for j in 0..GROUP_MAX {
                let (posted, sent) = group_sizes(g, j);
                assert!(sent <= posted && posted + GUARD <= LANE);
            }
        }
        assert!((0..10_000).all(|i| stream_size(i) < STREAM_SLOT));
        assert!((0..10_000).any(|i| stream_size(i) == 0));
    }
}
