//! `connect`: resumable across NCCL's polling calls.
//!
//! NCCL calls `connect` again and again with the same 128-byte handle until it returns a comm.
//! The handle's first 64 bytes are the listener's [`ListenHandle`]; the first call stores a token
//! in bytes 64..80 naming the pending connection in a registry, and later calls resume it. The
//! token is a registry handle, not a pointer: a corrupt or stale token is simply not found, and
//! the connect starts afresh.
//!
//! Unsafe (opted in): taking a pending connect out of its handle table, which [`crate::handle`]
//! makes `unsafe` (no reference to it may be in use).

#![allow(unsafe_code)]

use super::data::{self, DataComm, Side};
use super::path::Lanes;
use crate::backend::DataEndpoint as Endpoint;
use crate::backend::OpenPort;
use crate::backend::conn_endpoint::ConnEndpoint;
use crate::backend::endpoint::Role;
use crate::clock;
use crate::config::QpSettings;
use crate::error::{NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry, registry};
use crate::log::{INIT_NET, info};
use crate::mesh::{self, MeshDevice};
use crate::net::{self, NetContext};
use crate::oob::{pump, socket};
use core::ffi::c_int;
use rivet_core::data::SendConn;
#[cfg(feature = "failover")]
use rivet_core::data::failover::Role as FailoverSide;
use rivet_core::data::multi::MultiSend;
use rivet_core::handshake::{Connector, ConnectorEvent};
use rivet_core::mesh::{MeshAddr, Reach};
use rivet_core::wire::{
    EndpointInfo, HANDLE_LEN, ListenHandle, MESH_LIST_AT, MeshList, RejectReason,
};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;

/// Marks bytes 64..72 of NCCL's handle as holding a pending-connect token.
const TOKEN_MAGIC: [u8; 8] = *b"RVTCONN1";

/// A connect in progress.
#[derive(Debug)]
struct PendingConnect {
    socket: TcpStream,
    addr: SocketAddr,
    tcp_connected: bool,
    machine: Connector,
    /// One endpoint per lane, lane 0 first (one unless `NCCL_IB_QPS_PER_CONNECTION` > 1).
    endpoints: Vec<Endpoint>,
    /// Ports the lanes are spread over (lane i on port i % devices).
    devices: usize,
    /// Queue pairs each message is cut over.
    width: usize,
    /// Adaptive routing's threshold (`None`: off).
    ar_threshold: Option<u64>,
    /// Sends up to this size may go eager (0: off).
    eager_threshold: u64,
    settings: QpSettings,
}

static CONNECTS: Registry<PendingConnect> = registry!(0xc044, "connects in progress");

fn read_token(handle: &[u8; 128]) -> Option<Handle> {
    let token = &handle[HANDLE_LEN..HANDLE_LEN + 16];
    if token[..8] != TOKEN_MAGIC {
        return None;
    }
    let mut bits = [0u8; 8];
    bits.copy_from_slice(&token[8..16]);
    CONNECTS.decode(u64::from_le_bytes(bits) as usize as Ptr)
}

fn write_token(handle: &mut [u8; 128], token: Option<Handle>) {
    let area = &mut handle[HANDLE_LEN..HANDLE_LEN + 16];
    match token {
        Some(t) => {
            area[..8].copy_from_slice(&TOKEN_MAGIC);
            area[8..].copy_from_slice(&(t.to_ptr() as usize as u64).to_le_bytes());
        }
        None => area.fill(0),
    }
}

