//! Listen comms and `accept`.
//!
//! A listen comm owns a non-blocking TCP listener. Every incoming TCP connection gets its own
//! `Acceptor` machine; one that sends garbage, stalls past the handshake deadline or names
//! another listen comm is dropped with one WARN line and never blocks the others, so the real
//! peer still connects. The first handshake to complete becomes the receive comm (NCCL takes
//! one receive comm per listen comm and closes the listen comm right after).
//!
//! Unsafe (opted in): `closeListen` removes the listen comm from its handle table, which
//! [`crate::handle`] makes `unsafe` (no reference to it may be in use; NCCL's contract guarantees
//! it).

#![allow(unsafe_code)]

use super::data::{self, DataComm, Side};
use super::flush::GpuFlush;
use super::path::Lanes;
use crate::backend::DataEndpoint as Endpoint;
use crate::backend::OpenPort;
use crate::backend::conn_endpoint::ConnEndpoint;
use crate::backend::endpoint::Role;
use crate::backend::flush::FlushQp;
use crate::clock;
use crate::config::Config;
use crate::config::QpSettings;
use crate::error::{NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry, registry, unknown};
use crate::log::{INIT_NET, info, warn};
use crate::mesh::MeshDevice;
use crate::net::{self, NetContext};
use crate::oob::{iface, pump, socket};
use core::ffi::c_int;
use rivet_core::data::RecvConn;
#[cfg(feature = "failover")]
use rivet_core::data::failover::Role as FailoverSide;
use rivet_core::data::multi::MultiRecv;
use rivet_core::handshake::{Acceptor, AcceptorEvent};
use rivet_core::mesh::{self, MeshAddr};
use rivet_core::wire::{
    EndpointInfo, ListenHandle, MESH_LIST_AT, MESH_LIST_LEN, MeshList, RejectReason,
};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Most half-open connections a listen comm keeps; beyond that the oldest is dropped, so a flood
/// of silent clients cannot grow memory without bound.
const MAX_PENDING: usize = 64;

/// A listen comm.
#[derive(Debug)]
pub(crate) struct ListenComm {
    /// The port connections are served on; on the mesh device one per member, with its address.
    ports: Ports,
    listener: TcpListener,
    listen_id: u64,
    config: Config,
    settings: QpSettings,
    pending: Mutex<Vec<PendingAccept>>,
}

/// Where a listen comm serves its connections.
#[derive(Debug)]
enum Ports {
    /// A physical device (one port) or a fused one (its members, in order).
    Device(Vec<Arc<OpenPort>>),
    /// The mesh device: the member whose address the connector reached (`addrs[i]` is the
    /// address of `ports[i]`).
    Mesh {
        addrs: Vec<MeshAddr>,
        ports: Vec<Arc<OpenPort>>,
    },
}

impl Ports {
    /// The ports for a connection that arrived on local address `arrived_on`.
    fn for_arrival(&self, arrived_on: Option<SocketAddr>) -> Option<Vec<Arc<OpenPort>>> {
        match self {
            Self::Device(ports) => Some(ports.clone()),
            Self::Mesh { addrs, ports } => {
                let Some(SocketAddr::V4(local)) = arrived_on else {
                    return None;
                };
                mesh::arrival_member(addrs, *local.ip())
                    .and_then(|i| ports.get(i).cloned())
                    .map(|port| vec![port])
            }
        }
    }
}

/// One accepted TCP connection whose handshake is in progress.
#[derive(Debug)]
struct PendingAccept {
    /// The ports this connection is served on (lane i on port i % ports; never empty).
    ports: Vec<Arc<OpenPort>>,
    socket: TcpStream,
    peer: SocketAddr,
    machine: Acceptor,
    /// One endpoint per lane, once the request arrived.
    endpoints: Vec<Endpoint>,
}

static LISTENS: Registry<ListenComm> = registry!(0x1157, "live listen comms");

