//! The data path a connection uses: mlx5 direct (WQEs and CQEs handled by Rivet) on mlx5 devices,
//! libibverbs everywhere else, chosen per port when it is opened.

use super::device::OpenPort;
use super::endpoint::{Endpoint, Role};
use super::mlx5::endpoint::Mlx5Endpoint;
use crate::config::QpSettings;
use crate::log::{INIT_NET, info};
use rivet_core::nic::{Completion, Nic, NicError, SendWr};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::VerbsError;
use std::sync::Arc;

/// One connection's endpoint on either data path.
#[derive(Debug)]
pub(crate) enum AnyEndpoint {
    /// libibverbs post/poll through the provider's ops table.
    Verbs(Endpoint),
    /// mlx5 direct: Rivet writes WQEs, rings doorbells and reads CQEs itself.
    Mlx5(Box<Mlx5Endpoint>),
    /// The test-only simulated fabric (`backend::sim`).
    #[cfg(test)]
    Sim(super::sim::SimEndpoint),
}

impl AnyEndpoint {
    /// An endpoint on the port's data path. A failure to set up the direct path falls back to
    /// libibverbs with one INFO line; the port then stays on libibverbs.
    pub(crate) fn new(port: &Arc<OpenPort>, role: Role) -> Result<Self, VerbsError> {
        #[cfg(test)]
        if port.is_simulated() {
            return super::sim::SimEndpoint::new(port, role).map(Self::Sim);
        }
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

    /// What the peer needs to reach this endpoint.
    pub(crate) fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        match self {
            Self::Verbs(e) => e.local_info(settings),
            Self::Mlx5(e) => e.local_info(settings),
            #[cfg(test)]
            Self::Sim(e) => e.local_info(settings),
        }
    }

    /// Move the queue pair to RTR and RTS towards `remote`.
    pub(crate) fn connect(
        &self,
        remote: &EndpointInfo,
        settings: &QpSettings,
    ) -> Result<(), VerbsError> {
        match self {
            Self::Verbs(e) => e.connect(remote, settings),
            Self::Mlx5(e) => e.connect(remote, settings),
            #[cfg(test)]
            Self::Sim(e) => e.connect(remote, settings),
        }
    }

    /// The port this endpoint lives on.
    pub(crate) fn port(&self) -> &Arc<OpenPort> {
        match self {
            Self::Verbs(e) => e.port(),
            Self::Mlx5(e) => e.port(),
            #[cfg(test)]
            Self::Sim(e) => e.port(),
        }
    }

    /// The QP number (for log lines and asynchronous events).
    pub(crate) fn qp_num(&self) -> u32 {
        match self {
            Self::Verbs(e) => e.qp_num(),
            Self::Mlx5(e) => e.qp_num(),
            #[cfg(test)]
            Self::Sim(e) => e.qp_num(),
        }
    }

    /// The CQ's address, as `CQ_ERR` events name it.
    pub(crate) fn cq_addr(&self) -> usize {
        match self {
            Self::Verbs(e) => e.cq_addr(),
            Self::Mlx5(e) => e.cq_addr(),
            #[cfg(test)]
            Self::Sim(e) => e.cq_addr(),
        }
    }
}

impl Nic for AnyEndpoint {
    #[inline]
    fn max_inline(&self) -> usize {
        match self {
            Self::Verbs(e) => e.max_inline(),
            Self::Mlx5(e) => e.max_inline(),
            #[cfg(test)]
            Self::Sim(e) => e.max_inline(),
        }
    }

    #[inline(always)]
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        match self {
            Self::Verbs(e) => e.post_send(chain),
            Self::Mlx5(e) => e.post_send(chain),
            #[cfg(test)]
            Self::Sim(e) => e.post_send(chain),
        }
    }

    #[inline]
    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        match self {
            Self::Verbs(e) => e.post_recv(wr_id),
            Self::Mlx5(e) => e.post_recv(wr_id),
            #[cfg(test)]
            Self::Sim(e) => e.post_recv(wr_id),
        }
    }

    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        match self {
            Self::Verbs(e) => e.poll(out),
            Self::Mlx5(e) => e.poll(out),
            #[cfg(test)]
            Self::Sim(e) => e.poll(out),
        }
    }

    #[inline]
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        match self {
            Self::Verbs(e) => e.read_inbound(offset, out),
            Self::Mlx5(e) => e.read_inbound(offset, out),
            #[cfg(test)]
            Self::Sim(e) => e.read_inbound(offset, out),
        }
    }

    #[inline]
    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Self::Verbs(e) => e.write_staging(offset, bytes),
            Self::Mlx5(e) => e.write_staging(offset, bytes),
            #[cfg(test)]
            Self::Sim(e) => e.write_staging(offset, bytes),
        }
    }
}