fn start(
    ctx: Option<&NetContext>,
    dev: c_int,
    tc: Option<i32>,
    handle: &[u8; 128],
) -> NetResult<PendingConnect> {
    let listener = ListenHandle::decode(handle).map_err(|e| {
        NetError::invalid_usage(format!(
            "connect: the connection handle from the peer is not usable: {e}"
        ))
    })?;
    let config = net::config()?;
    let (ports, target) = match net::mesh_device_for(dev)? {
        Some(mesh) => {
            let (port, target) = mesh_route(&mesh, &listener, handle)?;
            (vec![port], target)
        }
        None => (net::open_ports(dev)?, listener.addr),
    };
    let port = Arc::clone(&ports[0]);
    let settings = config.qp_settings(tc.or_else(|| ctx.and_then(|c| c.traffic_class)));
    // Lane i on port i % ports (a fused device stripes its lanes over its members).
    let lanes = config.lanes.lanes(ports.len());
    // The eager path runs on single-queue-pair connections (a multi-lane connection's lanes count
    // messages in lockstep, which a message taken from the ring would skip).
    let eager_threshold = if lanes.count() == 1 {
        config.eager_threshold
    } else {
        0
    };
    let role = Role::of(false, eager_threshold > 0);
    let endpoints = (0..lanes.count())
        .map(|i| <Endpoint as ConnEndpoint>::new(&ports[i % ports.len()], role))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            NetError::system(format!(
                "connect: setting up the connection on {} ({} queue pair(s)): {e}",
                port.info.name,
                lanes.count()
            ))
        })?;
    let devices = ports.len();
    let socket = socket::start_connect(target)
        .map_err(|e| NetError::system(format!("connect: cannot reach {target}: {e}")))?;
    let locals: Vec<_> = endpoints.iter().map(|e| e.local_info(&settings)).collect();
    let machine = Connector::with_options(
        &listener,
        &locals,
        lanes.width(),
        config.failover.wanted(devices),
        clock::now(),
        config.handshake_timeout,
    );
    let infiniband = port.info.link_layer == rivet_verbs_ffi::discover::LinkLayer::InfiniBand;
    Ok(PendingConnect {
        socket,
        addr: target,
        tcp_connected: false,
        machine,
        endpoints,
        devices,
        width: lanes.width(),
        ar_threshold: config.lanes.ar_threshold(infiniband),
        eager_threshold,
        settings,
    })
}

/// On the mesh device: the local member and the listener address a connection uses
/// (`rivet_core::mesh::choose` over the handle's address list; a listener that is no mesh device
/// offers only its handshake address).
fn mesh_route(
    mesh: &MeshDevice,
    listener: &ListenHandle,
    handle: &[u8; 128],
) -> NetResult<(Arc<OpenPort>, SocketAddr)> {
    let list = MeshList::decode(&handle[MESH_LIST_AT..]).map_err(|e| {
        NetError::invalid_usage(format!(
            "connect: the mesh address list in the peer's handle is not usable: {e}"
        ))
    })?;
    let peer: Vec<MeshAddr> = match (list, listener.addr.ip()) {
        (Some(list), _) => list.addrs().to_vec(),
        (None, IpAddr::V4(ip)) => vec![MeshAddr { ip, prefix_len: 32 }],
        (None, IpAddr::V6(ip)) => {
            return Err(NetError::invalid_usage(format!(
                "connect: RIVET_MESH=1 reaches IPv4 peers only; the peer listens on {ip}"
            )));
        }
    };
    let local = mesh.addrs();
    let choice = rivet_core::mesh::choose(&local, &peer, |i| mesh::route_source(peer[i].ip))
        .map_err(|e| NetError::remote(format!("connect: {e}")))?;
    let member = &mesh.members[choice.local];
    let target = SocketAddr::from((peer[choice.peer].ip, listener.addr.port()));
    info!(
        INIT_NET,
        "mesh: connecting to {target} from {} {} ({})",
        member.name,
        member.addr,
        match choice.reach {
            Reach::Subnet => "same subnet",
            Reach::Routed => "routed",
        }
    );
    Ok((net::open_mesh_member(mesh, choice.local)?, target))
}

/// Where a pending connect stands after a round of progress.
enum Step {
    Waiting,
    Established(EndpointInfo),
}

/// Move every lane's queue pair to RTR and RTS towards the acceptor's lane of the same index.
fn bring_up(
    endpoints: &[Endpoint],
    remotes: &[EndpointInfo],
    settings: &QpSettings,
) -> Result<(), String> {
    if endpoints.len() != remotes.len() {
        return Err(format!(
            "{} local queue pair(s) for {} remote one(s)",
            endpoints.len(),
            remotes.len()
        ));
    }
    for (endpoint, remote) in endpoints.iter().zip(remotes) {
        endpoint.connect_lane(remote, settings, endpoints.len())?;
    }
    Ok(())
}

