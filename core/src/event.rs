//! Asynchronous device events and which connections they fail.
//!
//! A device reports events about its ports, queue pairs and completion queues on one channel per
//! opened device. The driver decodes each into a [`DeviceEvent`] and hands it to the device's
//! [`EventBook`], which knows the connections alive on that device; each connection asks the
//! book, from its data path, whether an event failed it ([`EventBook::fatal_error`]).
//!
//! **Policy** ([`DeviceEvent::scope`]):
//!
//! - a queue pair's own fatal event (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`) fails the one
//!   connection of that queue pair;
//! - `CQ_ERR` fails the connections whose queue pair completes into that completion queue;
//! - `DEVICE_FATAL` fails every connection of the device;
//! - port events (`PORT_ERR`, `PORT_ACTIVE`, `GID_CHANGE`, `LID_CHANGE`, …) fail nothing. A link
//!   that goes down and comes back within the reliable-connection retry budget
//!   ([`rc_retry_budget`], ≈ 35 s at NCCL's defaults) costs nothing but retransmissions: the queue
//!   pairs keep their state. A link down for longer fails each queue pair with work outstanding by
//!   retry exhaustion (an error completion), and an idle connection by its out-of-band socket's
//!   keepalive, as NCCL's own IB transport behaves.
//!
//! **Identity.** A queue pair number (and a completion queue handle) is reused once its object is
//! destroyed. Failures are therefore recorded against a registration ([`WatchId`], never reused),
//! not against the number: a connection registers its queue pair and completion queue when it is
//! established and unregisters before they are destroyed, and an event only reaches registrations
//! alive when it is read. A later connection that gets the same queue pair number starts clean.

use alloc::collections::BTreeMap;

use crate::data::DataError;
use crate::nic::NicError;
use crate::time::Duration;

/// An asynchronous event, decoded from the device's event channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceEvent {
    /// `QP_FATAL`: the queue pair hit an error it cannot report in a completion.
    QpFatal {
        /// Queue pair number.
        qp: u32,
    },
    /// `QP_REQ_ERR`: the queue pair's peer sent an invalid request.
    QpRequestError {
        /// Queue pair number.
        qp: u32,
    },
    /// `QP_ACCESS_ERR`: a local access violation on the queue pair.
    QpAccessError {
        /// Queue pair number.
        qp: u32,
    },
    /// `CQ_ERR`: the completion queue overran (or failed otherwise).
    CqError {
        /// The completion queue's handle, as the driver identifies it.
        cq: u64,
    },
    /// `DEVICE_FATAL`: the device failed.
    DeviceFatal,
    /// `PORT_ERR`: a port's link went down.
    PortError {
        /// Port number.
        port: u32,
    },
    /// `PORT_ACTIVE`: a port's link came up.
    PortActive {
        /// Port number.
        port: u32,
    },
    /// Any other event (`GID_CHANGE`, `LID_CHANGE`, `COMM_EST`, `SQ_DRAINED`, …): informational.
    Other,
}

/// The connections an event fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// None: the event is only logged.
    Nothing,
    /// The connection of this queue pair number.
    Qp(u32),
    /// The connections completing into this completion queue.
    Cq(u64),
    /// Every connection of the device.
    Device,
}

impl DeviceEvent {
    /// Which connections this event fails (see the module documentation for why).
    pub fn scope(self) -> Scope {
        match self {
            Self::QpFatal { qp } | Self::QpRequestError { qp } | Self::QpAccessError { qp } => {
                Scope::Qp(qp)
            }
            Self::CqError { cq } => Scope::Cq(cq),
            Self::DeviceFatal => Scope::Device,
            Self::PortError { .. } | Self::PortActive { .. } | Self::Other => Scope::Nothing,
        }
    }
}

/// How long a reliable-connected queue pair keeps retransmitting before its work request fails
/// with retry exhaustion: the local ACK timeout (4.096 µs × 2^`timeout`) for each of the first
/// transmission and `retry_cnt` retries. `None` for `timeout` 0, which the InfiniBand
/// specification defines as an infinite timeout. At NCCL's defaults (20, 7): ≈ 34.4 s.
pub fn rc_retry_budget(timeout: u8, retry_cnt: u8) -> Option<Duration> {
    if timeout == 0 || timeout > 31 {
        return None;
    }
    let ack_timeout_ns = 4096u64 << timeout;
    Some(Duration::from_nanos(
        ack_timeout_ns.saturating_mul(u64::from(retry_cnt) + 1),
    ))
}

/// A connection's registration with an [`EventBook`]: unique for the book's life, so a failure
/// recorded for one connection never reaches a later one with the same queue pair number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatchId(u64);

#[derive(Clone, Copy, Debug)]
struct Watched {
    qp: u32,
    cq: u64,
    failure: Option<&'static str>,
}

/// The connections alive on one device and the events that failed them.
#[derive(Debug, Default)]
pub struct EventBook {
    watched: BTreeMap<WatchId, Watched>,
    next: u64,
    /// Set by an event of [`Scope::Device`]: fails every connection, present and future.
    device_failure: Option<&'static str>,
}

impl EventBook {
    /// A book with no connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a connection whose queue pair number is `qp` and whose completion queue the driver
    /// identifies as `cq`. It starts with no failure (unless the device already failed).
    pub fn watch(&mut self, qp: u32, cq: u64) -> WatchId {
        let id = WatchId(self.next);
        self.next += 1;
        self.watched.insert(
            id,
            Watched {
                qp,
                cq,
                failure: None,
            },
        );
        id
    }

    /// Forget a connection; call it before its queue pair and completion queue are destroyed.
    pub fn unwatch(&mut self, id: WatchId) {
        self.watched.remove(&id);
    }

