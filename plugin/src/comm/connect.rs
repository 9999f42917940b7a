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
use crate::backend::any::AnyEndpoint as Endpoint;
use crate::backend::endpoint::Role;
use crate::clock;
use crate::config::QpSettings;
use crate::error::{NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry};
use crate::log::{INIT_NET, info};
use crate::net::{self, NetContext};
use crate::oob::{pump, socket};
use core::ffi::c_int;
use rivet_core::data::SendConn;
use rivet_core::handshake::{Connector, ConnectorEvent};
use rivet_core::wire::{EndpointInfo, HANDLE_LEN, ListenHandle, RejectReason};
use std::net::{SocketAddr, TcpStream};

/// Marks bytes 64..72 of NCCL's handle as holding a pending-connect token.
const TOKEN_MAGIC: [u8; 8] = *b"RVTCONN1";

/// A connect in progress.
#[derive(Debug)]
struct PendingConnect {
    socket: TcpStream,
    addr: SocketAddr,
    tcp_connected: bool,
    machine: Connector,
    endpoint: Endpoint,
    settings: QpSettings,
}

static CONNECTS: Registry<PendingConnect> = Registry::new(0xc044, "connects in progress");

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
    let port = net::open_port(dev)?;
    let config = net::config()?;
    let settings = config.qp_settings(tc.or_else(|| ctx.and_then(|c| c.traffic_class)));
    let endpoint = Endpoint::new(&port, Role::Sender).map_err(|e| {
        NetError::system(format!(
            "connect: setting up the connection on {}: {e}",
            port.info.name
        ))
    })?;
    let socket = socket::start_connect(listener.addr)
        .map_err(|e| NetError::system(format!("connect: cannot reach {}: {e}", listener.addr)))?;
    let machine = Connector::new(
        &listener,
        endpoint.local_info(&settings),
        clock::now(),
        config.handshake_timeout,
    );
    Ok(PendingConnect {
        socket,
        addr: listener.addr,
        tcp_connected: false,
        machine,
        endpoint,
        settings,
    })
}

/// Where a pending connect stands after a round of progress.
enum Step {
    Waiting,
    Established(EndpointInfo),
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
            ConnectorEvent::BringUp { remote } => {
                if let Err(e) = p.endpoint.connect(&remote, &p.settings) {
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
            let PendingConnect {
                socket,
                addr,
                endpoint,
                ..
            } = *pending;
            let peer = format!("{addr} ({} qp {})", remote.device_name.as_str(), remote.qpn);
            info!(
                INIT_NET,
                "connected to {peer} from local QP {}",
                endpoint.qp_num()
            );
            let side = Side::new(SendConn::new(remote.inbound), endpoint, socket, peer);
            data::insert(DataComm::Send(side)).map(Some)
        }
        Err(e) => {
            write_token(handle, None);
            Err(e)
        }
    }
}
