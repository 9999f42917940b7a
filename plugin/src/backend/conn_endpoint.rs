//! [`ConnEndpoint`]: the endpoint a connection drives, as the comm layer sees it. Connections
//! are written once over it; which type they drive is chosen in one place, `backend::DataEndpoint`
//! (the library's [`AnyEndpoint`](super::endpoint::any::AnyEndpoint); the unit tests' wrapper that also
//! drives the simulated port).

use super::device::OpenPort;
use super::endpoint::Role;
use super::port_device::PortDevice;
use crate::config::QpSettings;
use rivet_core::data::failover::Guarded;
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
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    fn fail_queue_pair(&self) -> Result<(), VerbsError>;

    /// Port failover: a new queue pair (at INIT) on `port` in place of the failed one; the
    /// control regions stay (registered in `port`'s protection domain anew when it is another
    /// device's: new keys, carried by `local_info`).
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    fn move_to(&mut self, port: &Arc<OpenPort<Self::Device>>, role: Role)
    -> Result<(), VerbsError>;
}

/// An endpoint behind the core's failover tripwire is the endpoint (every call forwarded; a new
/// one's tripwire unarmed).
impl<E: ConnEndpoint> ConnEndpoint for Guarded<E> {
    type Device = E::Device;

    fn new(port: &Arc<OpenPort<Self::Device>>, role: Role) -> Result<Self, VerbsError> {
        E::new(port, role).map(|e| Self::new(e, false))
    }

    fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        self.nic.local_info(settings)
    }

    fn connect(&self, remote: &EndpointInfo, settings: &QpSettings) -> Result<(), VerbsError> {
        self.nic.connect(remote, settings)
    }

    fn port(&self) -> &Arc<OpenPort<Self::Device>> {
        self.nic.port()
    }

    fn qp_num(&self) -> u32 {
        self.nic.qp_num()
    }

    fn cq_addr(&self) -> usize {
        self.nic.cq_addr()
    }

    fn fail_queue_pair(&self) -> Result<(), VerbsError> {
        self.nic.fail_queue_pair()
    }

    fn move_to(
        &mut self,
        port: &Arc<OpenPort<Self::Device>>,
        role: Role,
    ) -> Result<(), VerbsError> {
        self.nic.move_to(port, role)
    }
}