pub(crate) fn listen(
    ctx: Option<&NetContext>,
    dev: c_int,
    handle: &mut [u8; 128],
) -> NetResult<Ptr> {
    let config = net::config()?;
    if let Some(mesh) = net::mesh_device_for(dev)? {
        return listen_mesh(ctx, &mesh, config, handle);
    }
    let ports = net::open_ports(dev)?;
    let port = Arc::clone(&ports[0]);
    let candidates = iface::local_addresses()
        .map_err(|e| NetError::system(format!("listen: getifaddrs: {e}")))?;
    let local = iface::choose(&candidates, &config.interface).ok_or_else(|| {
        NetError::system(match &config.interface.ifname {
            Some(list) => format!(
                "listen: NCCL_SOCKET_IFNAME={list} keeps no interface that is up with an address \
                 (NCCL_SOCKET_FAMILY {:?})",
                config.interface.family
            ),
            None => "listen: no network interface that is up with an address for the connection \
                     handshake"
                .to_owned(),
        })
    })?;
    let listener = socket::listen(local.addr).map_err(|e| {
        NetError::system(format!(
            "listen: cannot listen on {} ({}): {e}",
            local.addr, local.name
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| NetError::system(format!("listen: {e}")))?;
    let listen_id = crate::random::u64();
    handle.fill(0);
    handle[..rivet_core::wire::HANDLE_LEN]
        .copy_from_slice(&ListenHandle::new(addr, listen_id).encode());
    let settings = config.qp_settings(ctx.and_then(|c| c.traffic_class));
    info!(
        INIT_NET,
        "listening on {addr} ({}) for {} port {}{}",
        local.name,
        port.info.name,
        port.info.port,
        if ports.len() > 1 {
            format!(" and {} more fused port(s)", ports.len() - 1)
        } else {
            String::new()
        }
    );
    let comm = ListenComm {
        ports: Ports::Device(ports),
        listener,
        listen_id,
        config,
        settings,
        pending: Mutex::new(Vec::new()),
    };
    LISTENS
        .insert(Box::new(comm))
        .map(Handle::to_ptr)
        .map_err(|full| NetError::system(format!("listen: {full}")))
}

/// `listen` on the mesh device: one socket on every IPv4 address, every member's address in the
/// handle (bytes 80..128), each connection served on the member the connector reached.
fn listen_mesh(
    ctx: Option<&NetContext>,
    mesh: &MeshDevice,
    config: Config,
    handle: &mut [u8; 128],
) -> NetResult<Ptr> {
    let ports = (0..mesh.members.len())
        .map(|i| net::open_mesh_member(mesh, i))
        .collect::<NetResult<Vec<_>>>()?;
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let listener = socket::listen(any)
        .map_err(|e| NetError::system(format!("listen: cannot listen on {any}: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| NetError::system(format!("listen: {e}")))?
        .port();
    let addrs = mesh.addrs();
    let list = MeshList::new(&addrs)
        .ok_or_else(|| NetError::misuse("listen: the mesh device has no member"))?;
    let listen_id = crate::random::u64();
    // The listen handle names the first member; a mesh connector picks from the list.
    let first = SocketAddr::from((addrs[0].ip, port));
    handle.fill(0);
    handle[..rivet_core::wire::HANDLE_LEN]
        .copy_from_slice(&ListenHandle::new(first, listen_id).encode());
    handle[MESH_LIST_AT..MESH_LIST_AT + MESH_LIST_LEN].copy_from_slice(&list.encode());
    let settings = config.qp_settings(ctx.and_then(|c| c.traffic_class));
    info!(
        INIT_NET,
        "listening on port {port} of {} for the mesh device {}",
        addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        mesh.members
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join("+")
    );
    let comm = ListenComm {
        ports: Ports::Mesh { addrs, ports },
        listener,
        listen_id,
        config,
        settings,
        pending: Mutex::new(Vec::new()),
    };
    LISTENS
        .insert(Box::new(comm))
        .map(Handle::to_ptr)
        .map_err(|full| NetError::system(format!("listen: {full}")))
}

fn lookup(call: &str, ptr: Ptr) -> NetResult<(Handle, &'static ListenComm)> {
    LISTENS.lookup(call, "listenComm", ptr)
}

/// What became of one pending connection after a round of progress.
enum Progress {
    Waiting,
    Dropped,
    Established {
        endpoints: Vec<Endpoint>,
        remotes: Vec<EndpointInfo>,
        width: usize,
        peer: String,
        /// Both ends have port failover on (negotiated).
        failover: bool,
    },
}

/// Create one receiver endpoint per lane of the request (lane i on port i % ports) and bring each
/// up towards the connector's lane of the same index.
fn bring_up(
    ports: &[Arc<OpenPort>],
    remotes: &[EndpointInfo],
    settings: &QpSettings,
    eager: bool,
) -> Result<Vec<Endpoint>, String> {
    let mut endpoints = Vec::with_capacity(remotes.len());
    // A ring only on a single-queue-pair connection (the sender's rule too).
    let role = Role::of(true, eager && remotes.len() == 1);
    for (i, remote) in remotes.iter().enumerate() {
        let port = &ports[i % ports.len()];
        let endpoint = <Endpoint as ConnEndpoint>::new(port, role).map_err(|e| e.to_string())?;
        endpoint.connect_lane(remote, settings, remotes.len())?;
        endpoints.push(endpoint);
    }
    Ok(endpoints)
}

impl ListenComm {
    /// As NCCL's IB transport: one loopback queue pair per receive comm for the GPU flush, on
    /// ports that need one.
    fn with_flush<C: super::path::Path>(&self, side: Side<C>) -> NetResult<Side<C>> {
        if !side.port().gpu.flush {
            return Ok(side);
        }
        let qp = FlushQp::new(side.port(), &self.settings).map_err(|e| {
            NetError::system(format!(
                "accept: creating the GPU flush queue pair failed: {e}"
            ))
        })?;
        Ok(side.with_flush(GpuFlush::new(qp)))
    }

    fn progress(&self, pending: &mut PendingAccept) -> Progress {
        let now = clock::now();
        if let Err(e) = pump::pump(&mut pending.socket, &mut pending.machine, now) {
            warn!(
                "accept: dropping the connection from {}: socket error: {}",
                pending.peer, e.0
            );
            return Progress::Dropped;
        }
        while let Some(event) = pending.machine.poll_event() {
            match event {
                AcceptorEvent::Request { remote } => {
                    if remote.link_layer.code() != pending.ports[0].info.link_layer.raw() {
                        let _ = pending.machine.reject(RejectReason::LinkLayerMismatch);
                        continue;
                    }
                    let remotes = pending.machine.remote_lanes().to_vec();
                    let eager = self.config.eager_threshold > 0;
                    match bring_up(&pending.ports, &remotes, &self.settings, eager) {
                        Ok(endpoints) => {
                            let locals: Vec<EndpointInfo> = endpoints
                                .iter()
                                .map(|e| e.local_info(&self.settings))
                                .collect();
                            pending.endpoints = endpoints;
                            let _ = pending.machine.handle_local_lanes_ready(&locals);
                        }
                        Err(e) => {
                            warn!(
                                "accept: setting up the queue pair for {} failed: {e}",
                                pending.peer
                            );
                            let _ = pending.machine.reject(RejectReason::SetupFailed);
                        }
                    }
                    if let Err(e) = pump::pump(&mut pending.socket, &mut pending.machine, now) {
                        warn!(
                            "accept: dropping the connection from {}: socket error: {}",
                            pending.peer, e.0
                        );
                        return Progress::Dropped;
                    }
                }
                AcceptorEvent::Established => {
                    let endpoints = std::mem::take(&mut pending.endpoints);
                    let remotes = pending.machine.remote_lanes().to_vec();
                    let (Some(first), Some(remote)) = (endpoints.first(), remotes.first()) else {
                        warn!(
                            "accept: handshake with {} ended without an endpoint",
                            pending.peer
                        );
                        return Progress::Dropped;
                    };
                    let peer = format!(
                        "{} ({} qp {})",
                        pending.peer,
                        remote.device_name.as_str(),
                        remote.qpn
                    );
                    let width = pending.machine.lanes().width();
                    info!(
                        INIT_NET,
                        "accepted a connection from {peer} on local QP {} ({} queue pair(s), \
                         each message over {width}{})",
                        first.qp_num(),
                        endpoints.len(),
                        if pending.machine.failover() {
                            "; port failover on"
                        } else {
                            ""
                        }
                    );
                    return Progress::Established {
                        endpoints,
                        remotes,
                        width,
                        peer,
                        failover: pending.machine.failover(),
                    };
                }
                _ => {}
            }
        }
        if let Some(err) = pending.machine.error() {
            warn!(
                "accept: refused a connection attempt from {}: {err}",
                pending.peer
            );
            return Progress::Dropped;
        }
        Progress::Waiting
    }
}

pub(crate) fn accept(listen: Ptr) -> NetResult<Option<Ptr>> {
    let (_, comm) = lookup("accept", listen)?;
    let mut pending = comm
        .pending
        .lock()
        .map_err(|_| NetError::misuse("accept: listen comm unusable"))?;
    loop {
        match socket::accept(&comm.listener) {
            Ok(Some(stream)) => {
                let peer = stream
                    .peer_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                if pending.len() >= MAX_PENDING {
                    let oldest = pending.remove(0);
                    warn!(
                        "accept: too many half-open connections; dropping the one from {}",
                        oldest.peer
                    );
                }
                let Some(ports) = comm.ports.for_arrival(stream.local_addr().ok()) else {
                    warn!(
                        "accept: dropping the connection from {peer}: it arrived on {:?}, the \
                         address of no member of the mesh device",
                        stream.local_addr().ok()
                    );
                    continue;
                };
                let machine =
                    Acceptor::new(comm.listen_id, clock::now(), comm.config.handshake_timeout)
                        .with_failover(comm.config.failover.wanted(ports.len()));
                pending.push(PendingAccept {
                    ports,
                    socket: stream,
                    peer,
                    machine,
                    endpoints: Vec::new(),
                });
            }
            Ok(None) => break,
            Err(e) => return Err(NetError::system(format!("accept: {e}"))),
        }
    }
    let mut index = 0;
    while index < pending.len() {
        match comm.progress(&mut pending[index]) {
            Progress::Waiting => index += 1,
            Progress::Dropped => drop(pending.remove(index)),
            Progress::Established {
                mut endpoints,
                remotes,
                width,
                peer,
                failover,
            } => {
                let done = pending.remove(index);
                if endpoints.len() == 1 {
                    let mut endpoint = endpoints.remove(0);
                    let mut conn = RecvConn::new(remotes[0].inbound);
                    if comm.config.eager_threshold > 0 {
                        // Takes eager messages when the sender reads credits (version 4).
                        conn.enable_eager(&mut endpoint).map_err(|e| {
                            NetError::system(format!("accept: posting the eager receives: {e}"))
                        })?;
                    }
                    let side = Side::new(conn, endpoint, done.socket, peer);
                    return data::insert(DataComm::Recv(comm.with_flush(side)?)).map(Some);
                }
                let conns = remotes.iter().map(|r| RecvConn::new(r.inbound)).collect();
                let multi = MultiRecv::with_width(conns, width);
                let devices = done.ports.len().min(endpoints.len());
                let lanes = Lanes::new(endpoints, devices)
                    .ok_or_else(|| NetError::misuse("accept: fewer queue pairs than ports"))?;
                #[cfg(feature = "failover")]
                let (multi, lanes) = if failover {
                    let mut multi = multi;
                    multi.enable_failover();
                    let lanes = lanes.fail_over(
                        FailoverSide::Receiver,
                        comm.config.failover.max_attempts,
                        comm.settings,
                        &peer,
                        &done.socket,
                    )?;
                    (multi, lanes)
                } else {
                    (multi, lanes)
                };
                #[cfg(not(feature = "failover"))]
                let _ = failover;
                let side = Side::new(multi, lanes, done.socket, peer);
                return data::insert(DataComm::RecvMulti(comm.with_flush(side)?)).map(Some);
            }
        }
    }
    Ok(None)
}

pub(crate) fn close_listen(listen: Ptr) -> NetResult<()> {
    let (handle, _) = lookup("closeListen", listen)?;
    // SAFETY: NCCL closes a listen comm only after its last `accept` returned, and `accept` keeps
    // no reference past its return.
    unsafe { LISTENS.remove(handle) }
        .map(drop)
        .ok_or_else(|| unknown("closeListen", "listenComm", listen))
}
