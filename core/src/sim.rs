//! A simulated RDMA fabric for tests, the fuzzer and the benches (feature `sim`).
//!
//! Endpoints own a simple address space ([`Fabric::alloc`] hands out zeroed buffers at
//! increasing addresses) and memory regions with local and remote keys. [`Fabric::connect`]
//! creates a connected pair of reliable-connected queue pairs, each with its own completion queue,
//! inbound control region and staging region; each end is a [`SimNic`] implementing [`Nic`].
//!
//! Devices: an endpoint may have several devices (protection domains, numbered from 0; a fused
//! NIC's members). A registration ([`Fabric::register_on`]) and a queue pair
//! ([`Fabric::connect_on`]) belong to one; a key works only for queue pairs of its
//! registration's device (a local key on the requester's, a remote key on the responder's),
//! otherwise `LOC_PROT_ERR` / `REM_ACCESS_ERR` as for a bad key. [`Fabric::register`] and
//! [`Fabric::connect`] use device 0; [`Fabric::key_on`] maps a key to the same memory's key on
//! another device.
//!
//! Execution is step-driven: posting only queues a work request; [`Fabric::step`] executes the
//! oldest queued one (of any queue pair) and [`Fabric::run_until_idle`] runs them all, so tests can
//! interleave calls and delivery as they like.
//!
//! RC semantics: in order per queue pair; data is in memory before the write-with-immediate's
//! receive completion is queued; every write-with-immediate consumes one posted receive (none
//! posted: the requester fails with `RNR_RETRY_EXC_ERR`); successful send completions only for
//! signaled work requests, failed ones for every work request.
//!
//! Faults: [`Fabric::fault_qp_error`] (every outstanding work request of both queues is flushed
//! with `WR_FLUSH_ERR`); a bad rkey or out-of-bounds remote write fails the requester with
//! `REM_ACCESS_ERR` and puts the responder queue pair into error too; a bad lkey fails with
//! `LOC_PROT_ERR`; [`Fabric::vanish`] makes an endpoint disappear (requests towards it fail with
//! `RETRY_EXC_ERR`, nothing more is delivered to or from it); [`Fabric::cut_port`] kills one
//! queue pair's port for good (every work request between it and its peer fails with
//! `RETRY_EXC_ERR`), [`Fabric::cut_port_acks_lost`] also loses the acknowledgements of its writes
//! whose completions were not polled, and [`Fabric::reconnect`] replaces a queue-pair pair with a
//! fresh one sharing its control regions (port failover, [`crate::data::failover`]);
//! [`Fabric::reconnect_on`] (or [`Fabric::successor`] per end, then [`Fabric::join`]) puts a
//! side on another device, its control regions registered there anew.
//!
//! Links: [`Fabric::link_down`] takes an endpoint's port down (a `PORT_ERR` event on it, see
//! [`Fabric::take_event`]) and [`Fabric::link_up`] brings it back (`PORT_ACTIVE`). While either
//! end's link is down, work requests between them wait in their send queue as RC retransmission
//! would keep them; one that has waited the retry budget ([`Fabric::set_retry_budget`], default
//! [`rc_retry_budget`]`(20, 7)` ≈ 34 s) on the fabric's clock ([`Fabric::advance`]) fails with
//! `RETRY_EXC_ERR` and puts its queue pair into error. Queue pairs with nothing to send are not
//! touched.
//!
//! The simulator checks what the core posts and **panics** on any breach of what the core
//! promises: an inline payload longer than `max_inline`, a staged range outside the staging
//! region, a send or receive queue posted beyond its depth, a completion queue overrun, an inbound
//! read outside the region.

mod drive;
mod failover_multi_pair;
mod failover_pair;
mod multi_pair;
mod pair;
pub mod suite;

pub use drive::{irecv_direct, isend_direct, isend_direct_host, read_head};
pub use failover_multi_pair::MultiFailoverPair;
pub use failover_pair::{FailoverPair, KeyFault, Outcome, Stream, Tamper};
pub use multi_pair::MultiPair;
pub use pair::DataPair;

#[cfg(test)]
mod eager_tests;
#[cfg(test)]
mod failover_multi_tests;
#[cfg(test)]
mod failover_tests;
#[cfg(test)]
mod flap_tests;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::vec::Vec;

use crate::event::{DeviceEvent, rc_retry_budget};
use crate::nic::{
    Completion, CompletionKind, MAX_WR_BYTES, Nic, NicError, Payload, RemoteRegion, SendOp, SendWr,
    WcStatus,
};
use crate::time::{Duration, Instant};

/// Largest `max_inline` the simulator supports.
pub const SIM_MAX_INLINE: usize = 256;

/// Index of an endpoint of a [`Fabric`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointId(usize);

/// A registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// The device (protection domain) of the endpoint it is registered on: its keys work only
    /// for queue pairs of that device.
    pub device: u8,
}

