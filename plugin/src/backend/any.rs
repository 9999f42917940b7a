//! The data path a connection uses: mlx5 direct (WQEs and CQEs handled by Rivet) on mlx5 devices,
//! libibverbs everywhere else, chosen per port when it is opened.

use super::conn_endpoint::ConnEndpoint;
use super::device::OpenPort;
use super::endpoint::{Endpoint, Role};
use super::mlx5::endpoint::{Device, Mlx5Endpoint};
use super::port_device::{PortDevice, VerbsDevice};
use crate::config::QpSettings;
use crate::log::{INIT_NET, info};
use rivet_core::nic::{Completion, Nic, NicError, SendWr};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::VerbsError;
use std::sync::Arc;

/// One connection's endpoint on either data path, on a port of device `D`.
#[derive(Debug)]
pub(crate) enum AnyEndpoint<D: PortDevice = VerbsDevice> {
    /// libibverbs post/poll through the provider's ops table.
    Verbs(Endpoint<D>),
    /// mlx5 direct: Rivet writes WQEs, rings doorbells and reads CQEs itself.
    Mlx5(Box<Mlx5Endpoint<Device<D>>>),
}

impl<D: PortDevice> ConnEndpoint for AnyEndpoint<D> {
    type Device = D;

    /// An endpoint on the port's data path. A failure to set up the direct path falls back to
    /// libibverbs with one INFO line; the port then stays on libibverbs.
    fn new(port: &Arc<OpenPort<D>>, role: Role) -> Result<Self, VerbsError> {
        if port.direct_path() {
            match Mlx5Endpoint::new(port, role) {
                Ok(endpoint) => return Ok(Self::Mlx5(Box::new(endpoint))),
                Err(e) => {
                    port.disable_direct_path();
                    info!(
                        INIT_NET,
                        "{} port {}: mlx5 direct path setup failed ({e}); using libibverbs",
                        port.info.name,
                        port.info.port
                    );
                }
            }
        }
        Endpoint::new(port, role).map(Self::Verbs)
    }

    fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        match self {
            Self::Verbs(e) => e.local_info(settings),
            Self::Mlx5(e) => e.local_info(settings),
        }
    }

    fn connect(&self, remote: &EndpointInfo, settings: &QpSettings) -> Result<(), VerbsError> {
        match self {
            Self::Verbs(e) => e.connect(remote, settings),
            Self::Mlx5(e) => e.connect(remote, settings),
        }
    }

    fn port(&self) -> &Arc<OpenPort<D>> {
        match self {
            Self::Verbs(e) => e.port(),
            Self::Mlx5(e) => e.port(),
        }
    }

    fn qp_num(&self) -> u32 {
        match self {
            Self::Verbs(e) => e.qp_num(),
            Self::Mlx5(e) => e.qp_num(),
        }
    }

    fn cq_addr(&self) -> usize {
        match self {
            Self::Verbs(e) => e.cq_addr(),
            Self::Mlx5(e) => e.cq_addr(),
        }
    }
}

impl<D: PortDevice> Nic for AnyEndpoint<D> {
    #[inline]
    fn max_inline(&self) -> usize {
        match self {
            Self::Verbs(e) => e.max_inline(),
            Self::Mlx5(e) => e.max_inline(),
        }
    }

    #[inline(always)]
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        match self {
            Self::Verbs(e) => e.post_send(chain),
            // A one-request chain is copied in this arm and the copy handed on: the mlx5 post is
            // out of line and takes the request by address, and were that the caller's array,
            // the request would be written to memory before the match, for the verbs arm too
            // (which reads its fields from registers). Its result is taken apart (`?`) and
            // `Ok(())` built here: returned as it is, the out-of-line call would write it straight
            // into the caller's result, which then lives in memory for the verbs arm too.
            Self::Mlx5(e) => {
                match chain {
                    [wr] => {
                        let wr = *wr;
                        e.post_send(core::slice::from_ref(&wr))?;
                    }
                    _ => e.post_send(chain)?,
                }
                Ok(())
            }
        }
    }

    #[inline(always)]
    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        match self {
            Self::Verbs(e) => e.post_recv(wr_id),
            Self::Mlx5(e) => e.post_recv(wr_id),
        }
    }

    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        match self {
            Self::Verbs(e) => e.poll(out),
            Self::Mlx5(e) => e.poll(out),
        }
    }

    #[inline(always)]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        match self {
            Self::Verbs(e) => e.poll_take(out, take),
            // Inlined down to the CQE decode, as the verbs arm is: passed on to an out-of-line
            // call, `take`'s captures would be built in memory before the match, for both arms.
            Self::Mlx5(e) => e.poll_take(out, take),
        }
    }

    // Always: the reads' lengths and offsets are constants at the core's call sites, and
    // `Region::read_volatile` folds to one or a few word loads with them.
    #[inline(always)]
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        match self {
            Self::Verbs(e) => e.read_inbound(offset, out),
            Self::Mlx5(e) => e.read_inbound(offset, out),
        }
    }

    // One match for both reads: after the first read's fence the variant would be loaded and
    // tested again.
    #[inline(always)]
    fn read_inbound_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
        match self {
            Self::Verbs(e) => e.read_inbound_stamped(offset),
            Self::Mlx5(e) => e.read_inbound_stamped(offset),
        }
    }

    #[inline]
    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Self::Verbs(e) => e.write_staging(offset, bytes),
            Self::Mlx5(e) => e.write_staging(offset, bytes),
        }
    }
}