/// Advance a pending connect.
fn progress(p: &mut PendingConnect) -> NetResult<Step> {
    let now = clock::now();
    if !p.tcp_connected {
        match socket::connect_done(&p.socket) {
            Ok(true) => p.tcp_connected = true,
            Ok(false) => {
                p.machine.handle_timeout(now);
                if let Some(err) = p.machine.error() {
                    return Err(NetError::remote(format!("connect to {}: {err}", p.addr)));
                }
                return Ok(Step::Waiting);
            }
            Err(e) => {
                return Err(NetError::remote(format!(
                    "connect: cannot reach {}: {e}",
                    p.addr
                )));
            }
        }
    }
    let io = |p: &mut PendingConnect| {
        pump::pump(&mut p.socket, &mut p.machine, now)
            .map_err(|e| NetError::remote(format!("connect to {}: socket error: {}", p.addr, e.0)))
    };
    io(p)?;
    while let Some(event) = p.machine.poll_event() {
        match event {
            ConnectorEvent::BringUp { .. } => {
                if let Err(e) = bring_up(&p.endpoints, p.machine.remote_lanes(), &p.settings) {
                    let _ = p.machine.reject(RejectReason::SetupFailed);
                    io(p)?;
                    return Err(NetError::system(format!(
                        "connect to {}: moving the queue pair to RTR/RTS failed: {e}",
                        p.addr
                    )));
                }
                let _ = p.machine.handle_qp_ready();
                io(p)?;
            }
            ConnectorEvent::Established => {
                let remote = p
                    .machine
                    .remote()
                    .copied()
                    .ok_or_else(|| NetError::misuse("connect: no remote"))?;
                return Ok(Step::Established(remote));
            }
            _ => {}
        }
    }
    if let Some(err) = p.machine.error() {
        return Err(NetError::remote(format!("connect to {}: {err}", p.addr)));
    }
    Ok(Step::Waiting)
}

pub(crate) fn connect(
    ctx: Option<&NetContext>,
    dev: c_int,
    tc: Option<i32>,
    handle: &mut [u8; 128],
) -> NetResult<Option<Ptr>> {
    let token = read_token(handle);
    let resumed = token.filter(|t| CONNECTS.find(*t).is_some());
    let token = match resumed {
        Some(t) => t,
        None => {
            let pending = start(ctx, dev, tc, handle)?;
            let t = CONNECTS
                .insert(Box::new(pending))
                .map_err(|full| NetError::system(format!("connect: {full}")))?;
            write_token(handle, Some(t));
            t
        }
    };
    // SAFETY: a pending connect is only touched by the thread calling `connect` with its handle
    // (NCCL polls one handle from one thread), and this one holds no reference into it.
    let mut pending = unsafe { CONNECTS.remove(token) }
        .ok_or_else(|| NetError::misuse("connect: pending connect vanished"))?;
    match progress(&mut pending) {
        Ok(Step::Waiting) => {
            // Put it back under a fresh token (removal bumped the slot's generation).
            let t = CONNECTS
                .insert(pending)
                .map_err(|full| NetError::system(format!("connect: {full}")))?;
            write_token(handle, Some(t));
            Ok(None)
        }
        Ok(Step::Established(remote)) => {
            write_token(handle, None);
            let remotes = pending.machine.remote_lanes().to_vec();
            let failover = pending.machine.failover();
            let PendingConnect {
                socket,
                addr,
                mut endpoints,
                devices,
                width,
                ar_threshold,
                eager_threshold,
                settings,
                ..
            } = *pending;
            let peer = format!("{addr} ({} qp {})", remote.device_name.as_str(), remote.qpn);
            info!(
                INIT_NET,
                "connected to {peer} from local QP {} ({} queue pair(s), each message over \
                 {width}{})",
                endpoints[0].qp_num(),
                endpoints.len(),
                if failover { "; port failover on" } else { "" }
            );
            if endpoints.len() == 1 {
                let mut conn = SendConn::new(remote.inbound);
                conn.set_adaptive_routing(ar_threshold);
                conn.enable_eager(eager_threshold);
                conn.set_inline_max(rivet_core::nic::Nic::max_inline(&endpoints[0]));
                let endpoint = endpoints.remove(0);
                let side = Side::new(conn, endpoint, socket, peer);
                return data::insert(DataComm::Send(side)).map(Some);
            }
            let conns = remotes.iter().map(|r| SendConn::new(r.inbound)).collect();
            let multi = MultiSend::with_width(conns, width, ar_threshold);
            let lanes = Lanes::new(endpoints, devices)
                .ok_or_else(|| NetError::misuse("connect: fewer queue pairs than ports"))?;
            #[cfg(feature = "failover")]
            let (multi, lanes) = if failover {
                let mut multi = multi;
                multi.enable_failover();
                let max_attempts = net::config()?.failover.max_attempts;
                let lanes = lanes.fail_over(
                    FailoverSide::Sender,
                    max_attempts,
                    settings,
                    &peer,
                    &socket,
                )?;
                (multi, lanes)
            } else {
                (multi, lanes)
            };
            #[cfg(not(feature = "failover"))]
            let _ = (failover, settings);
            data::insert(DataComm::SendMulti(Side::new(multi, lanes, socket, peer))).map(Some)
        }
        Err(e) => {
            write_token(handle, None);
            Err(e)
        }
    }
}
