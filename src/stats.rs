//! `rivet info --stats`: the per-port counters the kernel keeps for each RDMA device
//! (`ports/<p>/counters` and the driver's `ports/<p>/hw_counters`: rxe's `sent_pkts`,
//! `rcvd_pkts`, `retry_exceeded_err`, …; mlx5's `out_of_sequence`, `local_ack_timeout_err`, …),
//! for a quick look during a run. The devices are the ones the plugin's discovery lists, each
//! read in its own sysfs directory (`ibdev_path`); tests pass a list over a fake tree.

use std::fs;
use std::path::Path;

use rivet_verbs_ffi::discover::{ListedDevice, Sysfs, list_devices};

use crate::doctor::dir_names;

/// The counters of one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortCounters {
    /// `device:port`.
    pub(crate) port: String,
    /// `(name, value)` from `counters/`, sorted by name.
    pub(crate) counters: Vec<(String, u64)>,
    /// `(name, value)` from `hw_counters/`, sorted by name.
    pub(crate) hw_counters: Vec<(String, u64)>,
}

impl PortCounters {
    /// Bytes sent and received: `port_xmit_data`/`port_rcv_data` count 4-byte words (IBA).
    pub(crate) fn bytes(&self) -> (Option<u64>, Option<u64>) {
        let get = |name: &str| {
            self.counters
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.saturating_mul(4))
        };
        (get("port_xmit_data"), get("port_rcv_data"))
    }
}

/// Every readable numeric counter file in `dir` (unreadable ones, e.g. root-only, are skipped).
fn read_counters(dir: &Path) -> Vec<(String, u64)> {
    dir_names(dir)
        .into_iter()
        .filter_map(|name| {
            let value = fs::read_to_string(dir.join(&name))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((name, value))
        })
        .collect()
}

/// `rivet info --stats`: the counters of every device discovery lists, or why there is none,
/// then what the processes using Rivet published (port failover).
pub(crate) fn report() -> String {
    let mut s = match list_devices(&Sysfs::system()) {
        Ok(devices) => format(&read(&devices)),
        Err(why) => format!("no RDMA device: {why}\n"),
    };
    s += &format_published(&nccl_net_rivet::stats::read_published(None));
    s
}

/// The port failover counts of processes using Rivet (published by the plugin: see
/// `nccl_net_rivet::stats`).
pub(crate) fn format_published(
    published: &[(u32, nccl_net_rivet::stats::FailoverCounts)],
) -> String {
    if published.is_empty() {
        return "port failover: no running process using Rivet has failed over \
                (RIVET_STATS_DIR, default /dev/shm)\n"
            .to_owned();
    }
    let mut s = String::new();
    for (pid, c) in published {
        s += &format!(
            "port failover, process {pid}: {} lane(s) failed over, {} receive(s) and {} work \
             request(s) replayed, longest {} ms; gave up on {} connection(s)\n",
            c.lanes_failed_over,
            c.receives_replayed,
            c.work_requests_replayed,
            c.longest_ms,
            c.gave_up
        );
    }
    s
}

/// The counters of every port of `devices` (`ports/<p>/` in each device's sysfs directory).
pub(crate) fn read(devices: &[ListedDevice]) -> Vec<PortCounters> {
    let mut out = Vec::new();
    for device in devices {
        let ports = device.sysfs_dir.join("ports");
        for port in dir_names(&ports) {
            out.push(PortCounters {
                port: format!("{}:{port}", device.name),
                counters: read_counters(&ports.join(&port).join("counters")),
                hw_counters: read_counters(&ports.join(&port).join("hw_counters")),
            });
        }
    }
    out
}

/// One block per port: a summary line, then the non-zero counters.
pub(crate) fn format(ports: &[PortCounters]) -> String {
    if ports.is_empty() {
        return "no RDMA port: the listed devices have none in sysfs\n".to_owned();
    }
    let mut s = String::new();
    for p in ports {
        let (tx, rx) = p.bytes();
        match (tx, rx) {
            (Some(tx), Some(rx)) => s += &format!("{}: tx {tx} B, rx {rx} B\n", p.port),
            _ => s += &format!("{}: no byte counters (the driver keeps none)\n", p.port),
        }
        for (kind, list) in [("counters", &p.counters), ("hw_counters", &p.hw_counters)] {
            let nonzero: Vec<String> = list
                .iter()
                .filter(|(_, v)| *v != 0)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            if !list.is_empty() {
                let text = if nonzero.is_empty() {
                    "all zero".to_owned()
                } else {
                    nonzero.join(" ")
                };
                s += &format!("  {kind}: {text}\n");
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn published_failover_counts_are_one_line_per_process() {
        let counts = nccl_net_rivet::stats::FailoverCounts {
            lanes_failed_over: 2,
            receives_replayed: 5,
            work_requests_replayed: 9,
            longest_ms: 13,
            gave_up: 0,
        };
        let text = format_published(&[(42, counts)]);
        assert_eq!(
            text,
            "port failover, process 42: 2 lane(s) failed over, 5 receive(s) and 9 work request(s) \
             replayed, longest 13 ms; gave up on 0 connection(s)\n"
        );
        assert!(format_published(&[]).starts_with("port failover: no running process"));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rivet-stats-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reads_and_formats_port_and_driver_counters() {
        let root = scratch("tree");
        // Where the device's ibdev_path points: a provider's own tree, not the class directory.
        let devices = [ListedDevice {
            name: "rxe0".into(),
            sysfs_dir: Sysfs::at(&root).device_dir(Some(Path::new("/run/provider/rxe0")), "rxe0"),
        }];
        let port = root.join("run/provider/rxe0/ports/1");
        fs::create_dir_all(port.join("counters")).unwrap();
        fs::create_dir_all(port.join("hw_counters")).unwrap();
        fs::write(port.join("counters/port_xmit_data"), "1000\n").unwrap();
        fs::write(port.join("counters/port_rcv_data"), "250\n").unwrap();
        fs::write(port.join("counters/symbol_error"), "0\n").unwrap();
        fs::write(port.join("hw_counters/sent_pkts"), "42\n").unwrap();
        fs::write(port.join("hw_counters/retry_exceeded_err"), "3\n").unwrap();
        fs::write(port.join("hw_counters/rcvd_pkts"), "0\n").unwrap();
        fs::write(port.join("hw_counters/lifespan"), "not a number\n").unwrap();

        let ports = read(&devices);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].bytes(), (Some(4000), Some(1000)));
        assert_eq!(
            ports[0].hw_counters,
            vec![
                ("rcvd_pkts".to_owned(), 0),
                ("retry_exceeded_err".to_owned(), 3),
                ("sent_pkts".to_owned(), 42),
            ]
        );
        assert_eq!(
            format(&ports),
            "rxe0:1: tx 4000 B, rx 1000 B\n  counters: port_rcv_data=250 port_xmit_data=1000\n  hw_counters: retry_exceeded_err=3 sent_pkts=42\n"
        );
        fs::remove_dir_all(port.join("counters")).unwrap();
        assert!(format(&read(&devices)).starts_with("rxe0:1: no byte counters"));
        fs::remove_dir_all(&root).unwrap();
        assert!(read(&devices).is_empty());
        assert!(format(&[]).starts_with("no RDMA port"));
    }
}
