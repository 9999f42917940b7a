//! Settings read from the environment once per `init`, with NCCL's names where the meaning is
//! the same. Invalid values are reported with one WARN line and replaced by the default.

use crate::log::warn;
use crate::oob::iface::{self, Family, IfRules};
use rivet_core::time::Duration;
use rivet_core::wire::{Lanes, MAX_LANES};
use rivet_verbs_ffi::name_list::NameList;

/// Queue-pair settings from the environment (NCCL's `NCCL_IB_*` knobs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpSettings {
    /// `NCCL_IB_TIMEOUT`.
    pub(crate) timeout: u8,
    /// `NCCL_IB_RETRY_CNT`.
    pub(crate) retry_cnt: u8,
    /// Traffic class for the GRH.
    pub(crate) traffic_class: u8,
    /// Service level.
    pub(crate) service_level: u8,
    /// GRH flow label of the queue pair (0: none; a multi-QP connection gives each queue pair its
    /// own, `rivet_core::data::multi::flow_label`, so RoCE ECMP spreads them).
    pub(crate) flow_label: u32,
}

/// GPUDirect settings from the environment, with NCCL's names and defaults; read once, at
/// discovery (`rivet_core::gdr` decides what they mean for each device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GdrSettings {
    /// `NCCL_DMABUF_ENABLE` (default 1).
    pub(crate) dmabuf_enable: i64,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (default 2: where supported).
    pub(crate) relaxed_ordering: i64,
    /// `NCCL_GDR_FLUSH_DISABLE` (default 0).
    pub(crate) flush_disable: i64,
    /// `RIVET_TEST_FLUSH_HOST_MEMORY=1`, for tests only: flush receives into host memory too, so
    /// the flush path runs on devices without GPUDirect (Soft-RoCE).
    pub(crate) flush_host_memory: bool,
}

impl Default for GdrSettings {
    /// NCCL's defaults.
    fn default() -> Self {
        Self {
            dmabuf_enable: 1,
            relaxed_ordering: 2,
            flush_disable: 0,
            flush_host_memory: false,
        }
    }
}

impl GdrSettings {
    /// Read the environment.
    pub(crate) fn from_env() -> Self {
        Self {
            dmabuf_enable: ranged("NCCL_DMABUF_ENABLE", 0, 1).unwrap_or(1),
            relaxed_ordering: ranged("NCCL_IB_PCI_RELAXED_ORDERING", 0, 2).unwrap_or(2),
            flush_disable: ranged("NCCL_GDR_FLUSH_DISABLE", 0, 1).unwrap_or(0),
            flush_host_memory: var("RIVET_TEST_FLUSH_HOST_MEMORY").as_deref() == Some("1"),
        }
    }
}

/// Everything the comm layer needs from the environment.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// `NCCL_IB_TIMEOUT` (default 20: 4.096 µs × 2^20 ≈ 4.3 s per retry).
    pub(crate) ib_timeout: u8,
    /// `NCCL_IB_RETRY_CNT` (default 7).
    pub(crate) ib_retry_cnt: u8,
    /// `NCCL_IB_TC`, when set.
    pub(crate) ib_tc: Option<u8>,
    /// `NCCL_IB_SL`, when set.
    pub(crate) ib_sl: Option<u8>,
    /// `RIVET_HANDSHAKE_TIMEOUT_MS` (default 120000): how long a connect or an accepted
    /// connection may take from its first byte to established.
    pub(crate) handshake_timeout: Duration,
    /// How the handshake interface is chosen: `NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`,
    /// `NCCL_COMM_ID`.
    pub(crate) interface: IfRules,
    /// `RIVET_MESH=1`: every port behind one mesh device (`crate::mesh`).
    pub(crate) mesh: bool,
    /// How connections use several queue pairs.
    pub(crate) lanes: LaneSettings,
    /// `NCCL_RIVET_EAGER_THRESHOLD` (bytes, default
    /// [`DEFAULT_EAGER_THRESHOLD`](rivet_core::data::eager::DEFAULT_EAGER_THRESHOLD), at most
    /// [`EAGER_MAX`](rivet_core::data::eager::EAGER_MAX), 0 off): host-memory sends up to this
    /// size may go eager, and receive comms take eager messages (single-queue-pair connections).
    pub(crate) eager_threshold: u64,
    /// Port failover among a fused device's ports (issue #39), under NCCL's names.
    pub(crate) failover: FailoverSettings,
}