/// Geometry of one end of a connected queue-pair pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Largest inline payload (at most [`SIM_MAX_INLINE`]).
    pub max_inline: usize,
    /// Send-queue depth.
    pub sq_depth: usize,
    /// Receive-queue depth.
    pub rq_depth: usize,
    /// Completion-queue depth.
    pub cq_depth: usize,
    /// Bytes of the inbound control region.
    pub inbound_len: usize,
    /// Bytes of the outbound staging region.
    pub staging_len: usize,
}

/// The simulated fabric. Cheap to clone: clones share the same state.
#[derive(Clone, Debug, Default)]
pub struct Fabric {
    inner: Rc<RefCell<Inner>>,
}

/// One end of a connected pair: a queue pair, its completion queue and its control regions.
#[derive(Clone, Debug)]
pub struct SimNic {
    inner: Rc<RefCell<Inner>>,
    qp: usize,
}

#[derive(Debug, Default)]
struct Inner {
    endpoints: Vec<Endpoint>,
    qps: Vec<Qp>,
    /// Queue pair of every queued send work request, in post order.
    order: VecDeque<usize>,
    next_key: u32,
    /// Reused gather buffer, so executing a work request does not allocate.
    scratch: Vec<u8>,
    /// Place each RDMA write in two steps, second half first (see [`Fabric::set_split_placement`]).
    split_placement: bool,
    /// The fabric's clock (see [`Fabric::advance`]).
    now: Instant,
    /// How long a work request may wait for a link before it fails (`None`: forever).
    retry_budget: Option<Duration>,
}

#[derive(Debug)]
struct Endpoint {
    allocs: Vec<Alloc>,
    next_addr: u64,
    mrs: Vec<MemoryRegion>,
    alive: bool,
    /// Whether the endpoint's port link is up.
    link_up: bool,
    /// Asynchronous events not taken yet.
    events: VecDeque<DeviceEvent>,
}

#[derive(Debug)]
struct Alloc {
    addr: u64,
    bytes: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Ready,
    Error,
}

/// [`Qp::peer`] of a queue pair not connected yet ([`Fabric::successor`]).
const NO_PEER: usize = usize::MAX;

#[derive(Debug)]
struct Qp {
    endpoint: usize,
    /// The device (protection domain) it belongs to: the keys of its work requests (local keys
    /// here, remote keys at its peer's) must be of registrations on its device.
    device: u8,
    /// The connected queue pair ([`NO_PEER`]: not connected yet).
    peer: usize,
    state: QpState,
    config: QpConfig,
    sq: VecDeque<PendingWr>,
    /// Send work requests ever posted; the position of the last one.
    sq_posted: u64,
    /// Position up to which the send queue is free again (advanced by polled completions).
    sq_retired: u64,
    rq: VecDeque<u64>,
    cq: VecDeque<(Completion, u64)>,
    inbound: MemoryRegion,
    staging: MemoryRegion,
    /// Since when the front work request has been waiting for a link that is down.
    blocked_since: Option<Instant>,
    /// Its port died for good ([`Fabric::cut_port`]).
    dead: bool,
}

impl Qp {
    /// A queue pair of endpoint `ep` on `device`, ready, with empty queues and the control
    /// regions `(inbound, staging)`, talking to `peer`.
    fn ready(
        ep: usize,
        device: u8,
        peer: usize,
        config: QpConfig,
        (inbound, staging): (MemoryRegion, MemoryRegion),
    ) -> Self {
        Self {
            endpoint: ep,
            device,
            peer,
            state: QpState::Ready,
            config,
            sq: VecDeque::new(),
            sq_posted: 0,
            sq_retired: 0,
            rq: VecDeque::new(),
            cq: VecDeque::new(),
            inbound,
            staging,
            blocked_since: None,
            dead: false,
        }
    }
}

#[derive(Debug)]
struct PendingWr {
    wr_id: u64,
    op: SendOp,
    data: WrData,
    remote_addr: u64,
    rkey: u32,
    signaled: bool,
    position: u64,
    /// With split placement: the second half of the payload is already in the peer's memory.
    tail_placed: bool,
}

