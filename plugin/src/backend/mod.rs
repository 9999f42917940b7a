//! The libibverbs backend: opened devices, registered control regions, and the per-connection
//! endpoint that implements `rivet_core::nic::Nic` on a real RC queue pair.
//!
//! The seam (issue #30): the rest of the plugin names the endpoint its connections drive as
//! [`DataEndpoint`] and the port type as [`OpenPort`], both chosen here and nowhere else. In the
//! library that is [`endpoint::any::AnyEndpoint`] on [`device::OpenPort`] over a verbs device; the unit
//! tests plug in `sim::TestEndpoint`, which also drives the simulated port. The backend's code is
//! generic over the two traits that meet there ([`conn_endpoint::ConnEndpoint`],
//! [`port_device::PortDevice`]), so nothing in it has an arm for the tests.

pub(crate) mod conn_endpoint;
pub(crate) mod device;
pub(crate) mod endpoint;
pub(crate) mod flush;
pub(crate) mod mlx5;
pub(crate) mod mr_cache;
pub(crate) mod port_device;
pub(crate) mod qp_params;
#[cfg(feature = "rma")]
pub(crate) mod rma_lane;
#[cfg(test)]
pub(crate) mod sim;

/// The endpoint every connection drives: [`endpoint::any::AnyEndpoint`] (mlx5 direct or
/// libibverbs) behind the core's failover tripwire (`rivet_core::data::failover::Guarded`:
/// unarmed, one branch per poll; armed on the lanes of a connection that fails over). One type
/// for every connection, so the core's data path is compiled once for it (a second type for the
/// lanes of fused connections doubled it: 130 KB of the library).
#[cfg(all(not(test), feature = "failover"))]
pub(crate) type DataEndpoint = rivet_core::data::failover::Guarded<endpoint::any::AnyEndpoint>;
/// Without port failover (the minimal build) no tripwire is ever armed: the endpoint itself.
#[cfg(all(not(test), not(feature = "failover")))]
pub(crate) type DataEndpoint = endpoint::any::AnyEndpoint;
/// The endpoint every connection drives: in the unit tests, the library's on a verbs port and
/// the simulated one on the simulated port.
#[cfg(test)]
pub(crate) type DataEndpoint = rivet_core::data::failover::Guarded<sim::TestEndpoint>;

/// An opened port, on the device [`DataEndpoint`] runs on.
pub(crate) type OpenPort = device::OpenPort<<DataEndpoint as conn_endpoint::ConnEndpoint>::Device>;
