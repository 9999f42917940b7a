//! What both data paths (libibverbs and mlx5 direct) derive the same way from a port and the
//! handshake: the endpoint description sent to the peer, and the RTR/RTS attributes (NCCL's
//! choices: min_rnr_timer 12, hop limit 255, one outstanding read, the local port in the address
//! vector, the smaller of the two MTUs).

use super::endpoint::region::Region;
use crate::config::QpSettings;
use crate::log::warn;
use rivet_core::nic::RemoteRegion;
use rivet_core::route::{self, GrhReason, LocalPort};
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
    let inbound = RemoteRegion {
        addr: inbound.addr(),
        rkey: inbound.rkey(),
        len: inbound.len() as u32,
    };
    endpoint_info_at(port, qpn, psn, inbound, settings)
}

/// [`endpoint_info`] with the inbound region as the peer addresses it.
pub(crate) fn endpoint_info_at(
    port: &PortInfo,
    qpn: u32,
    psn: u32,
    inbound: RemoteRegion,
    settings: &QpSettings,
) -> EndpointInfo {
    let link_layer = link_layer(port);
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
        inbound,
        traffic_class: settings.traffic_class,
        service_level: settings.service_level,
        device_name: device_name(&port.name),
    }
}

fn link_layer(port: &PortInfo) -> LinkLayer {
    match port.link_layer {
        discover::LinkLayer::InfiniBand => LinkLayer::Infiniband,
        discover::LinkLayer::Ethernet => LinkLayer::Ethernet,
    }
}

/// How `port` addresses `remote`: the core's decision (LID alone, or a GRH across subnets, on
/// ports that require one, and always on RoCE).
pub(crate) fn route(port: &PortInfo, remote: &EndpointInfo) -> route::Route {
    let local = LocalPort {
        link_layer: link_layer(port),
        gid: port.gid,
        port_flags: port.port_flags,
    };
    route::route(&local, remote)
}

/// INIT → RTR towards `remote`.
pub(crate) fn rtr(port: &PortInfo, remote: &EndpointInfo, settings: &QpSettings) -> RtrParams {
    let route = route(port, remote);
    if let Some((_, GrhReason::OtherSubnetWithoutFlid)) = route.grh {
        warn!(
            "{} port {}: peer {} is in another subnet but its GID carries no FLID; addressing its LID {}",
            port.name, port.port, remote.device_name, remote.lid
        );
    }
    RtrParams {
        remote_qpn: remote.qpn,
        remote_psn: remote.psn,
        path_mtu: u32::from(remote.mtu).min(port.active_mtu),
        dest_gid: ibv_gid {
            raw: route.grh.map_or(remote.gid, |(dgid, _)| dgid),
        },
        dest_lid: route.dlid,
        sgid_index: port.gid_index as u8,
        is_global: route.is_global(),
        traffic_class: settings.traffic_class,
        // Only a GRH carries a flow label.
        flow_label: if route.is_global() {
            settings.flow_label
        } else {
            0
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fake_port_info;
    use rivet_core::wire::LinkLayer;

    const SETTINGS: QpSettings = QpSettings {
        timeout: 20,
        retry_cnt: 7,
        traffic_class: 0,
        service_level: 0,
        flow_label: 0,
    };

    /// An InfiniBand GID with subnet prefix `fe80:0000:<flid>:<subnet>`.
    fn ib_gid(flid: u16, subnet: u16, guid: u8) -> [u8; 16] {
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&[0xfe, 0x80]);
        gid[4..6].copy_from_slice(&flid.to_be_bytes());
        gid[6..8].copy_from_slice(&subnet.to_be_bytes());
        gid[15] = guid;
        gid
    }

    fn ib_port(subnet: u16, port_flags: u8) -> PortInfo {
        let mut port = fake_port_info("mlx5_0", None, 1, 0xaa);
        port.gid = ib_gid(0, subnet, 1);
        port.gid_index = 0;
        port.port_flags = port_flags;
        port
    }

    fn peer(link_layer: LinkLayer, gid: [u8; 16], lid: u16) -> EndpointInfo {
        EndpointInfo {
            gid,
            lid,
            port_num: 1,
            mtu: 5,
            link_layer,
            qpn: 0x123,
            psn: 0x456,
            inbound: RemoteRegion {
                addr: 0x1000,
                rkey: 9,
                len: 4096,
            },
            traffic_class: 0,
            service_level: 0,
            device_name: DeviceName::new("mlx5_7").unwrap(),
        }
    }

    #[test]
    fn infiniband_rtr_in_one_subnet_addresses_the_lid_without_grh() {
        let remote = peer(LinkLayer::Infiniband, ib_gid(0, 1, 2), 0x33);
        let rtr = rtr(&ib_port(1, 0), &remote, &SETTINGS);
        assert!(!rtr.is_global);
        assert_eq!(rtr.dest_lid, 0x33);
    }

    #[test]
    fn infiniband_rtr_across_subnets_has_a_grh_to_the_peer_gid_and_its_flid() {
        let gid = ib_gid(0x0c01, 2, 2);
        let rtr = rtr(
            &ib_port(1, 0),
            &peer(LinkLayer::Infiniband, gid, 0x33),
            &SETTINGS,
        );
        assert!(rtr.is_global);
        assert_eq!(rtr.dest_gid.raw, gid);
        assert_eq!(rtr.dest_lid, 0x0c01);
        assert_eq!((rtr.sgid_index, rtr.hop_limit), (0, 255));
    }

    #[test]
    fn infiniband_rtr_on_a_grh_required_port_has_a_grh() {
        let gid = ib_gid(0, 1, 2);
        let port = ib_port(1, rivet_verbs_ffi::sys::port_flags::GRH_REQUIRED);
        let rtr = rtr(&port, &peer(LinkLayer::Infiniband, gid, 0x33), &SETTINGS);
        assert!(rtr.is_global);
        assert_eq!((rtr.dest_gid.raw, rtr.dest_lid), (gid, 0x33));
    }

    #[test]
    fn roce_rtr_always_has_a_grh() {
        let mut port = fake_port_info("rxe0", None, 1, 0);
        port.link_layer = discover::LinkLayer::Ethernet;
        port.lid = 0;
        port.gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
        port.gid_index = 1;
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
        let rtr = rtr(&port, &peer(LinkLayer::Ethernet, gid, 0), &SETTINGS);
        assert!(rtr.is_global);
        assert_eq!((rtr.dest_gid.raw, rtr.sgid_index), (gid, 1));
    }

    #[test]
    fn the_flow_label_goes_into_the_grh_only() {
        let settings = QpSettings {
            flow_label: 0x1_2345,
            ..SETTINGS
        };
        let mut port = fake_port_info("rxe0", None, 1, 0);
        port.link_layer = discover::LinkLayer::Ethernet;
        port.lid = 0;
        port.gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
        let roce = rtr(&port, &peer(LinkLayer::Ethernet, gid, 0), &settings);
        assert_eq!((roce.is_global, roce.flow_label), (true, 0x1_2345));
        let remote = peer(LinkLayer::Infiniband, ib_gid(0, 1, 2), 0x22);
        let ib = rtr(&ib_port(1, 0), &remote, &settings);
        assert_eq!((ib.is_global, ib.flow_label), (false, 0));
    }

    #[test]
    fn the_grh_required_flag_is_the_verbs_one() {
        assert_eq!(
            rivet_verbs_ffi::sys::port_flags::GRH_REQUIRED,
            route::PORT_FLAG_GRH_REQUIRED
        );
    }
}