// Inline bytes are kept in place rather than boxed: no allocation per post, like a real WQE.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum WrData {
    Empty,
    Inline([u8; SIM_MAX_INLINE], usize),
    Local { addr: u64, len: u32, lkey: u32 },
    Staged { offset: u32, len: u32 },
}

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Self {
        let fabric = Self::default();
        fabric.inner.borrow_mut().retry_budget = rc_retry_budget(20, 7);
        fabric
    }

    /// Add an endpoint with an empty address space.
    pub fn endpoint(&self) -> EndpointId {
        let mut inner = self.inner.borrow_mut();
        let id = inner.endpoints.len();
        inner.endpoints.push(Endpoint {
            allocs: Vec::new(),
            // Different bases per endpoint so an address of one is garbage at the other.
            next_addr: 0x1_0000_0000 * (id as u64 + 1),
            mrs: Vec::new(),
            alive: true,
            link_up: true,
            events: VecDeque::new(),
        });
        EndpointId(id)
    }

    /// Allocate `len` zeroed bytes in `ep`'s address space; returns the address (64-byte aligned).
    pub fn alloc(&self, ep: EndpointId, len: usize) -> u64 {
        self.inner.borrow_mut().alloc(ep.0, len)
    }

    /// Register `addr..addr+len` (inside one allocation) of `ep` on its device 0.
    pub fn register(&self, ep: EndpointId, addr: u64, len: u64) -> MemoryRegion {
        self.register_on(ep, addr, len, 0)
    }

    /// Register `addr..addr+len` (inside one allocation) of `ep` on its device `device` (a
    /// protection domain of its own: the keys work only for that device's queue pairs). The
    /// same memory may be registered on several devices, each with its own keys.
    pub fn register_on(&self, ep: EndpointId, addr: u64, len: u64, device: u8) -> MemoryRegion {
        self.inner.borrow_mut().register(ep.0, addr, len, device)
    }

    /// The key of `ep`'s registration on `device` of exactly the memory that `key` (a local or
    /// a remote key of `ep`, of any device) names, of the same kind; `None` when that memory is
    /// not registered there (or `key` names nothing). What a driver that moves a queue pair to
    /// another device maps its keys with.
    pub fn key_on(&self, ep: EndpointId, key: u32, device: u8) -> Option<u32> {
        let inner = self.inner.borrow();
        let mrs = &inner.endpoints[ep.0].mrs;
        let (mr, remote) = mrs.iter().find_map(|mr| {
            (mr.lkey == key)
                .then_some((mr, false))
                .or((mr.rkey == key).then_some((mr, true)))
        })?;
        let there = mrs
            .iter()
            .find(|m| m.device == device && m.addr == mr.addr && m.len == mr.len)?;
        Some(if remote { there.rkey } else { there.lkey })
    }

    /// As [`key_on`](Self::key_on), for a key of a registration on device `from` only (`None`
    /// for another device's key): what the plugin's driver can map when a lane moves from `from`
    /// to `to` (it looks the key up among `from`'s registrations), so a key the lane's journal
    /// kept from an earlier device is not silently mapped.
    pub fn key_moved(&self, ep: EndpointId, key: u32, from: u8, to: u8) -> Option<u32> {
        let on_from = {
            let inner = self.inner.borrow();
            inner.endpoints[ep.0]
                .mrs
                .iter()
                .any(|mr| mr.device == from && (mr.lkey == key || mr.rkey == key))
        };
        if on_from {
            self.key_on(ep, key, to)
        } else {
            None
        }
    }

    /// Allocate and register `len` bytes.
    pub fn alloc_registered(&self, ep: EndpointId, len: usize) -> MemoryRegion {
        let addr = self.alloc(ep, len);
        self.register(ep, addr, len as u64)
    }

    /// Deregister the region named by `key` (its local or its remote key): both keys stop
    /// working.
    pub fn deregister(&self, ep: EndpointId, key: u32) {
        let mut inner = self.inner.borrow_mut();
        inner.endpoints[ep.0]
            .mrs
            .retain(|mr| mr.lkey != key && mr.rkey != key);
    }

    /// Copy `bytes` into `ep`'s memory at `addr` (panics outside an allocation).
    pub fn write(&self, ep: EndpointId, addr: u64, bytes: &[u8]) {
        let mut inner = self.inner.borrow_mut();
        let dst = inner.endpoints[ep.0]
            .slice_mut(addr, bytes.len())
            .expect("sim: write outside any allocation");
        dst.copy_from_slice(bytes);
    }

    /// Read `len` bytes of `ep`'s memory at `addr` (panics outside an allocation).
    pub fn read(&self, ep: EndpointId, addr: u64, len: usize) -> Vec<u8> {
        let inner = self.inner.borrow();
        inner.endpoints[ep.0]
            .slice(addr, len)
            .expect("sim: read outside any allocation")
            .to_vec()
    }

    /// Connect a queue pair on `a` with one on `b`, both on device 0. Each gets its own
    /// completion queue and control regions (allocated and registered in its endpoint).
    pub fn connect(
        &self,
        a: EndpointId,
        a_config: QpConfig,
        b: EndpointId,
        b_config: QpConfig,
    ) -> (SimNic, SimNic) {
        self.connect_on((a, 0), a_config, (b, 0), b_config)
    }

    /// [`connect`](Self::connect) a queue pair of `a`'s device `a.1` with one of `b`'s device
    /// `b.1` (their control regions registered on their devices).
    pub fn connect_on(
        &self,
        (a, a_device): (EndpointId, u8),
        a_config: QpConfig,
        (b, b_device): (EndpointId, u8),
        b_config: QpConfig,
    ) -> (SimNic, SimNic) {
        assert!(a_config.max_inline <= SIM_MAX_INLINE && b_config.max_inline <= SIM_MAX_INLINE);
        let mut inner = self.inner.borrow_mut();
        let qa = inner.qps.len();
        let qb = qa + 1;
        for (ep, device, peer, config) in
            [(a.0, a_device, qb, a_config), (b.0, b_device, qa, b_config)]
        {
            let inbound_addr = inner.alloc(ep, config.inbound_len);
            let inbound = inner.register(ep, inbound_addr, config.inbound_len as u64, device);
            let staging_addr = inner.alloc(ep, config.staging_len);
            let staging = inner.register(ep, staging_addr, config.staging_len as u64, device);
            inner
                .qps
                .push(Qp::ready(ep, device, peer, config, (inbound, staging)));
        }
        (
            SimNic {
                inner: self.inner.clone(),
                qp: qa,
            },
            SimNic {
                inner: self.inner.clone(),
                qp: qb,
            },
        )
    }

    /// Execute the oldest queued send work request. Returns false when none is queued.
    pub fn step(&self) -> bool {
        let mut inner = self.inner.borrow_mut();
        if inner.expire_blocked() {
            return true;
        }
        let mut i = 0;
        while i < inner.order.len() {
            let qp = inner.order[i];
            if inner.qps[qp].sq.is_empty() {
                // Its work request was flushed.
                inner.order.remove(i);
                continue;
            }
            if inner.path_down(qp) {
                // Retransmitted until the link comes back or the retry budget runs out.
                let now = inner.now;
                inner.qps[qp].blocked_since.get_or_insert(now);
                i += 1;
                continue;
            }
            inner.order.remove(i);
            if inner.execute_front(qp) {
                return true;
            }
        }
        false
    }

    /// Execute the oldest queued send work request of `nic`'s queue pair only, leaving every
    /// other queue pair's work queued: queue pairs are not ordered against each other, and
    /// this lets a test deliver a later queue pair's messages first. False when none is queued
    /// on it or its path is down.
    pub fn step_qp(&self, nic: &SimNic) -> bool {
        let mut inner = self.inner.borrow_mut();
        let Some(i) = inner.order.iter().position(|&qp| qp == nic.qp) else {
            return false;
        };
        if inner.qps[nic.qp].sq.is_empty() {
            inner.order.remove(i);
            return false;
        }
        if inner.path_down(nic.qp) {
            return false;
        }
        inner.order.remove(i);
        inner.execute_front(nic.qp)
    }

    /// Take `ep`'s port link down: a `PORT_ERR` event on `ep`; traffic between `ep` and its
    /// peers waits (see the module documentation).
    pub fn link_down(&self, ep: EndpointId) {
        let mut inner = self.inner.borrow_mut();
        let endpoint = &mut inner.endpoints[ep.0];
        if endpoint.link_up {
            endpoint.link_up = false;
            endpoint
                .events
                .push_back(DeviceEvent::PortError { port: 1 });
        }
    }

    /// Bring `ep`'s port link back up: a `PORT_ACTIVE` event on `ep`; waiting work requests go.
    pub fn link_up(&self, ep: EndpointId) {
        let mut inner = self.inner.borrow_mut();
        let endpoint = &mut inner.endpoints[ep.0];
        if !endpoint.link_up {
            endpoint.link_up = true;
            endpoint
                .events
                .push_back(DeviceEvent::PortActive { port: 1 });
        }
        for qp in inner.qps.iter_mut() {
            qp.blocked_since = None;
        }
    }

    /// The oldest asynchronous event of `ep`'s device not taken yet.
    pub fn take_event(&self, ep: EndpointId) -> Option<DeviceEvent> {
        self.inner.borrow_mut().endpoints[ep.0].events.pop_front()
    }

    /// Move the fabric's clock forward by `by` (retry budgets run on it).
    pub fn advance(&self, by: Duration) {
        let mut inner = self.inner.borrow_mut();
        inner.now = inner.now + by;
    }

    /// The fabric's clock.
    pub fn now(&self) -> Instant {
        self.inner.borrow().now
    }

    /// How long a work request may wait for a link that is down before it fails with
    /// `RETRY_EXC_ERR` (`None`: forever, the InfiniBand timeout 0).
    pub fn set_retry_budget(&self, budget: Option<Duration>) {
        self.inner.borrow_mut().retry_budget = budget;
    }

    /// Place every RDMA write of two or more bytes in two steps: the second half of the payload
    /// first, then (on the next step of that queue pair) all of it, followed by its completions.
    ///
    /// RDMA gives no ordering of bytes *within* one write: a NIC (or Soft-RoCE's kernel copy) may
    /// make a later byte visible before an earlier one, and a reader polling the target memory
    /// sees the mix. This mode makes that visible to tests, e.g. a fresh stamp at the end of a
    /// clear-to-send entry next to stale fields.
    pub fn set_split_placement(&self, on: bool) {
        self.inner.borrow_mut().split_placement = on;
    }

    /// Execute queued work requests until none is left; returns how many ran.
    pub fn run_until_idle(&self) -> usize {
        let mut ran = 0;
        while self.step() {
            ran += 1;
        }
        ran
    }

    /// Send work requests queued and not executed yet (all queue pairs).
    pub fn pending(&self) -> usize {
        self.inner.borrow().qps.iter().map(|qp| qp.sq.len()).sum()
    }

    /// Move `nic`'s queue pair into the error state: every outstanding work request of both its
    /// queues is flushed with `WR_FLUSH_ERR`.
    pub fn fault_qp_error(&self, nic: &SimNic) {
        self.inner.borrow_mut().set_error(nic.qp);
    }

    /// The port of `nic`'s queue pair dies for good (a cable pulled on one port of a fused
    /// device; the endpoint's other queue pairs, on other ports, are untouched): from now on
    /// every work request between it and its peer, either way, fails with `RETRY_EXC_ERR` when
    /// it executes, putting its queue pair into error. A queue pair with nothing to send learns
    /// nothing (as on a real port: the driver moves it to error with [`Fabric::fault_qp_error`]).
    pub fn cut_port(&self, nic: &SimNic) {
        self.inner.borrow_mut().qps[nic.qp].dead = true;
    }

    /// [`cut_port`](Self::cut_port), and the acknowledgements of the writes `nic`'s queue pair
    /// executed but whose completions were not polled yet never came back: the first of them
    /// fails with `RETRY_EXC_ERR` instead, every later one (and everything queued) is flushed,
    /// and the queue pair is in error. The writes themselves did land at the peer.
    pub fn cut_port_acks_lost(&self, nic: &SimNic) {
        let mut inner = self.inner.borrow_mut();
        inner.qps[nic.qp].dead = true;
        let mut first = true;
        let mut lost = false;
        for (c, _) in inner.qps[nic.qp].cq.iter_mut() {
            if c.kind == CompletionKind::Send && c.status.is_success() {
                c.status = if first {
                    WcStatus::RETRY_EXC_ERR
                } else {
                    WcStatus::WR_FLUSH_ERR
                };
                c.vendor_err = 0x80 | c.status.0;
                first = false;
                lost = true;
            } else if !first {
                c.status = WcStatus::WR_FLUSH_ERR;
            }
        }
        if lost {
            inner.set_error(nic.qp);
        }
    }

    /// A fresh connected queue-pair pair replacing `a` and `b` (on surviving ports of the same
    /// devices): the same endpoints, configuration and control regions (the same registrations,
    /// as queue pairs of one protection domain share them), empty queues.
    pub fn reconnect(&self, a: &SimNic, b: &SimNic) -> (SimNic, SimNic) {
        self.reconnect_on(a, a.device(), b, b.device())
    }

    /// [`reconnect`](Self::reconnect) with `a`'s new queue pair on device `a_device` and `b`'s
    /// on `b_device`: a side whose device changes has its control regions (the same memory)
    /// registered on its new device, with new keys ([`SimNic::inbound_region`] of the new
    /// queue pair says its new remote key).
    pub fn reconnect_on(
        &self,
        a: &SimNic,
        a_device: u8,
        b: &SimNic,
        b_device: u8,
    ) -> (SimNic, SimNic) {
        let (a, b) = (self.successor(a, a_device), self.successor(b, b_device));
        self.join(&a, &b);
        (a, b)
    }

    /// A fresh queue pair replacing `old`, on `device`, not connected yet ([`join`](Self::join)
    /// connects it; until then a send posted on it panics): the same endpoint, configuration
    /// and control regions (the same memory), empty queues. On `old`'s device the control
    /// regions' registrations are shared; on another device (another protection domain) they
    /// are registered there, with new keys. What a driver does on port failover, each end
    /// creating its queue pair before it knows the peer's.
    pub fn successor(&self, old: &SimNic, device: u8) -> SimNic {
        let mut inner = self.inner.borrow_mut();
        let q = &inner.qps[old.qp];
        let (ep, old_device, config) = (q.endpoint, q.device, q.config);
        let (mut inbound, mut staging) = (q.inbound, q.staging);
        if device != old_device {
            inbound = inner.register(ep, inbound.addr, inbound.len, device);
            staging = inner.register(ep, staging.addr, staging.len, device);
        }
        let qp = inner.qps.len();
        inner
            .qps
            .push(Qp::ready(ep, device, NO_PEER, config, (inbound, staging)));
        SimNic {
            inner: self.inner.clone(),
            qp,
        }
    }

    /// Connect two fresh queue pairs ([`successor`](Self::successor)) to each other. Panics
    /// when either is connected already.
    pub fn join(&self, a: &SimNic, b: &SimNic) {
        let mut inner = self.inner.borrow_mut();
        assert!(
            inner.qps[a.qp].peer == NO_PEER && inner.qps[b.qp].peer == NO_PEER && a.qp != b.qp,
            "sim: join of a queue pair connected already"
        );
        inner.qps[a.qp].peer = b.qp;
        inner.qps[b.qp].peer = a.qp;
    }

    /// Make endpoint `ep` vanish: its queue pairs stop executing and answering.
    pub fn vanish(&self, ep: EndpointId) {
        let mut inner = self.inner.borrow_mut();
        inner.endpoints[ep.0].alive = false;
        for qp in inner.qps.iter_mut().filter(|qp| qp.endpoint == ep.0) {
            qp.sq.clear();
            qp.rq.clear();
        }
    }
}

