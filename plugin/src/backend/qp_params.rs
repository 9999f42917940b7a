//! What both data paths (libibverbs and mlx5 direct) derive the same way from a port and the
//! handshake: the endpoint description sent to the peer, and the RTR/RTS attributes (NCCL's
//! choices: min_rnr_timer 12, hop limit 255, one outstanding read, the local port in the address
//! vector, the smaller of the two MTUs).

use super::endpoint::QpSettings;
use super::region::Region;
use rivet_core::nic::RemoteRegion;
use rivet_core::wire::{DeviceName, EndpointInfo, LinkLayer};
use rivet_verbs_ffi::discover::{self, PortInfo};
use rivet_verbs_ffi::sys::ibv_gid;
use rivet_verbs_ffi::{RtrParams, RtsParams};

/// The endpoint description of a queue pair `qpn` (first PSN `psn`) on `port`, whose peer may
/// RDMA-write into `inbound`.
pub(crate) fn endpoint_info(
    port: &PortInfo,
    qpn: u32,
    psn: u32,
    inbound: &Region,
    settings: &QpSettings,
) -> EndpointInfo {
    let link_layer = match port.link_layer {
        discover::LinkLayer::InfiniBand => LinkLayer::Infiniband,
        discover::LinkLayer::Ethernet => LinkLayer::Ethernet,
    };
    EndpointInfo {
        gid: port.gid,
        lid: if link_layer == LinkLayer::Infiniband {
            port.lid
        } else {
            0
        },
        port_num: port.port,
        mtu: port.active_mtu as u8,
        link_layer,
        qpn,
        psn,
        inbound: RemoteRegion {
            addr: inbound.addr(),
            rkey: inbound.rkey(),
            len: inbound.len() as u32,
        },
        traffic_class: settings.traffic_class,
        service_level: settings.service_level,
        device_name: device_name(&port.name),
    }
}

/// INIT → RTR towards `remote`.
pub(crate) fn rtr(port: &PortInfo, remote: &EndpointInfo, settings: &QpSettings) -> RtrParams {
    RtrParams {
        remote_qpn: remote.qpn,
        remote_psn: remote.psn,
        path_mtu: u32::from(remote.mtu).min(port.active_mtu),
        dest_gid: ibv_gid { raw: remote.gid },
        dest_lid: remote.lid,
        sgid_index: port.gid_index as u8,
        is_global: port.link_layer == discover::LinkLayer::Ethernet,
        traffic_class: settings.traffic_class,
        sl: settings.service_level,
        port: port.port,
        ..RtrParams::default()
    }
}

/// RTR → RTS with our first PSN `psn`.
pub(crate) fn rts(settings: &QpSettings, psn: u32) -> RtsParams {
    RtsParams {
        timeout: settings.timeout,
        retry_cnt: settings.retry_cnt,
        sq_psn: psn,
        ..RtsParams::default()
    }
}

/// A random first PSN (24 bits), so a stale packet of an earlier connection on a reused QP
/// number is not taken for this one's.
pub(crate) fn random_psn() -> u32 {
    let mut bytes = [0u8; 4];
    crate::random::fill(&mut bytes);
    u32::from_le_bytes(bytes) & 0x00ff_ffff
}

/// The device name as the wire format carries it: printable ASCII, at most 32 bytes.
fn device_name(name: &str) -> DeviceName {
    let clean: String = name
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(32)
        .collect();
    DeviceName::new(&clean)
        .or_else(|_| DeviceName::new("rdma"))
        .expect("\"rdma\" is a valid device name by the wire format's rules")
}
