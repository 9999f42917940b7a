//! An opened RDMA port: its device (verbs context and protection domain, or in the unit tests
//! the simulated port's), shared by every comm on it.

use super::mr_cache::MrCache;
use super::port_device::{PortDevice, VerbsDevice};
use crate::log::{INIT_NET, info, warn};
use rivet_core::data::DataError;
use rivet_core::event::{DeviceEvent, EventBook, WatchId, rc_retry_budget};
use rivet_verbs_ffi::discover::PortInfo;
use rivet_verbs_ffi::sys::event_type;
use rivet_verbs_ffi::{Context, DeviceList, ProtectionDomain, VerbsError};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The device events that fail connections, by connection (policy in `rivet_core::event`).
///
/// Events are read from the context's non-blocking async fd by whichever comm checks first (no
/// thread of ours waits on it), acknowledged at once, and recorded in the book against the
/// registrations they concern.
#[derive(Debug, Default)]
struct AsyncState {
    book: EventBook,
}

/// Decode a verbs async event into the core's terms. `cq` is the CQ address of a `CQ_ERR`.
fn decode_event(
    event_type: u32,
    qp: Option<u32>,
    cq: Option<usize>,
    port: Option<u32>,
) -> DeviceEvent {
    match (event_type, qp, cq, port) {
        (event_type::QP_FATAL, Some(qp), _, _) => DeviceEvent::QpFatal { qp },
        (event_type::QP_REQ_ERR, Some(qp), _, _) => DeviceEvent::QpRequestError { qp },
        (event_type::QP_ACCESS_ERR, Some(qp), _, _) => DeviceEvent::QpAccessError { qp },
        (event_type::CQ_ERR, _, Some(cq), _) => DeviceEvent::CqError { cq: cq as u64 },
        (event_type::DEVICE_FATAL, ..) => DeviceEvent::DeviceFatal,
        (event_type::PORT_ERR, _, _, Some(port)) => DeviceEvent::PortError { port },
        (event_type::PORT_ACTIVE, _, _, Some(port)) => DeviceEvent::PortActive { port },
        _ => DeviceEvent::Other,
    }
}

/// The data path a port uses, decided from `RIVET_MLX5_DIRECT` and what libmlx5 says of the device.
///
/// The mlx5 direct path is opt-in: it has not yet been qualified on ConnectX hardware (only on the
/// software model), and a silent defect there would corrupt training data. Only `1` enables it;
/// `rivet selftest` checks it on a site's own devices before they set that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathChoice {
    /// The mlx5 direct path (mlx5 device, `RIVET_MLX5_DIRECT=1`).
    Direct,
    /// libibverbs, with the reason for the log line.
    Verbs(&'static str),
}

/// Decide the data path: `env` is `RIVET_MLX5_DIRECT` (if set), `mlx5` whether libmlx5 recognises the
/// device (`None`: libmlx5 not available).
pub(crate) fn choose_path(env: Option<&str>, mlx5: Option<bool>) -> PathChoice {
    let opted_in = env.is_some_and(|v| v.trim() == "1");
    match mlx5 {
        None => PathChoice::Verbs("libmlx5 not available"),
        Some(false) => PathChoice::Verbs("not an mlx5 device"),
        Some(true) if opted_in => PathChoice::Direct,
        Some(true) => PathChoice::Verbs(
            "mlx5 device; the mlx5 direct path is not yet qualified on hardware: \
             set RIVET_MLX5_DIRECT=1 after `rivet selftest` passes",
        ),
    }
}

/// Whether to use the mlx5 direct path on this device (see [`choose_path`]). Logged once per opened
/// port.
fn direct_path_wanted(context: &Context, info: &PortInfo) -> bool {
    let env = std::env::var("RIVET_MLX5_DIRECT").ok();
    let mlx5 = rivet_verbs_ffi::mlx5::setup::device_supported(context).ok();
    let (direct, path, why) = match choose_path(env.as_deref(), mlx5) {
        PathChoice::Direct => (true, "mlx5 direct", "mlx5 device, RIVET_MLX5_DIRECT=1"),
        PathChoice::Verbs(why) => (false, "libibverbs", why),
    };
    info!(
        INIT_NET,
        "{} port {}: data path {path} ({why})", info.name, info.port
    );
    direct
}