impl SimNic {
    /// The device (protection domain) of the queue pair.
    pub fn device(&self) -> u8 {
        self.inner.borrow().qps[self.qp].device
    }

    /// Whether the queue pair is connected to a peer (a [`Fabric::successor`] is not until
    /// [`Fabric::join`]).
    pub fn is_connected(&self) -> bool {
        self.inner.borrow().qps[self.qp].peer != NO_PEER
    }

    /// The inbound control region as the peer sees it.
    pub fn inbound_region(&self) -> RemoteRegion {
        let inner = self.inner.borrow();
        let mr = inner.qps[self.qp].inbound;
        RemoteRegion {
            addr: mr.addr,
            rkey: mr.rkey,
            len: mr.len as u32,
        }
    }

    /// Completions queued and not polled yet.
    pub fn cq_len(&self) -> usize {
        self.inner.borrow().qps[self.qp].cq.len()
    }

    /// Receive work requests posted and not consumed.
    pub fn rq_len(&self) -> usize {
        self.inner.borrow().qps[self.qp].rq.len()
    }

    /// Send work requests occupying the send queue (posted, not yet freed by a polled completion).
    pub fn sq_occupancy(&self) -> usize {
        let inner = self.inner.borrow();
        let qp = &inner.qps[self.qp];
        (qp.sq_posted - qp.sq_retired) as usize
    }

