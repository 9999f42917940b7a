//! A test-only backend: one simulated port whose connections run on `rivet_core::sim`'s fabric,
//! so the exported C entry points can be driven end to end in one process on a machine without
//! RDMA (`abi::export_tests`). Compiled for the plugin's unit tests only; the shipped library has
//! none of it.
//!
//! It plugs in at the backend's one seam: in the unit tests `backend::DataEndpoint` is
//! [`TestEndpoint`], whose ports' device is a [`TestDevice`]; the library's code is generic over
//! both (`ConnEndpoint`, `PortDevice`) and names nothing of this module.
//!
//! Once [`install`]ed (for the rest of the test process), discovery reports one port,
//! [`PORT_NAME`], opening it gives a port on [`TestDevice::Simulated`] ([`open_port`]),
//! connections on it are [`endpoint::SimEndpoint`]s, a registration cache miss on it registers a mirror
//! here ([`fabric::register`]) and the handshake listens on loopback. Everything else (handles,
//! handshake, the registration cache's policy, core state machines, the C shims) is the plugin's
//! own code.
//!
//! The simulator has its own address space, while NCCL's buffers are process memory. A
//! registration (the page range the cache chose) gets a mirror allocation in the fabric,
//! registered there; the plugin's memory keys are the mirror's keys, and work requests naming real
//! addresses under those keys are translated here:
//! - a local payload is copied from the buffer into the mirror when it is posted;
//! - an RDMA write into a buffer is copied from the mirror back into the buffer right after the
//!   fabric executed it (before any completion of it can be polled).
//!
//! The fabric checks every access against the mirror's registration, so a payload outside it, or
//! under a key that was deregistered, fails as on a NIC.
//!
//! An endpoint advertises its inbound region before the fabric pair exists (NCCL exchanges both
//! ends' descriptions first): under a key of its own, which posting translates to the fabric's.
//! A NIC moves data on its own; the fabric is step-driven, so every call of an endpoint (post,
//! poll, reading the inbound region) first runs all queued work requests (`run_until_idle`).
//!
//! Bottom to top: [`fabric`] (the fabric's shared state, registrations' mirrors and the address
//! translation), [`device`] (a port's device: verbs or simulated), [`endpoint`] (a connection's
//! queue pair on the fabric, which lives on an `OpenPort`), then [`either`] (the endpoint type
//! connections drive in the tests).

mod device;
mod either;
mod endpoint;
mod fabric;

pub(crate) use either::TestEndpoint;

use crate::backend::device::{GpuSetup, OpenPort};
use crate::config::Config;
use device::TestDevice;
use rivet_verbs_ffi::discover::PortInfo;
use rivet_verbs_ffi::name_list::NameList;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The simulated port's device name.
pub(crate) const PORT_NAME: &str = "sim0";
/// The simulated port's node GUID.
pub(crate) const PORT_GUID: u64 = 0x5157_0000_0000_0001;

static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Simulated ports discovery reports: `sim0`, `sim1`, … (tests of fused devices ask for more).
static PORTS: AtomicUsize = AtomicUsize::new(1);

/// Whether discovery finds no device at all (a host without RDMA hardware).
static NO_DEVICE: AtomicBool = AtomicBool::new(false);

/// From the next discovery (the next first `init`) on, find no device (`true`) or the simulated
/// ports again (`false`).
pub(crate) fn set_no_device(none: bool) {
    NO_DEVICE.store(none, Ordering::SeqCst);
}

/// Whether discovery is to find no device.
pub(crate) fn no_device() -> bool {
    NO_DEVICE.load(Ordering::SeqCst)
}

/// Report `n` simulated ports from the next discovery (the next first `init`) on.
pub(crate) fn set_ports(n: usize) {
    PORTS.store(n.max(1), Ordering::SeqCst);
}

/// How many simulated ports discovery reports.
pub(crate) fn ports() -> usize {
    PORTS.load(Ordering::SeqCst)
}

/// Open the simulated port `info` describes: host memory only (no GPU memory, no flush queue
/// pair: it would need a verbs context), the simulated endpoint rather than the mlx5 direct path.
pub(crate) fn open_port(info: &PortInfo) -> Arc<OpenPort<TestDevice>> {
    OpenPort::on_device(info, TestDevice::Simulated, GpuSetup::default(), false)
}

/// Use the simulated port from now on (for the rest of the process).
pub(crate) fn install() {
    fabric::create();
    INSTALLED.store(true, Ordering::SeqCst);
}

/// Whether [`install`] was called.
pub(crate) fn installed() -> bool {
    INSTALLED.load(Ordering::SeqCst)
}

/// The settings of an `init` with the simulated port: the handshake listens on loopback only.
pub(crate) fn settle_config(mut config: Config) -> Config {
    if installed() {
        config.interface.ifname = NameList::parse("=lo").ok();
    }
    config
}