/// `NCCL_IB_TIMEOUT` and `NCCL_IB_RETRY_CNT` (low and high byte) of the `init` in force, for
/// the link-down log line; 0 while the plugin is not initialized (the defaults 20 and 7 apply).
/// Set by `net`, which owns the settings, so the backend need not reach up for them.
static RETRY_SETTINGS: AtomicU16 = AtomicU16::new(0);

/// Record the retry settings of the `init` now in force (`None`: none is).
pub(crate) fn set_retry_settings(settings: Option<(u8, u8)>) {
    let bits = settings.map_or(0, |(timeout, retries)| {
        u16::from_le_bytes([timeout, retries])
    });
    RETRY_SETTINGS.store(bits, Ordering::Relaxed);
}

/// (`NCCL_IB_TIMEOUT`, `NCCL_IB_RETRY_CNT`) in force.
fn retry_settings() -> (u8, u8) {
    match RETRY_SETTINGS.load(Ordering::Relaxed).to_le_bytes() {
        // NCCL_IB_TIMEOUT is 1..=31 once set, so 0 means "not initialized".
        [0, _] => (20, 7),
        [timeout, retries] => (timeout, retries),
    }
}

/// A device some open port uses, found again by the next port of that device to open.
#[derive(Debug)]
struct OpenedDevice {
    name: String,
    pd: Weak<ProtectionDomain>,
    events: Weak<Mutex<AsyncState>>,
}

/// The devices open ports use: the ports of one device share its context, protection domain
/// and asynchronous events, as NCCL's IB transport shares a device's context among its ports. A
/// queue pair can then move to another port of the device (port failover, issue #39) with every
/// key it and its peer hold still valid; and one reader drains the device's one event queue
/// for every port on it.
static OPENED: Mutex<Vec<OpenedDevice>> = Mutex::new(Vec::new());

/// What a port does with GPU memory (decided by `rivet_core::gdr` at discovery).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GpuSetup {
    /// `regMr` takes GPU memory by address (`NCCL_PTR_CUDA` advertised: a peer-memory client).
    pub(crate) cuda: bool,
    /// Registrations ask for PCIe relaxed ordering.
    pub(crate) relaxed_ordering: bool,
    /// Receive comms get a flush queue pair and `iflush` reads back what arrived.
    pub(crate) flush: bool,
}

/// A port opened for use: created on the first comm that needs it, dropped with the last one.
/// `D` is its device: a verbs device in the library (the rest of the plugin names this type
/// through the backend's seam, `backend::OpenPort`).
#[derive(Debug)]
pub(crate) struct OpenPort<D: PortDevice = VerbsDevice> {
    /// What discovery found (name, port number, GID choice, MTU, link layer, …).
    pub(crate) info: PortInfo,
    /// The device: verbs objects, registrations, asynchronous events.
    pub(crate) device: D,
    /// GPU memory handling.
    pub(crate) gpu: GpuSetup,
    /// User-buffer registrations on `device`, shared by every comm on the port (`regIsGlobal`).
    pub(crate) mrs: MrCache<D>,
    /// The device's events, shared by its open ports (one async fd per context).
    events: Arc<Mutex<AsyncState>>,
    /// Whether new connections use the mlx5 direct data path (mlx5 device, opted in with
    /// `RIVET_MLX5_DIRECT=1`, and no set-up failure so far).
    direct: AtomicBool,
}

impl<D: PortDevice> OpenPort<D> {
    /// Open the port `info` names: on the device's context and protection domain when another
    /// port of the same device is open, else on a newly opened context and protection domain.
    pub(crate) fn open(info: &PortInfo, gpu: GpuSetup) -> Result<Arc<Self>, VerbsError> {
        let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
        opened.retain(|d| d.pd.strong_count() > 0 && d.events.strong_count() > 0);
        let shared = opened
            .iter()
            .filter(|d| d.name == info.name)
            .find_map(|d| Some((d.pd.upgrade()?, d.events.upgrade()?)));
        let (pd, events) = match shared {
            Some(shared) => shared,
            None => {
                let list = DeviceList::new()?;
                let device = list.iter().find(|d| d.name() == info.name).ok_or(
                    VerbsError::InvalidArgument {
                        what: "the discovered RDMA device disappeared",
                    },
                )?;
                let context = device.open()?;
                let pd = ProtectionDomain::new(&context)?;
                let events = Arc::new(Mutex::new(AsyncState::default()));
                opened.push(OpenedDevice {
                    name: info.name.clone(),
                    pd: Arc::downgrade(&pd),
                    events: Arc::downgrade(&events),
                });
                (pd, events)
            }
        };
        drop(opened);
        let context = Arc::clone(pd.context());
        let direct = direct_path_wanted(&context, info);
        Ok(Self::with_events(
            info,
            D::from(VerbsDevice { context, pd }),
            gpu,
            direct,
            events,
        ))
    }