    /// True when the queue pair is in the error state.
    pub fn is_error(&self) -> bool {
        self.inner.borrow().qps[self.qp].state == QpState::Error
    }

    /// The queue pair's number (unique on the fabric).
    pub fn qp_num(&self) -> u32 {
        self.qp as u32
    }

    /// The completion queue's handle, as a `CQ_ERR` event would name it (each queue pair has its
    /// own completion queue).
    pub fn cq_handle(&self) -> u64 {
        0xc0_0000 + self.qp as u64
    }
}

impl Nic for SimNic {
    fn max_inline(&self) -> usize {
        self.inner.borrow().qps[self.qp].config.max_inline
    }

    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        let qp = &mut inner.qps[self.qp];
        if !inner.endpoints[qp.endpoint].alive {
            return Err(NicError::Post { errno: 5 });
        }
        assert!(
            qp.peer != NO_PEER || qp.state == QpState::Error,
            "sim: send posted on a queue pair not connected yet"
        );
        let occupied = (qp.sq_posted - qp.sq_retired) as usize;
        assert!(
            occupied + chain.len() <= qp.config.sq_depth,
            "sim: send queue overrun: {occupied} occupied + {} posted > depth {}",
            chain.len(),
            qp.config.sq_depth
        );
        for wr in chain {
            let data = match wr.payload {
                Payload::Empty => WrData::Empty,
                Payload::Inline(bytes) => {
                    assert!(
                        bytes.len() <= qp.config.max_inline,
                        "sim: inline payload of {} bytes exceeds max_inline {}",
                        bytes.len(),
                        qp.config.max_inline
                    );
                    let mut copy = [0u8; SIM_MAX_INLINE];
                    copy[..bytes.len()].copy_from_slice(bytes);
                    WrData::Inline(copy, bytes.len())
                }
                Payload::Local(sge) => {
                    assert!(sge.len <= MAX_WR_BYTES, "sim: SGE longer than MAX_WR_BYTES");
                    WrData::Local {
                        addr: sge.addr,
                        len: sge.len,
                        lkey: sge.lkey,
                    }
                }
                Payload::Staged { offset, len } => {
                    assert!(
                        offset as u64 + len as u64 <= qp.staging.len,
                        "sim: staged range {offset}+{len} outside the staging region"
                    );
                    WrData::Staged { offset, len }
                }
            };
            qp.sq_posted += 1;
            qp.sq.push_back(PendingWr {
                wr_id: wr.wr_id,
                op: wr.op,
                data,
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                signaled: wr.signaled,
                position: qp.sq_posted,
                tail_placed: false,
            });
            inner.order.push_back(self.qp);
        }
        if qp.state == QpState::Error {
            inner.flush(self.qp);
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        let mut inner = self.inner.borrow_mut();
        let qp = &mut inner.qps[self.qp];
        assert!(
            qp.rq.len() < qp.config.rq_depth,
            "sim: receive queue overrun (depth {})",
            qp.config.rq_depth
        );
        qp.rq.push_back(wr_id);
        if qp.state == QpState::Error {
            inner.flush(self.qp);
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        let mut inner = self.inner.borrow_mut();
        let qp = &mut inner.qps[self.qp];
        let mut got = 0;
        while got < out.len() {
            let Some((c, position)) = qp.cq.pop_front() else {
                break;
            };
            if position > qp.sq_retired {
                qp.sq_retired = position;
            }
            out[got] = c;
            got += 1;
        }
        Ok(got)
    }

    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        let inner = self.inner.borrow();
        let qp = &inner.qps[self.qp];
        assert!(
            offset + out.len() <= qp.inbound.len as usize,
            "sim: inbound read {offset}+{} outside the region",
            out.len()
        );
        let src = inner.endpoints[qp.endpoint]
            .slice(qp.inbound.addr + offset as u64, out.len())
            .expect("sim: inbound region not allocated");
        out.copy_from_slice(src);
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        let mut inner = self.inner.borrow_mut();
        let staging = inner.qps[self.qp].staging;
        let ep = inner.qps[self.qp].endpoint;
        assert!(
            offset + bytes.len() <= staging.len as usize,
            "sim: staging write {offset}+{} outside the region",
            bytes.len()
        );
        let dst = inner.endpoints[ep]
            .slice_mut(staging.addr + offset as u64, bytes.len())
            .expect("sim: staging region not allocated");
        dst.copy_from_slice(bytes);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        let mut inner = self.inner.borrow_mut();
        let inbound = inner.qps[self.qp].inbound;
        let ep = inner.qps[self.qp].endpoint;
        if offset + bytes.len() > inbound.len as usize {
            return;
        }
        let dst = inner.endpoints[ep]
            .slice_mut(inbound.addr + offset as u64, bytes.len())
            .expect("sim: inbound region not allocated");
        dst.copy_from_slice(bytes);
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        let mut inner = self.inner.borrow_mut();
        let inbound = inner.qps[self.qp].inbound;
        let ep = inner.qps[self.qp].endpoint;
        assert!(
            offset + len <= inbound.len as usize,
            "sim: inbound copy {offset}+{len} outside the region"
        );
        let bytes = inner.endpoints[ep]
            .slice(inbound.addr + offset as u64, len)
            .expect("sim: inbound region not allocated")
            .to_vec();
        let out = inner.endpoints[ep]
            .slice_mut(dst, len)
            .expect("sim: eager copy into memory that was never allocated");
        out.copy_from_slice(&bytes);
    }
}

