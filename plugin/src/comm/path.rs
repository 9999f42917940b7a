//! The two shapes of an established connection behind one interface: a single queue pair
//! (`rivet-core`'s `SendConn`/`RecvConn` driving one endpoint) and several ("lanes":
//! `MultiSend`/`MultiRecv` driving one endpoint per lane, `NCCL_IB_QPS_PER_CONNECTION`). The data
//! path ([`super::data`]) is written once over [`SendPath`]/[`RecvPath`] and monomorphised per
//! shape, so the single-QP path pays nothing for the other.

use crate::backend::DataEndpoint as Endpoint;
// Only the module: `ConnEndpoint`'s methods share names with `Nics`'s, which this file calls.
#[cfg(feature = "failover")]
use super::failover::FailoverDriver;
use crate::backend::OpenPort;
use crate::backend::conn_endpoint;
#[cfg(feature = "failover")]
use crate::backend::endpoint::Role;
#[cfg(feature = "failover")]
use crate::config::QpSettings;
#[cfg(feature = "failover")]
use crate::error::{NetError, NetResult};
#[cfg(feature = "failover")]
use rivet_core::data::failover::{Role as FailoverSide, Tripwire};
use rivet_core::data::multi::{MultiRecv, MultiSend};
use rivet_core::data::{
    Connection, DataError, RecvBuf, RecvConn, RequestId, SendBuf, SendConn, SizesOut,
};
use rivet_core::nic::Nic;
use std::fmt::Debug;
use std::net::TcpStream;
use std::sync::Arc;

/// The queue pairs a connection drives: one endpoint, or its lanes.
pub(crate) trait Nics: Debug + Send {
    /// The port of lane 0 (registrations and asynchronous events).
    fn port(&self) -> &Arc<OpenPort>;
    /// Lane 0's queue pair number, for log lines and the event watch.
    fn qp_num(&self) -> u32;
    /// Lane 0's completion queue, for the event watch.
    fn cq_addr(&self) -> usize;
    /// Lane 0's inline limit (fixed when its queue pair was made), read once per connection.
    fn max_inline(&self) -> usize;
    /// Ports the lanes are spread over (a fused device's members); lane `i` is on port
    /// `i % devices()`.
    fn devices(&self) -> usize {
        1
    }
    /// Those ports, in member order (registrations are made on each).
    fn ports(&self) -> Vec<Arc<OpenPort>> {
        vec![Arc::clone(self.port())]
    }
}

impl Nics for Endpoint {
    fn port(&self) -> &Arc<OpenPort> {
        conn_endpoint::ConnEndpoint::port(self)
    }
    fn qp_num(&self) -> u32 {
        conn_endpoint::ConnEndpoint::qp_num(self)
    }
    fn cq_addr(&self) -> usize {
        conn_endpoint::ConnEndpoint::cq_addr(self)
    }
    fn max_inline(&self) -> usize {
        Nic::max_inline(self)
    }
}

/// The endpoints of a multi-QP connection, lane `i` at index `i` (never empty), lane `i` on
/// port `i % devices` (until port failover moves it). Each is guarded by a tripwire
/// (`rivet_core::data::failover::Guarded`), armed only when the connection fails over: unarmed,
/// every completion reaches the core as it comes.
#[derive(Debug)]
pub(crate) struct Lanes {
    lanes: Vec<Endpoint>,
    devices: usize,
    #[cfg(feature = "failover")]
    failover: Option<Box<FailoverDriver>>,
}

impl Lanes {
    /// `endpoints` in lane order over `devices` ports (1..=8, at most one per lane); `None` when
    /// that does not hold.
    pub(crate) fn new(endpoints: Vec<Endpoint>, devices: usize) -> Option<Self> {
        ((1..=8).contains(&devices) && devices <= endpoints.len()).then(|| Self {
            lanes: endpoints,
            devices,
            #[cfg(feature = "failover")]
            failover: None,
        })
    }

