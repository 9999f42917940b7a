//! `rivet info --stats`: the per-port counters the kernel keeps for each RDMA device
//! (`ports/<p>/counters` and the driver's `ports/<p>/hw_counters`: rxe's `sent_pkts`,
//! `rcvd_pkts`, `retry_exceeded_err`, …; mlx5's `out_of_sequence`, `local_ack_timeout_err`, …),
//! for a quick look during a run. Read from sysfs under a root so tests use a fake tree.

use std::fs;
use std::path::Path;

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

/// The counters of every port under `<root>/sys/class/infiniband`.
pub(crate) fn read(root: &Path) -> Vec<PortCounters> {
    let class = root.join("sys/class/infiniband");
    let mut out = Vec::new();
    for device in dir_names(&class) {
        let ports = class.join(&device).join("ports");
        for port in dir_names(&ports) {
            out.push(PortCounters {
                port: format!("{device}:{port}"),
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
        return "no RDMA device: no port under /sys/class/infiniband\n".to_owned();
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

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rivet-stats-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reads_and_formats_port_and_driver_counters() {
        let root = scratch("tree");
        let port = root.join("sys/class/infiniband/rxe0/ports/1");
        fs::create_dir_all(port.join("counters")).unwrap();
        fs::create_dir_all(port.join("hw_counters")).unwrap();
        fs::write(port.join("counters/port_xmit_data"), "1000\n").unwrap();
        fs::write(port.join("counters/port_rcv_data"), "250\n").unwrap();
        fs::write(port.join("counters/symbol_error"), "0\n").unwrap();
        fs::write(port.join("hw_counters/sent_pkts"), "42\n").unwrap();
        fs::write(port.join("hw_counters/retry_exceeded_err"), "3\n").unwrap();
        fs::write(port.join("hw_counters/rcvd_pkts"), "0\n").unwrap();
        fs::write(port.join("hw_counters/lifespan"), "not a number\n").unwrap();

        let ports = read(&root);
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
        assert!(format(&read(&root)).starts_with("rxe0:1: no byte counters"));
        fs::remove_dir_all(&root).unwrap();
        assert!(read(&root).is_empty());
        assert!(format(&[]).starts_with("no RDMA device"));
    }
}