impl Endpoint {
    fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let alloc = self
            .allocs
            .iter()
            .find(|a| addr >= a.addr && addr - a.addr <= a.bytes.len() as u64)?;
        let start = (addr - alloc.addr) as usize;
        alloc.bytes.get(start..start.checked_add(len)?)
    }

    fn slice_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let alloc = self
            .allocs
            .iter_mut()
            .find(|a| addr >= a.addr && addr - a.addr <= a.bytes.len() as u64)?;
        let start = (addr - alloc.addr) as usize;
        alloc.bytes.get_mut(start..start.checked_add(len)?)
    }

    /// The region `key` names (as lkey or rkey) if it is registered on `device` and covers
    /// `addr..addr+len`.
    fn check(&self, addr: u64, len: u64, key: u32, remote: bool, device: u8) -> bool {
        self.mrs.iter().any(|mr| {
            let k = if remote { mr.rkey } else { mr.lkey };
            k == key
                && mr.device == device
                && addr >= mr.addr
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= mr.addr + mr.len)
        })
    }
}

impl Inner {
    fn alloc(&mut self, ep: usize, len: usize) -> u64 {
        let endpoint = &mut self.endpoints[ep];
        let addr = endpoint.next_addr;
        // Leave a gap so out-of-bounds writes do not land in a neighbour.
        endpoint.next_addr += (len as u64).div_ceil(64) * 64 + 4096;
        endpoint.allocs.push(Alloc {
            addr,
            bytes: std::vec![0; len],
        });
        addr
    }

