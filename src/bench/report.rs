//! Results of a bench run, as a table for people and JSON for machines.

use std::fmt::Write as _;

/// One bandwidth step.
#[derive(Debug, Clone)]
pub(crate) struct Bandwidth {
    /// Message size, bytes.
    pub(crate) size: usize,
    /// Timed messages.
    pub(crate) iters: usize,
    /// Wall time of the timed messages (first post to last completion on the sender).
    pub(crate) seconds: f64,
}

impl Bandwidth {
    /// MiB/s (2^20 bytes per second: perftest's "MB/sec").
    pub(crate) fn mib_per_s(&self) -> f64 {
        (self.size * self.iters) as f64 / self.seconds.max(1e-12) / (1024.0 * 1024.0)
    }

    /// Gb/s (10^9 bits per second).
    pub(crate) fn gbit_per_s(&self) -> f64 {
        (self.size * self.iters) as f64 * 8.0 / self.seconds.max(1e-12) / 1e9
    }

    /// Messages per second.
    pub(crate) fn msg_per_s(&self) -> f64 {
        self.iters as f64 / self.seconds.max(1e-12)
    }
}

/// The ping-pong result: one-way latency (round trip / 2), µs.
#[derive(Debug, Clone)]
pub(crate) struct Latency {
    /// Message size, bytes.
    pub(crate) size: usize,
    /// Timed round trips.
    pub(crate) iters: usize,
    /// Smallest.
    pub(crate) min: f64,
    /// Median.
    pub(crate) p50: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// Mean.
    pub(crate) mean: f64,
    /// Largest.
    pub(crate) max: f64,
}

impl Latency {
    /// Summarise one-way samples (µs).
    pub(crate) fn from_samples(size: usize, mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let pick = |q: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            // nearest rank
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            samples[rank - 1]
        };
        Self {
            size,
            iters: n,
            min: samples.first().copied().unwrap_or(0.0),
            p50: pick(0.50),
            p99: pick(0.99),
            mean: if n == 0 {
                0.0
            } else {
                samples.iter().sum::<f64>() / n as f64
            },
            max: samples.last().copied().unwrap_or(0.0),
        }
    }
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// `loopback` or `client`.
    pub(crate) mode: String,
    /// The library loaded.
    pub(crate) plugin: String,
    /// This side's device.
    pub(crate) device: String,
    /// The server's device.
    pub(crate) server_device: String,
    /// Link speed the plugin reports (Mb/s).
    pub(crate) speed_mbps: i32,
    /// Outstanding messages.
    pub(crate) window: usize,
    /// `spin` or `yield` (what a poll that finds nothing does).
    pub(crate) poll: &'static str,
    /// Bandwidth per size.
    pub(crate) bandwidth: Vec<Bandwidth>,
    /// Latency, unless skipped.
    pub(crate) latency: Option<Latency>,
}

