//! Process-wide counters that `rivet info --stats` shows from outside the process: port failover
//! (issue #39) — lanes failed over, receives and work requests replayed, the longest failover,
//! connections it gave up on.
//!
//! The counts are published as a small text file per process, `rivet-stats.<pid>` in
//! `RIVET_STATS_DIR` (default `/dev/shm`), rewritten whenever they change: only when a failover
//! ends, never on the data path's common case. The file is removed when the plugin's last
//! context is finalized; `rivet info --stats` ([`read_published`]) skips the files of processes
//! that are gone. Nothing is published (and nothing fails) when the directory is not writable.

// Without the `failover` feature nothing records (the reading side, for `rivet`, stays).
#![cfg_attr(not(feature = "failover"), allow(dead_code))]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The published counts of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailoverCounts {
    /// Lanes (queue pairs) moved to a surviving port.
    pub lanes_failed_over: u64,
    /// Receives replayed, completed locally or re-announced by those failovers.
    pub receives_replayed: u64,
    /// Work requests posted again by those failovers.
    pub work_requests_replayed: u64,
    /// The longest failover, in milliseconds.
    pub longest_ms: u64,
    /// Connections failover gave up on (they failed as without it).
    pub gave_up: u64,
}

static COUNTS: Mutex<FailoverCounts> = Mutex::new(FailoverCounts {
    lanes_failed_over: 0,
    receives_replayed: 0,
    work_requests_replayed: 0,
    longest_ms: 0,
    gave_up: 0,
});

/// Where this process publishes (`RIVET_STATS_DIR`, default `/dev/shm`).
fn dir() -> PathBuf {
    std::env::var_os("RIVET_STATS_DIR").map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

fn file_in(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("rivet-stats.{pid}"))
}

/// A lane failed over: `receives` and `work_requests` replayed, in `ms`.
pub(crate) fn lane_failed_over(receives: u64, work_requests: u64, ms: u64) {
    update(|c| {
        c.lanes_failed_over += 1;
        c.receives_replayed += receives;
        c.work_requests_replayed += work_requests;
        c.longest_ms = c.longest_ms.max(ms);
    });
}

/// Failover gave up on a connection.
pub(crate) fn gave_up() {
    update(|c| c.gave_up += 1);
}

fn update(change: impl FnOnce(&mut FailoverCounts)) {
    let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    change(&mut counts);
    // Best effort: counts that cannot be published are still kept (and shown in the WARN lines).
    let _ = std::fs::write(file_in(&dir(), std::process::id()), encode(&counts));
}

/// The plugin's last context was finalized: the published file goes.
pub(crate) fn unpublish() {
    let _ = std::fs::remove_file(file_in(&dir(), std::process::id()));
}

fn encode(c: &FailoverCounts) -> String {
    let mut out = String::new();
    for (key, value) in [
        ("lanes_failed_over", c.lanes_failed_over),
        ("receives_replayed", c.receives_replayed),
        ("work_requests_replayed", c.work_requests_replayed),
        ("longest_ms", c.longest_ms),
        ("gave_up", c.gave_up),
    ] {
        let _ = writeln!(out, "{key} {value}");
    }
    out
}

fn decode(text: &str) -> FailoverCounts {
    let mut c = FailoverCounts::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(value) = value.parse() else { continue };
        match key {
            "lanes_failed_over" => c.lanes_failed_over = value,
            "receives_replayed" => c.receives_replayed = value,
            "work_requests_replayed" => c.work_requests_replayed = value,
            "longest_ms" => c.longest_ms = value,
            "gave_up" => c.gave_up = value,
            _ => {}
        }
    }
    c
}

/// What the processes still running published in `dir` (`None`: `RIVET_STATS_DIR` or
/// `/dev/shm`), by process id, in order.
pub fn read_published(dir: Option<&Path>) -> Vec<(u32, FailoverCounts)> {
    let dir = dir.map_or_else(self::dir, Path::to_path_buf);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, FailoverCounts)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let pid: u32 = name.to_str()?.strip_prefix("rivet-stats.")?.parse().ok()?;
            // A process that is gone left its file behind (killed before `finalize`).
            Path::new(&format!("/proc/{pid}")).exists().then_some(())?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            Some((pid, decode(&text)))
        })
        .collect();
    found.sort_by_key(|(pid, _)| *pid);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_and_gone_processes_are_skipped() {
        let dir = std::env::temp_dir().join(format!("rivet-stats-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let counts = FailoverCounts {
            lanes_failed_over: 3,
            receives_replayed: 7,
            work_requests_replayed: 11,
            longest_ms: 13,
            gave_up: 1,
        };
        std::fs::write(file_in(&dir, std::process::id()), encode(&counts)).unwrap();
        // No process has pid u32::MAX - 1 (above the kernel's pid_max).
        std::fs::write(file_in(&dir, u32::MAX - 1), encode(&counts)).unwrap();
        std::fs::write(dir.join("rivet-stats.junk"), "x").unwrap();
        let read = read_published(Some(&dir));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(read, vec![(std::process::id(), counts)]);
        assert_eq!(
            decode("lanes_failed_over x\nbogus 4\n"),
            FailoverCounts::default()
        );
    }
}