    fn register(&mut self, ep: usize, addr: u64, len: u64, device: u8) -> MemoryRegion {
        assert!(
            self.endpoints[ep].slice(addr, len as usize).is_some(),
            "sim: registering memory that is not allocated"
        );
        self.next_key += 1;
        let mr = MemoryRegion {
            addr,
            len,
            lkey: 0x1000 + self.next_key,
            rkey: 0x8000_0000 | (self.next_key * 7919),
            device,
        };
        self.endpoints[ep].mrs.push(mr);
        mr
    }

    fn push_cqe(&mut self, qp: usize, c: Completion, position: u64) {
        let q = &mut self.qps[qp];
        assert!(
            q.cq.len() < q.config.cq_depth,
            "sim: completion queue overrun (depth {})",
            q.config.cq_depth
        );
        q.cq.push_back((c, position));
    }

    /// Whether the link between `qp`'s endpoint and its peer's is down.
    fn path_down(&self, qp: usize) -> bool {
        let peer = self.qps[qp].peer;
        !self.endpoints[self.qps[qp].endpoint].link_up
            || self
                .qps
                .get(peer)
                .is_some_and(|p| !self.endpoints[p.endpoint].link_up)
    }

    /// Fail the front work request of the first queue pair that has waited for a link longer
    /// than the retry budget; true when one failed.
    fn expire_blocked(&mut self) -> bool {
        let Some(budget) = self.retry_budget else {
            return false;
        };
        let now = self.now;
        let expired = self.qps.iter().position(|q| {
            !q.sq.is_empty()
                && q.blocked_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= budget)
        });
        let Some(qp) = expired else {
            return false;
        };
        self.qps[qp].blocked_since = None;
        let wr = self.qps[qp].sq.pop_front().expect("checked non-empty");
        self.fail_front(qp, wr, WcStatus::RETRY_EXC_ERR);
        true
    }

    /// Put `qp` into error and flush both its queues.
    fn set_error(&mut self, qp: usize) {
        self.qps[qp].state = QpState::Error;
        self.flush(qp);
    }

    fn flush(&mut self, qp: usize) {
        while let Some(wr) = self.qps[qp].sq.pop_front() {
            let c = Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WR_FLUSH_ERR,
                vendor_err: 0xf5,
                kind: CompletionKind::Send,
            };
            self.push_cqe(qp, c, wr.position);
        }
        while let Some(wr_id) = self.qps[qp].rq.pop_front() {
            let c = Completion {
                wr_id,
                status: WcStatus::WR_FLUSH_ERR,
                vendor_err: 0xf5,
                kind: CompletionKind::RecvFailed,
            };
            self.push_cqe(qp, c, 0);
        }
    }

    /// Fail the front work request of `qp` with `status` and put the queue pair into error.
    fn fail_front(&mut self, qp: usize, wr: PendingWr, status: WcStatus) {
        let c = Completion {
            wr_id: wr.wr_id,
            status,
            vendor_err: 0x80 | status.0,
            kind: CompletionKind::Send,
        };
        self.push_cqe(qp, c, wr.position);
        self.set_error(qp);
    }

    /// Execute the front work request of `qp`; false when there is none.
    fn execute_front(&mut self, qp: usize) -> bool {
        let q = &self.qps[qp];
        if !self.endpoints[q.endpoint].alive {
            return false;
        }
        let Some(wr) = self.qps[qp].sq.pop_front() else {
            return false;
        };
        self.qps[qp].blocked_since = None;
        let (ep, peer) = (self.qps[qp].endpoint, self.qps[qp].peer);
        let peer_ep = self.qps[peer].endpoint;

        // Gather the payload at execution time, as a NIC's DMA would.
        let mut gathered = [0u8; SIM_MAX_INLINE];
        let mut big = std::mem::take(&mut self.scratch);
        big.clear();
        let bytes: &[u8] = match wr.data {
            WrData::Empty => &[],
            WrData::Inline(ref bytes, len) => {
                gathered[..len].copy_from_slice(&bytes[..len]);
                &gathered[..len]
            }
            WrData::Local { addr, len, lkey } => {
                let device = self.qps[qp].device;
                if !self.endpoints[ep].check(addr, u64::from(len), lkey, false, device) {
                    self.fail_front(qp, wr, WcStatus::LOC_PROT_ERR);
                    return true;
                }
                big.extend_from_slice(
                    self.endpoints[ep]
                        .slice(addr, len as usize)
                        .expect("registered memory is allocated"),
                );
                &big
            }
            WrData::Staged { offset, len } => {
                let staging = self.qps[qp].staging;
                big.extend_from_slice(
                    self.endpoints[ep]
                        .slice(staging.addr + u64::from(offset), len as usize)
                        .expect("staging is allocated"),
                );
                &big
            }
        };

        if !self.endpoints[peer_ep].alive
            || self.qps[peer].state == QpState::Error
            || self.qps[qp].dead
            || self.qps[peer].dead
        {
            // Nobody answers: the transport retries, then gives up.
            self.fail_front(qp, wr, WcStatus::RETRY_EXC_ERR);
            return true;
        }
        let peer_device = self.qps[peer].device;
        if !self.endpoints[peer_ep].check(
            wr.remote_addr,
            bytes.len() as u64,
            wr.rkey,
            true,
            peer_device,
        ) {
            self.fail_front(qp, wr, WcStatus::REM_ACCESS_ERR);
            self.set_error(peer);
            return true;
        }
        if matches!(wr.op, SendOp::WriteImm(_)) && self.qps[peer].rq.is_empty() {
            self.fail_front(qp, wr, WcStatus::RNR_RETRY_EXC_ERR);
            return true;
        }
        let len = bytes.len();
        if self.split_placement && len >= 2 && !wr.tail_placed {
            let half = len / 2;
            let dst = self.endpoints[peer_ep]
                .slice_mut(wr.remote_addr + half as u64, len - half)
                .expect("a registered region is allocated");
            dst.copy_from_slice(&bytes[half..]);
            let mut wr = wr;
            wr.tail_placed = true;
            self.qps[qp].sq.push_front(wr);
            self.order.push_front(qp);
            self.scratch = big;
            return true;
        }
        if len > 0 {
            let dst = self.endpoints[peer_ep]
                .slice_mut(wr.remote_addr, len)
                .expect("a registered region is allocated");
            dst.copy_from_slice(bytes);
        }
        if let SendOp::WriteImm(imm) = wr.op {
            let recv_id = self.qps[peer].rq.pop_front().expect("checked above");
            let c = Completion {
                wr_id: recv_id,
                status: WcStatus::SUCCESS,
                vendor_err: 0,
                kind: CompletionKind::RecvWriteImm {
                    imm,
                    byte_len: len as u32,
                },
            };
            self.push_cqe(peer, c, 0);
        }
        if wr.signaled {
            let c = Completion {
                wr_id: wr.wr_id,
                status: WcStatus::SUCCESS,
                vendor_err: 0,
                kind: CompletionKind::Send,
            };
            self.push_cqe(qp, c, wr.position);
        }
        self.scratch = big;
        true
    }
}
