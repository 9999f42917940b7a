//! [`ConnEndpoint`]: the endpoint a connection drives, as the comm layer sees it. Connections
//! are written once over it; which type they drive is chosen in one place, `backend::DataEndpoint`
//! (the library's [`AnyEndpoint`](super::endpoint::any::AnyEndpoint); the unit tests' wrapper that also
//! drives the simulated port).

use super::device::OpenPort;
use super::endpoint::Role;
use super::port_device::PortDevice;
use crate::config::QpSettings;
use rivet_core::data::multi::flow_label;
use rivet_core::nic::Nic;
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::VerbsError;
use std::fmt::Debug;
use std::sync::Arc;

/// One connection's queue pair on a port: set up, connected to its peer, then driven by the core
/// through [`Nic`].
pub(crate) trait ConnEndpoint: Nic + Debug + Send + Sized {
    /// The device of the ports it lives on.
    type Device: PortDevice;

    /// An endpoint for `role` on `port`'s data path (its queue pair at INIT).
    fn new(port: &Arc<OpenPort<Self::Device>>, role: Role) -> Result<Self, VerbsError>;

    /// What the peer needs to reach this endpoint.
    fn local_info(&self, settings: &QpSettings) -> EndpointInfo;

    /// Move the queue pair to RTR and RTS towards `remote`.
    fn connect(&self, remote: &EndpointInfo, settings: &QpSettings) -> Result<(), VerbsError>;

    /// [`connect`](Self::connect) as one of `lanes` queue pairs of a connection towards the
    /// peer's lane `remote`: with several, each gets its own GRH flow label (from the pair of QP
    /// numbers), so RoCE ECMP spreads them over the paths; a one-lane connection keeps the
    /// configured label.
    fn connect_lane(
        &self,
        remote: &EndpointInfo,
        settings: &QpSettings,
        lanes: usize,
    ) -> Result<(), String> {
        let lane_settings = if lanes > 1 {
            QpSettings {
                flow_label: flow_label(self.qp_num(), remote.qpn),
                ..*settings
            }
        } else {
            *settings
        };
        self.connect(remote, &lane_settings)
            .map_err(|e| e.to_string())
    }

    /// The port this endpoint lives on.
    fn port(&self) -> &Arc<OpenPort<Self::Device>>;

    /// The QP number (for log lines and asynchronous events).
    fn qp_num(&self) -> u32;

    /// The CQ's address, as `CQ_ERR` events name it.
    fn cq_addr(&self) -> usize;

    /// Port failover: move the queue pair to the error state, so nothing more lands through it
    /// and everything posted on it flushes.
    fn fail_queue_pair(&self) -> Result<(), VerbsError>;

    /// Port failover: a new queue pair (at INIT) on `port`, another port of the same protection
    /// domain, in place of the failed one; the control regions and their keys stay.
    fn move_to(&mut self, port: &Arc<OpenPort<Self::Device>>, role: Role)
    -> Result<(), VerbsError>;
}
