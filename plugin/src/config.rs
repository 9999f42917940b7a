//! Settings read from the environment once per `init`, with NCCL's names where the meaning is
//! the same. Invalid values are reported with one WARN line and replaced by the default.

use crate::log::warn;
use crate::oob::iface::{self, Family, IfRules};
use rivet_core::name_list::NameList;
use rivet_core::time::Duration;

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
