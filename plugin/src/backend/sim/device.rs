//! The device of a port in the unit tests: a verbs device as in the library, or the simulated
//! port's, which has no verbs objects, registers mirrors in the fabric ([`fabric::register`])
//! and raises no asynchronous events.
//!
//! Unsafe (opted in): [`PortDevice::register`] is an `unsafe fn`; a verbs device's registration
//! is passed its caller's promise.

#![allow(unsafe_code)]

use super::fabric::{self, SimMr};
use crate::backend::port_device::{PortDevice, VerbsDevice};
use rivet_verbs_ffi::{AsyncEvent, MemoryRegion, VerbsError};
use std::os::fd::RawFd;

/// A port's device in the unit tests.
#[derive(Debug, Clone)]
pub(crate) enum TestDevice {
    /// A verbs device (tests that open real ports, run in the VM lane).
    Verbs(VerbsDevice),
    /// The simulated port.
    Simulated,
}

impl From<VerbsDevice> for TestDevice {
    fn from(device: VerbsDevice) -> Self {
        Self::Verbs(device)
    }
}

/// A registration with a [`TestDevice`].
#[derive(Debug)]
pub(crate) enum TestRegistration {
    /// A verbs memory region.
    Verbs(MemoryRegion),
    /// A mirror of the memory in the simulated fabric.
    Simulated(SimMr),
}

impl PortDevice for TestDevice {
    type Registration = TestRegistration;

    /// The verbs objects; the simulated endpoint takes over every call on a simulated port that
    /// would need them, so reaching this for one is a bug in a test.
    fn verbs(&self) -> &VerbsDevice {
        match self {
            Self::Verbs(device) => device,
            Self::Simulated => panic!("a simulated port has no verbs objects"),
        }
    }

    /// Register with the device (a mirror in the fabric on the simulated port).
    ///
    /// # Safety
    /// As [`PortDevice::register`]: without `dmabuf`, the memory stays mapped while the
    /// registration lives.
    unsafe fn register(
        &self,
        start: u64,
        size: usize,
        dmabuf: Option<(RawFd, u64)>,
        access: u32,
    ) -> Result<TestRegistration, VerbsError> {
        match self {
            Self::Verbs(device) => {
                // SAFETY: the caller's promise (the memory stays mapped), passed on.
                let mr = unsafe { device.register(start, size, dmabuf, access) }?;
                Ok(TestRegistration::Verbs(mr))
            }
            Self::Simulated => Ok(TestRegistration::Simulated(fabric::register(
                start,
                size as u64,
            ))),
        }
    }

    fn keys(registration: &TestRegistration) -> (u32, u32) {
        match registration {
            TestRegistration::Verbs(mr) => VerbsDevice::keys(mr),
            TestRegistration::Simulated(mr) => mr.keys(),
        }
    }

    fn next_async_event(&self) -> Result<Option<AsyncEvent<'_>>, VerbsError> {
        match self {
            Self::Verbs(device) => device.next_async_event(),
            Self::Simulated => Ok(None),
        }
    }
}