/// "4 KiB", "64 MiB", "8 B".
pub(crate) fn human_size(n: usize) -> String {
    const UNITS: [(usize, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if n >= unit && n % unit == 0 {
            return format!("{} {name}", n / unit);
        }
    }
    format!("{n} B")
}

pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Report {
    /// The human-readable table.
    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "rivet bench ({}): {} -> {}, window {}, poll {}, plugin {}",
            self.mode, self.device, self.server_device, self.window, self.poll, self.plugin
        );
        if !self.bandwidth.is_empty() {
            let _ = writeln!(
                s,
                "{:>10} {:>8} {:>12} {:>10} {:>12}",
                "size", "iters", "MiB/s", "Gb/s", "msg/s"
            );
        }
        for b in &self.bandwidth {
            let _ = writeln!(
                s,
                "{:>10} {:>8} {:>12.1} {:>10.3} {:>12.0}",
                human_size(b.size),
                b.iters,
                b.mib_per_s(),
                b.gbit_per_s(),
                b.msg_per_s()
            );
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(
                s,
                "latency {} ping-pong, one-way (RTT/2), {} round trips: min {:.2} us  p50 {:.2} us  p99 {:.2} us  mean {:.2} us  max {:.2} us",
                human_size(l.size),
                l.iters,
                l.min,
                l.p50,
                l.p99,
                l.mean,
                l.max
            );
        }
        s
    }

    /// One JSON object.
    pub(crate) fn json(&self) -> String {
        let mut s = String::from("{");
        let _ = write!(
            s,
            "\"mode\":{},\"plugin\":{},\"device\":{},\"server_device\":{},\"speed_mbps\":{},\"window\":{},\"poll\":{},\"bandwidth\":[",
            json_str(&self.mode),
            json_str(&self.plugin),
            json_str(&self.device),
            json_str(&self.server_device),
            self.speed_mbps,
            self.window,
            json_str(self.poll)
        );
        for (i, b) in self.bandwidth.iter().enumerate() {
            let _ = write!(
                s,
                "{}{{\"size\":{},\"iters\":{},\"seconds\":{:.6},\"mib_per_s\":{:.3},\"gbit_per_s\":{:.6},\"msg_per_s\":{:.1}}}",
                if i == 0 { "" } else { "," },
                b.size,
                b.iters,
                b.seconds,
                b.mib_per_s(),
                b.gbit_per_s(),
                b.msg_per_s()
            );
        }
        s.push(']');
        match &self.latency {
            Some(l) => {
                let _ = write!(
                    s,
                    ",\"latency\":{{\"size\":{},\"iters\":{},\"min_us\":{:.3},\"p50_us\":{:.3},\"p99_us\":{:.3},\"mean_us\":{:.3},\"max_us\":{:.3}}}",
                    l.size, l.iters, l.min, l.p50, l.p99, l.mean, l.max
                );
            }
            None => s.push_str(",\"latency\":null"),
        }
        s.push('}');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let l = Latency::from_samples(8, (1..=100).map(f64::from).rev().collect());
        assert_eq!((l.min, l.p50, l.p99, l.max), (1.0, 50.0, 99.0, 100.0));
        assert!((l.mean - 50.5).abs() < 1e-9);
        let empty = Latency::from_samples(8, Vec::new());
        assert_eq!(empty.iters, 0);
    }

    #[test]
    fn bandwidth_units() {
        let b = Bandwidth {
            size: 1 << 20,
            iters: 100,
            seconds: 1.0,
        };
        assert!((b.mib_per_s() - 100.0).abs() < 1e-9);
        assert!((b.gbit_per_s() - 0.8388608).abs() < 1e-9);
    }

    #[test]
    fn sizes_and_json_render() {
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(64 << 20), "64 MiB");
        assert_eq!(human_size(8), "8 B");
        assert_eq!(human_size(4097), "4097 B");
        let r = Report {
            mode: "loopback".into(),
            plugin: "a\"b".into(),
            device: "rxe0".into(),
            server_device: "rxe0".into(),
            speed_mbps: 10,
            window: 8,
            poll: "spin",
            bandwidth: vec![Bandwidth {
                size: 4096,
                iters: 2,
                seconds: 0.5,
            }],
            latency: None,
        };
        let j = r.json();
        assert!(j.starts_with('{') && j.ends_with('}'));
        assert!(j.contains("\"plugin\":\"a\\\"b\"") && j.contains("\"size\":4096"));
        assert!(r.table().contains("4 KiB"));
        // Latency only (`--sizes none`): no bandwidth header, an empty list in JSON.
        let r = Report {
            bandwidth: Vec::new(),
            latency: Some(Latency::from_samples(8, vec![3.0, 1.0, 2.0])),
            ..r
        };
        assert!(!r.table().contains("MiB/s") && r.table().contains("p50 2.00 us"));
        assert!(r.json().contains("\"bandwidth\":[]"));
    }
}