    #[cfg(feature = "failover")]
    /// Fail over among the ports (both ends agreed at connect): the tripwires are armed and a
    /// [`FailoverDriver`] runs after every data-path call, its reports over the handshake
    /// `socket` (from now on without blocking).
    pub(crate) fn fail_over(
        mut self,
        side: FailoverSide,
        max_attempts: u32,
        settings: QpSettings,
        peer: &str,
        socket: &TcpStream,
    ) -> NetResult<Self> {
        socket.set_nonblocking(true).map_err(|e| {
            NetError::system(format!(
                "port failover: the handshake socket with {peer} cannot be made non-blocking: {e}"
            ))
        })?;
        let role = match side {
            FailoverSide::Sender => Role::Sender,
            FailoverSide::Receiver => Role::Receiver,
        };
        let driver = FailoverDriver::new(
            side,
            self.ports(),
            self.lanes.len(),
            max_attempts,
            role,
            settings,
            peer.to_owned(),
        );
        for lane in &mut self.lanes {
            lane.trip = Tripwire::new(true);
        }
        self.failover = Some(Box::new(driver));
        Ok(self)
    }

    fn first(&self) -> &Endpoint {
        // Never empty (checked in `new`).
        &self.lanes[0]
    }
}

impl Nics for Lanes {
    fn port(&self) -> &Arc<OpenPort> {
        self.first().port()
    }
    fn qp_num(&self) -> u32 {
        self.first().qp_num()
    }
    fn cq_addr(&self) -> usize {
        self.first().cq_addr()
    }
    fn max_inline(&self) -> usize {
        Nic::max_inline(self.first())
    }
    fn devices(&self) -> usize {
        self.devices
    }
    fn ports(&self) -> Vec<Arc<OpenPort>> {
        self.lanes[..self.devices]
            .iter()
            .map(|e| Arc::clone(e.port()))
            .collect()
    }
}

/// What both directions of a connection do, over their [`Nics`].
pub(crate) trait Path: Debug + Send {
    /// One endpoint or lanes.
    type Nics: Nics;
    /// Report on `req`, its sizes written to `sizes` when it finished (as `rivet_core`'s
    /// `Connection::test_into`).
    fn test(
        &mut self,
        nics: &mut Self::Nics,
        req: RequestId,
        sizes: &mut impl SizesOut,
    ) -> Result<bool, DataError>;
    /// Fail the connection with `err` unless it already failed.
    fn handle_fatal(&mut self, err: DataError);
    /// Poll what is posted; requests still outstanding.
    fn drain(&mut self, nics: &mut Self::Nics) -> Result<usize, DataError>;
    /// Requests handed out and not yet freed by `test`.
    fn outstanding(&self) -> usize;

    /// After a data-path call: run port failover as far as it goes now (a connection that fails
    /// over; nothing otherwise), the peer's reports read from `socket`. Whether lane 0's queue
    /// pair was replaced (the connection's event watch follows it).
    #[inline(always)]
    fn progress_failover(&mut self, nics: &mut Self::Nics, socket: &TcpStream) -> bool {
        let _ = (nics, socket);
        false
    }
}

