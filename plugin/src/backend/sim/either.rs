//! [`TestEndpoint`]: the endpoint type connections drive in the unit tests (`backend::DataEndpoint`
//! there): the library's endpoint on a verbs port, the simulated one on the simulated port.

use super::device::TestDevice;
use super::endpoint::SimEndpoint;
use crate::backend::conn_endpoint::ConnEndpoint;
use crate::backend::device::OpenPort;
use crate::backend::endpoint::Role;
use crate::backend::endpoint::any::AnyEndpoint;
use crate::config::QpSettings;
use rivet_core::nic::{Completion, Nic, NicError, SendWr};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::VerbsError;
use std::sync::Arc;

/// One connection's endpoint in the unit tests.
#[derive(Debug)]
pub(crate) enum TestEndpoint {
    /// On a verbs device: the library's endpoint.
    Device(AnyEndpoint<TestDevice>),
    /// On the simulated port.
    Simulated(SimEndpoint),
}

impl ConnEndpoint for TestEndpoint {
    type Device = TestDevice;

    fn new(port: &Arc<OpenPort<TestDevice>>, role: Role) -> Result<Self, VerbsError> {
        match port.device {
            TestDevice::Verbs(_) => AnyEndpoint::new(port, role).map(Self::Device),
            TestDevice::Simulated => SimEndpoint::new(port, role).map(Self::Simulated),
        }
    }

    fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        match self {
            Self::Device(e) => e.local_info(settings),
            Self::Simulated(e) => e.local_info(settings),
        }
    }

    fn connect(&self, remote: &EndpointInfo, settings: &QpSettings) -> Result<(), VerbsError> {
        match self {
            Self::Device(e) => e.connect(remote, settings),
            Self::Simulated(e) => e.connect(remote, settings),
        }
    }

    fn port(&self) -> &Arc<OpenPort<TestDevice>> {
        match self {
            Self::Device(e) => e.port(),
            Self::Simulated(e) => e.port(),
        }
    }

    fn qp_num(&self) -> u32 {
        match self {
            Self::Device(e) => e.qp_num(),
            Self::Simulated(e) => e.qp_num(),
        }
    }

    fn cq_addr(&self) -> usize {
        match self {
            Self::Device(e) => e.cq_addr(),
            Self::Simulated(e) => e.cq_addr(),
        }
    }

    fn fail_queue_pair(&self) -> Result<(), VerbsError> {
        match self {
            Self::Device(e) => e.fail_queue_pair(),
            Self::Simulated(e) => e.fail_queue_pair(),
        }
    }

    fn move_to(&mut self, port: &Arc<OpenPort<TestDevice>>, role: Role) -> Result<(), VerbsError> {
        match self {
            Self::Device(e) => e.move_to(port, role),
            Self::Simulated(e) => e.move_to(port, role),
        }
    }
}

impl Nic for TestEndpoint {
    fn max_inline(&self) -> usize {
        match self {
            Self::Device(e) => e.max_inline(),
            Self::Simulated(e) => e.max_inline(),
        }
    }

    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        match self {
            Self::Device(e) => e.post_send(chain),
            Self::Simulated(e) => e.post_send(chain),
        }
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        match self {
            Self::Device(e) => e.post_recv(wr_id),
            Self::Simulated(e) => e.post_recv(wr_id),
        }
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        match self {
            Self::Device(e) => e.poll(out),
            Self::Simulated(e) => e.poll(out),
        }
    }

    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        match self {
            Self::Device(e) => e.read_inbound(offset, out),
            Self::Simulated(e) => e.read_inbound(offset, out),
        }
    }

    // The library's reads on a verbs device (one bounds check); on the simulated port, the
    // provided two reads (the simulation may land a write between them).
    fn read_inbound_stamped<const N: usize>(&self, offset: usize) -> (u32, [u8; N]) {
        match self {
            Self::Device(e) => e.read_inbound_stamped(offset),
            Self::Simulated(e) => e.read_inbound_stamped(offset),
        }
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        match self {
            Self::Device(e) => e.deliver_inbound(offset, len, dst),
            Self::Simulated(e) => e.deliver_inbound(offset, len, dst),
        }
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Self::Device(e) => e.write_staging(offset, bytes),
            Self::Simulated(e) => e.write_staging(offset, bytes),
        }
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Self::Device(e) => e.write_inbound(offset, bytes),
            Self::Simulated(e) => e.write_inbound(offset, bytes),
        }
    }
}