    /// The port `info` on an opened `device` of its own; `direct`: whether connections start on
    /// the mlx5 direct path.
    #[cfg(test)]
    pub(crate) fn on_device(info: &PortInfo, device: D, gpu: GpuSetup, direct: bool) -> Arc<Self> {
        Self::with_events(info, device, gpu, direct, Arc::default())
    }

    fn with_events(
        info: &PortInfo,
        device: D,
        gpu: GpuSetup,
        direct: bool,
        events: Arc<Mutex<AsyncState>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            info: info.clone(),
            gpu,
            mrs: MrCache::new(device.clone()),
            device,
            events,
            direct: AtomicBool::new(direct),
        })
    }

    /// Whether `other` shares this port's protection domain (two ports of one device): keys of
    /// one are valid on queue pairs of the other, so a queue pair may move between them.
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    pub(crate) fn same_domain(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.device.verbs().pd, &other.device.verbs().pd)
    }

    /// Whether the port's link is up now (`ibv_query_port`: ACTIVE); `None` when the query
    /// fails. Port failover asks it of a lane whose work was flushed: a flush is the port's
    /// doing only while the port is down.
    #[cfg_attr(not(feature = "failover"), allow(dead_code))]
    pub(crate) fn link_active(&self) -> Option<bool> {
        use rivet_verbs_ffi::sys::port_state;
        let attr = self
            .device
            .verbs()
            .context
            .query_port(self.info.port)
            .ok()?;
        Some(attr.state == port_state::ACTIVE)
    }

    /// Whether new connections on this port use the mlx5 direct data path.
    pub(crate) fn direct_path(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// Fall back to libibverbs for later connections (after a direct-path set-up failure).
    pub(crate) fn disable_direct_path(&self) {
        self.direct.store(false, Ordering::Relaxed);
    }

    /// The data path's name, for `rivet info` and log lines.
    pub(crate) fn path_name(&self) -> &'static str {
        if self.direct_path() {
            "mlx5-direct"
        } else {
            "verbs"
        }
    }

    /// Register an established connection's QP and CQ for asynchronous events; forget it with
    /// [`Self::unwatch`] before they are destroyed.
    pub(crate) fn watch(&self, qpn: u32, cq_addr: usize) -> WatchId {
        let mut state = self.events.lock().unwrap_or_else(|e| e.into_inner());
        state.book.watch(qpn, cq_addr as u64)
    }

    /// Forget a connection registered with [`Self::watch`].
    pub(crate) fn unwatch(&self, id: WatchId) {
        let mut state = self.events.lock().unwrap_or_else(|e| e.into_inner());
        state.book.unwatch(id);
    }

    /// Drain pending asynchronous events (non-blocking), then say whether one failed the
    /// connection `id`: the error to fail it with, or `None`.
    pub(crate) fn fatal_event_for(&self, id: WatchId) -> Option<DataError> {
        let mut state = self.events.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let event = match self.device.next_async_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(e) => {
                    warn!(
                        "{} port {}: reading asynchronous events failed: {e}",
                        self.info.name, self.info.port
                    );
                    state
                        .book
                        .handle(DeviceEvent::DeviceFatal, "reading async events failed");
                    break;
                }
            };
            let decoded = decode_event(
                event.event_type(),
                event.qp_num(),
                event.cq_addr(),
                event.port_num(),
            );
            self.log_event(decoded, event.name());
            state.book.handle(decoded, event.name());
            event.ack();
        }
        state.book.fatal_error(id)
    }

    /// One log line per event: WARN for those that fail connections, INFO for the rest.
    fn log_event(&self, event: DeviceEvent, name: &str) {
        // The device's ports share its events, so the port reading one may not be the port it
        // concerns: port events name their own port, the others only the device.
        let dev = &self.info.name;
        match event {
            DeviceEvent::QpFatal { qp }
            | DeviceEvent::QpRequestError { qp }
            | DeviceEvent::QpAccessError { qp } => {
                warn!("{dev}: asynchronous event {name} on QP {qp}: its connection fails");
            }
            DeviceEvent::CqError { .. } => {
                warn!(
                    "{dev}: asynchronous event {name}: the connections of that completion queue fail"
                );
            }
            DeviceEvent::DeviceFatal => {
                warn!(
                    "{dev}: asynchronous event {name}: the device failed; every connection on it fails"
                );
            }
            DeviceEvent::PortError { port } => {
                // Not fatal: RC retransmission rides out a flap shorter than the retry budget.
                let (timeout, retries) = retry_settings();
                let budget = rc_retry_budget(timeout, retries)
                    .map_or_else(|| "indefinitely".to_string(), |d| format!("for up to {d}"));
                warn!(
                    "{dev} port {port}: asynchronous event {name}: the link went down; connections \
                     keep retransmitting {budget} (NCCL_IB_TIMEOUT={timeout}, NCCL_IB_RETRY_CNT={retries}) \
                     and fail only if it stays down longer"
                );
            }
            DeviceEvent::PortActive { port } => {
                info!(
                    INIT_NET,
                    "{dev} port {port}: asynchronous event {name}: the link is up"
                );
            }
            _ => info!(INIT_NET, "{dev}: asynchronous event {name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rivet_core::event::Scope;

    #[test]
    fn mlx5_direct_path_is_off_unless_opted_in() {
        // The default on an mlx5 device is libibverbs until the direct path is qualified on hardware.
        assert!(matches!(
            choose_path(None, Some(true)),
            PathChoice::Verbs(_)
        ));
        for off in ["0", "", "yes", "true", "2"] {
            assert!(
                matches!(choose_path(Some(off), Some(true)), PathChoice::Verbs(_)),
                "RIVET_MLX5_DIRECT={off:?} must not enable the direct path"
            );
        }
        assert_eq!(choose_path(Some("1"), Some(true)), PathChoice::Direct);
        assert_eq!(choose_path(Some(" 1\n"), Some(true)), PathChoice::Direct);
        // Opting in never applies to devices libmlx5 does not drive.
        assert!(matches!(
            choose_path(Some("1"), Some(false)),
            PathChoice::Verbs(_)
        ));
        assert!(matches!(choose_path(Some("1"), None), PathChoice::Verbs(_)));
    }

    #[test]
    fn the_default_says_why_and_how_to_opt_in() {
        let PathChoice::Verbs(why) = choose_path(None, Some(true)) else {
            panic!("the direct path must be opt-in");
        };
        assert!(why.contains("not yet qualified"), "{why}");
        assert!(why.contains("RIVET_MLX5_DIRECT=1"), "{why}");
        assert!(why.contains("rivet selftest"), "{why}");
    }

    #[test]
    fn verbs_events_decode_to_the_policy_the_core_applies() {
        let qp = |t| decode_event(t, Some(17), None, None).scope();
        assert_eq!(qp(event_type::QP_FATAL), Scope::Qp(17));
        assert_eq!(qp(event_type::QP_REQ_ERR), Scope::Qp(17));
        assert_eq!(qp(event_type::QP_ACCESS_ERR), Scope::Qp(17));
        assert_eq!(
            decode_event(event_type::CQ_ERR, None, Some(0x5000), None).scope(),
            Scope::Cq(0x5000)
        );
        assert_eq!(
            decode_event(event_type::DEVICE_FATAL, None, None, None).scope(),
            Scope::Device
        );
        for t in [
            event_type::PORT_ERR,
            event_type::PORT_ACTIVE,
            event_type::GID_CHANGE,
        ] {
            assert_eq!(decode_event(t, None, None, Some(1)).scope(), Scope::Nothing);
        }
        assert_eq!(
            decode_event(event_type::PORT_ERR, None, None, Some(1)),
            DeviceEvent::PortError { port: 1 }
        );
    }
}