/// NCCL's port failover settings (`src/transport/net_ib/p2p_resiliency*` in NCCL's tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FailoverSettings {
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER` (0 or 1, default 0): a connection over a fused device
    /// moves a failed port's queue pairs to a surviving port instead of failing.
    pub(crate) on: bool,
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS` (default 1): failovers one connection
    /// may make before its next port failure fails it.
    pub(crate) max_attempts: u32,
}

impl FailoverSettings {
    fn from_env() -> Self {
        Self {
            on: ranged::<u8>("NCCL_IB_RESILIENCY_PORT_FAILOVER", 0, 1) == Some(1),
            max_attempts: ranged(
                "NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS",
                0,
                1_000_000,
            )
            .unwrap_or(1),
        }
    }

    /// Whether a connection over `ports` ports asks for (or agrees to) failover: on, and a port
    /// to fail over to.
    pub(crate) fn wanted(&self, ports: usize) -> bool {
        cfg!(feature = "failover") && self.on && ports > 1
    }
}

/// NCCL's multi-QP settings, read as NCCL reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneSettings {
    /// `NCCL_IB_QPS_PER_CONNECTION` (1..=128, default 1): queue pairs per connection and port.
    pub(crate) qps_per_connection: usize,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS` (default 0): every message over every queue pair, instead of
    /// one queue pair per port and message.
    pub(crate) split_data_on_qps: bool,
    /// `NCCL_IB_ADAPTIVE_ROUTING` (default: on for InfiniBand, off for RoCE).
    pub(crate) adaptive_routing: Option<bool>,
    /// `NCCL_IB_AR_THRESHOLD` (default 8192 bytes).
    pub(crate) ar_threshold: u64,
}

impl LaneSettings {
    fn from_env() -> Self {
        Self {
            qps_per_connection: ranged("NCCL_IB_QPS_PER_CONNECTION", 1, MAX_LANES as i64)
                .unwrap_or(1),
            split_data_on_qps: ranged::<u8>("NCCL_IB_SPLIT_DATA_ON_QPS", 0, 1) == Some(1),
            // -2 (NCCL's default) and -1 mean "by link layer".
            adaptive_routing: ranged::<i8>("NCCL_IB_ADAPTIVE_ROUTING", -2, 1)
                .filter(|v| *v >= 0)
                .map(|v| v == 1),
            ar_threshold: ranged("NCCL_IB_AR_THRESHOLD", 0, i64::MAX).unwrap_or(8192),
        }
    }

    /// The lanes of a connection from a device of `ports` ports: `NCCL_IB_QPS_PER_CONNECTION`
    /// per port (at most [`MAX_LANES`] in all, as NCCL's `NCCL_IB_MAX_QPS`), each message over
    /// all of them when split, else over one per port (NCCL's `nDataQps`).
    pub(crate) fn lanes(&self, ports: usize) -> Lanes {
        let ports = ports.clamp(1, MAX_LANES);
        let count = (self.qps_per_connection * ports).min(MAX_LANES);
        let width = if self.split_data_on_qps { count } else { ports };
        Lanes::new(count, width).unwrap_or(Lanes::ONE)
    }

    /// The adaptive-routing threshold for a connection on `infiniband` (or RoCE) ports: `None`
    /// when adaptive routing is off.
    pub(crate) fn ar_threshold(&self, infiniband: bool) -> Option<u64> {
        self.adaptive_routing
            .unwrap_or(infiniband)
            .then_some(self.ar_threshold)
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn ranged<T: TryFrom<i64> + Copy>(name: &str, min: i64, max: i64) -> Option<T> {
    let raw = var(name)?;
    match raw.parse::<i64>() {
        Ok(v) if (min..=max).contains(&v) => T::try_from(v).ok(),
        Ok(-1) => None,
        _ => {
            warn!("{name}={raw} is not a number in {min}..={max}; using the default");
            None
        }
    }
}

/// The interface rules from the environment, read as NCCL reads them: `NCCL_SOCKET_IFNAME` counts
/// only when longer than one character; an unknown `NCCL_SOCKET_FAMILY` is ignored with a WARN.
fn interface_rules() -> IfRules {
    let ifname = var("NCCL_SOCKET_IFNAME")
        .filter(|v| v.len() > 1)
        .and_then(|v| match NameList::parse(&v) {
            Ok(list) => Some(list),
            Err(e) => {
                warn!("NCCL_SOCKET_IFNAME={v:?}: {e}; choosing the interface as if it were unset");
                None
            }
        });
    let family = match var("NCCL_SOCKET_FAMILY") {
        None => Family::Any,
        Some(v) => Family::parse(&v).unwrap_or_else(|| {
            warn!("NCCL_SOCKET_FAMILY={v:?} is neither AF_INET nor AF_INET6; ignored");
            Family::Any
        }),
    };
    let comm_id = var("NCCL_COMM_ID").and_then(|v| iface::comm_id_address(&v));
    IfRules {
        ifname,
        family,
        comm_id,
    }
}

impl Config {
    /// Read the environment.
    pub(crate) fn from_env() -> Self {
        Self {
            ib_timeout: ranged("NCCL_IB_TIMEOUT", 1, 31).unwrap_or(20),
            ib_retry_cnt: ranged("NCCL_IB_RETRY_CNT", 0, 7).unwrap_or(7),
            ib_tc: ranged("NCCL_IB_TC", 0, 255),
            ib_sl: ranged("NCCL_IB_SL", 0, 15),
            handshake_timeout: Duration::from_millis(
                ranged::<u64>("RIVET_HANDSHAKE_TIMEOUT_MS", 1, 86_400_000).unwrap_or(120_000),
            ),
            interface: interface_rules(),
            lanes: LaneSettings::from_env(),
            eager_threshold: ranged(
                "NCCL_RIVET_EAGER_THRESHOLD",
                0,
                rivet_core::data::eager::EAGER_MAX as i64,
            )
            .unwrap_or(rivet_core::data::eager::DEFAULT_EAGER_THRESHOLD),
            failover: FailoverSettings::from_env(),
            mesh: match var("RIVET_MESH").as_deref() {
                None | Some("0") => false,
                Some("1") => true,
                Some(other) => {
                    warn!("RIVET_MESH={other} is neither 0 nor 1; the ports stay separate devices");
                    false
                }
            },
        }
    }

    /// Queue-pair settings for a connection whose NCCL config asked for `traffic_class`.
    pub(crate) fn qp_settings(&self, traffic_class: Option<i32>) -> QpSettings {
        let from_config = traffic_class.and_then(|tc| u8::try_from(tc).ok());
        QpSettings {
            timeout: self.ib_timeout,
            retry_cnt: self.ib_retry_cnt,
            traffic_class: self.ib_tc.or(from_config).unwrap_or(0),
            service_level: self.ib_sl.or(from_config.map(|tc| tc & 0xf)).unwrap_or(0),
            flow_label: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(qps: usize, split: bool, ar: Option<bool>) -> LaneSettings {
        LaneSettings {
            qps_per_connection: qps,
            split_data_on_qps: split,
            adaptive_routing: ar,
            ar_threshold: 8192,
        }
    }

    #[test]
    fn lanes_follow_nccl_qps_split_and_ports() {
        let shape = |s: LaneSettings, ports| {
            let lanes = s.lanes(ports);
            (lanes.count(), lanes.width())
        };
        assert_eq!(shape(settings(1, false, None), 1), (1, 1));
        assert_eq!(shape(settings(4, false, None), 1), (4, 1));
        assert_eq!(shape(settings(4, true, None), 1), (4, 4));
        // A fused device: QPs per connection per port, one per port and message unless split.
        assert_eq!(shape(settings(4, false, None), 2), (8, 2));
        assert_eq!(shape(settings(2, true, None), 4), (8, 8));
        // NCCL_IB_MAX_QPS bounds the total.
        assert_eq!(shape(settings(128, false, None), 2), (128, 2));
        assert_eq!(shape(settings(128, true, None), 8), (128, 128));
    }

    #[test]
    fn adaptive_routing_defaults_to_infiniband_only() {
        assert_eq!(settings(1, false, None).ar_threshold(true), Some(8192));
        assert_eq!(settings(1, false, None).ar_threshold(false), None);
        assert_eq!(
            settings(1, false, Some(true)).ar_threshold(false),
            Some(8192)
        );
        assert_eq!(settings(1, false, Some(false)).ar_threshold(true), None);
    }
}