/// A send comm's connection.
pub(crate) trait SendPath: Path {
    /// Post `buf` for the receive tagged `tag` (`Ok(None)`: try again later); `host_memory`:
    /// NCCL registered it as host memory, which the eager path may copy from.
    fn isend(
        &mut self,
        nics: &mut Self::Nics,
        buf: SendBuf,
        host_memory: bool,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError>;

    /// [`isend`](Self::isend) over lanes of several ports: port `d` reads `buf` under
    /// `lkeys[d]`. Only connections whose [`Nics::devices`] is above 1 are given it.
    fn isend_keyed(
        &mut self,
        nics: &mut Self::Nics,
        buf: SendBuf,
        lkeys: &[u32],
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        let _ = lkeys;
        self.isend(nics, buf, false, tag)
    }
}

/// A receive comm's connection.
pub(crate) trait RecvPath: Path {
    /// Post a receive of `bufs` tagged `tags` (`Ok(None)`: try again later).
    fn irecv(
        &mut self,
        nics: &mut Self::Nics,
        bufs: &[RecvBuf],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError>;

    /// [`irecv`](Self::irecv) of one buffer (NCCL's point-to-point receive), taken by value: no
    /// one-element arrays in memory on the way. `max_inline` is the [`Nics::max_inline`] the
    /// caller keeps.
    fn irecv_one(
        &mut self,
        nics: &mut Self::Nics,
        buf: RecvBuf,
        tag: u32,
        max_inline: usize,
    ) -> Result<Option<RequestId>, DataError> {
        let _ = max_inline;
        self.irecv(nics, &[buf], &[tag])
    }

    /// [`irecv`](Self::irecv) over lanes of several ports: port `d` offers buffer `b` under
    /// `rkeys[d][b]`. Only connections whose [`Nics::devices`] is above 1 are given it.
    fn irecv_keyed(
        &mut self,
        nics: &mut Self::Nics,
        bufs: &[RecvBuf],
        rkeys: &[[u32; 8]],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        let _ = rkeys;
        self.irecv(nics, bufs, tags)
    }
}

/// One queue pair: the core's single-QP connection on one endpoint.
macro_rules! single_path {
    ($conn:ty) => {
        impl Path for $conn {
            type Nics = Endpoint;
            #[inline(always)]
            fn test(
                &mut self,
                nic: &mut Endpoint,
                req: RequestId,
                sizes: &mut impl SizesOut,
            ) -> Result<bool, DataError> {
                Connection::test_into(self, nic, req, sizes)
            }
            fn handle_fatal(&mut self, err: DataError) {
                Connection::handle_fatal(self, err)
            }
            fn drain(&mut self, nic: &mut Endpoint) -> Result<usize, DataError> {
                Connection::drain(self, nic)
            }
            fn outstanding(&self) -> usize {
                Connection::outstanding(self)
            }
        }
    };
}

single_path!(SendConn);
single_path!(RecvConn);

/// Several queue pairs: the core's multi-QP connection on its lanes.
macro_rules! multi_path {
    ($conn:ty) => {
        impl Path for $conn {
            type Nics = Lanes;
            fn test(
                &mut self,
                lanes: &mut Lanes,
                req: RequestId,
                sizes: &mut impl SizesOut,
            ) -> Result<bool, DataError> {
                Ok(<$conn>::test(self, &mut lanes.lanes, req)?.deliver(sizes))
            }
            fn handle_fatal(&mut self, err: DataError) {
                <$conn>::handle_fatal(self, err)
            }
            fn drain(&mut self, lanes: &mut Lanes) -> Result<usize, DataError> {
                <$conn>::drain(self, &mut lanes.lanes)
            }
            fn outstanding(&self) -> usize {
                <$conn>::outstanding(self)
            }
            #[cfg(feature = "failover")]
            fn progress_failover(&mut self, lanes: &mut Lanes, socket: &TcpStream) -> bool {
                let Lanes {
                    lanes, failover, ..
                } = lanes;
                match failover {
                    Some(driver) => {
                        driver.drive(self, lanes, socket);
                        driver.take_lane0_moved()
                    }
                    None => false,
                }
            }
        }
    };
}

multi_path!(MultiSend);
multi_path!(MultiRecv);

impl SendPath for MultiSend {
    fn isend(
        &mut self,
        lanes: &mut Lanes,
        buf: SendBuf,
        _host_memory: bool,
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        Self::isend(self, &mut lanes.lanes, buf, tag)
    }
    fn isend_keyed(
        &mut self,
        lanes: &mut Lanes,
        buf: SendBuf,
        lkeys: &[u32],
        tag: u32,
    ) -> Result<Option<RequestId>, DataError> {
        Self::isend_keyed(self, &mut lanes.lanes, buf, lkeys, tag)
    }
}

impl RecvPath for MultiRecv {
    fn irecv(
        &mut self,
        lanes: &mut Lanes,
        bufs: &[RecvBuf],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        Self::irecv(self, &mut lanes.lanes, bufs, tags)
    }
    fn irecv_keyed(
        &mut self,
        lanes: &mut Lanes,
        bufs: &[RecvBuf],
        rkeys: &[[u32; 8]],
        tags: &[u32],
    ) -> Result<Option<RequestId>, DataError> {
        Self::irecv_keyed(self, &mut lanes.lanes, bufs, rkeys, tags)
    }
}