    /// Connections registered.
    pub fn len(&self) -> usize {
        self.watched.len()
    }

    /// True when no connection is registered.
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Apply `event` (named `name` in errors) to the registered connections; returns how many it
    /// failed now (those already failed keep their first cause).
    pub fn handle(&mut self, event: DeviceEvent, name: &'static str) -> usize {
        let hit = |w: &Watched| match event.scope() {
            Scope::Nothing => false,
            Scope::Qp(qp) => w.qp == qp,
            Scope::Cq(cq) => w.cq == cq,
            Scope::Device => true,
        };
        if event.scope() == Scope::Device {
            self.device_failure.get_or_insert(name);
        }
        let mut failed = 0;
        for w in self.watched.values_mut() {
            if w.failure.is_none() && hit(w) {
                w.failure = Some(name);
                failed += 1;
            }
        }
        failed
    }

    /// The event that failed connection `id`, if one did (a forgotten id has none).
    pub fn failure(&self, id: WatchId) -> Option<&'static str> {
        let watched = self.watched.get(&id)?;
        watched.failure.or(self.device_failure)
    }

    /// The error to fail connection `id` with (through `SendConn::handle_fatal` /
    /// `RecvConn::handle_fatal`), if an event failed it.
    pub fn fatal_error(&self, id: WatchId) -> Option<DataError> {
        self.failure(id)
            .map(|event| DataError::Nic(NicError::Fatal { event }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_events_fail_nothing() {
        let mut book = EventBook::new();
        let a = book.watch(17, 1);
        let b = book.watch(18, 2);
        assert_eq!(
            book.handle(DeviceEvent::PortError { port: 1 }, "port error"),
            0
        );
        assert_eq!(book.handle(DeviceEvent::Other, "GID table change"), 0);
        assert_eq!(
            book.handle(DeviceEvent::PortActive { port: 1 }, "port active"),
            0
        );
        assert_eq!(book.failure(a), None);
        assert_eq!(book.fatal_error(b), None);
    }

    #[test]
    fn qp_events_fail_that_queue_pair_only() {
        for event in [
            DeviceEvent::QpFatal { qp: 18 },
            DeviceEvent::QpRequestError { qp: 18 },
            DeviceEvent::QpAccessError { qp: 18 },
        ] {
            let mut book = EventBook::new();
            let a = book.watch(17, 1);
            let b = book.watch(18, 2);
            assert_eq!(book.handle(event, "qp event"), 1);
            assert_eq!(book.failure(a), None);
            assert_eq!(
                book.fatal_error(b),
                Some(DataError::Nic(NicError::Fatal { event: "qp event" }))
            );
        }
    }

    #[test]
    fn cq_error_fails_the_connections_of_that_cq_only() {
        let mut book = EventBook::new();
        let a = book.watch(17, 0xa000);
        let b = book.watch(18, 0xb000);
        let c = book.watch(19, 0xb000);
        assert_eq!(
            book.handle(DeviceEvent::CqError { cq: 0xb000 }, "CQ error"),
            2
        );
        assert_eq!(book.failure(a), None);
        assert_eq!(book.failure(b), Some("CQ error"));
        assert_eq!(book.failure(c), Some("CQ error"));
    }

    #[test]
    fn device_fatal_fails_all_including_later_connections() {
        let mut book = EventBook::new();
        let a = book.watch(17, 1);
        assert_eq!(book.handle(DeviceEvent::DeviceFatal, "device fatal"), 1);
        let later = book.watch(40, 9);
        assert_eq!(book.failure(a), Some("device fatal"));
        assert_eq!(book.failure(later), Some("device fatal"));
    }

    #[test]
    fn first_cause_is_kept() {
        let mut book = EventBook::new();
        let a = book.watch(17, 1);
        book.handle(DeviceEvent::QpFatal { qp: 17 }, "first");
        assert_eq!(book.handle(DeviceEvent::CqError { cq: 1 }, "second"), 0);
        assert_eq!(book.failure(a), Some("first"));
    }

    #[test]
    fn reused_qp_number_never_inherits_an_old_failure() {
        let mut book = EventBook::new();
        let old = book.watch(17, 0xa000);
        book.handle(DeviceEvent::QpFatal { qp: 17 }, "QP fatal");
        book.handle(DeviceEvent::CqError { cq: 0xa000 }, "CQ error");
        assert_eq!(book.failure(old), Some("QP fatal"));
        book.unwatch(old);
        // The device hands the number and the CQ handle out again.
        let new = book.watch(17, 0xa000);
        assert_ne!(new, old);
        assert_eq!(book.failure(new), None);
        assert_eq!(book.failure(old), None);
        // An event for the new queue pair fails it, and only it.
        let other = book.watch(18, 0xc000);
        book.handle(DeviceEvent::QpFatal { qp: 17 }, "QP fatal again");
        assert_eq!(book.failure(new), Some("QP fatal again"));
        assert_eq!(book.failure(other), None);
        assert_eq!(book.len(), 2);
    }

    #[test]
    fn retry_budget_matches_the_formula() {
        // 4.096 µs × 2^20 × 8 = 34.36 s.
        let budget = rc_retry_budget(20, 7).expect("finite");
        assert_eq!(budget.as_nanos(), 4096 * (1 << 20) * 8);
        assert_eq!(budget.as_millis(), 34_359);
        assert_eq!(rc_retry_budget(1, 0), Some(Duration::from_nanos(8192)));
        assert_eq!(rc_retry_budget(0, 7), None);
        assert_eq!(rc_retry_budget(32, 7), None);
    }
}
