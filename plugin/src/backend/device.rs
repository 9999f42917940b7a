//! An opened RDMA port: its verbs context and protection domain, shared by every comm on it.

use crate::log::{INIT_NET, info, warn};
use rivet_verbs_ffi::discover::PortInfo;
use rivet_verbs_ffi::sys::event_type;
use rivet_verbs_ffi::{Context, DeviceList, ProtectionDomain, VerbsError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Fatal asynchronous events seen on a port, for the comms that poll it.
///
/// Events are read from the context's non-blocking async fd by whichever comm checks first (no
/// thread of ours waits on it), acknowledged at once, and recorded here for every comm of the port.
#[derive(Debug, Default)]
struct AsyncState {
    /// A port- or device-wide failure (`DEVICE_FATAL`, `PORT_ERR`), once seen.
    port_failure: Option<&'static str>,
    /// QPs named by fatal QP events (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`) and CQ errors.
    failed_qps: Vec<(u32, &'static str)>,
    /// Whether any CQ error was reported (CQ events do not name a QP).
    cq_failure: Option<&'static str>,
}

/// Whether to use the mlx5 direct path on this device: it is an mlx5 device (libmlx5 says so) and
/// `RIVET_MLX5_DIRECT` is not `0`. Logged once per opened port.
fn direct_path_wanted(context: &Context, info: &PortInfo) -> bool {
    let disabled = std::env::var("RIVET_MLX5_DIRECT").is_ok_and(|v| v.trim() == "0");
    let (direct, why) = match rivet_verbs_ffi::mlx5::setup::device_supported(context) {
        Ok(true) if disabled => (
            false,
            "mlx5 device, direct path disabled by RIVET_MLX5_DIRECT=0",
        ),
        Ok(true) => (true, "mlx5 device"),
        Ok(false) => (false, "not an mlx5 device"),
        Err(_) => (false, "libmlx5 not available"),
    };
    let path = if direct { "mlx5 direct" } else { "libibverbs" };
    info!(
        INIT_NET,
        "{} port {}: data path {path} ({why})", info.name, info.port
    );
    direct
}

/// The failure recorded for `DEVICE_FATAL` (never cleared by a later `PORT_ACTIVE`).
const DEVICE_FATAL: &str = "device fatal error";

/// Most failed QPs remembered; comms check their QP soon after the event, so old entries go.
const MAX_FAILED_QPS: usize = 1024;

/// A port opened for use: created on the first comm that needs it, dropped with the last one.
#[derive(Debug)]
pub(crate) struct OpenPort {
    /// What discovery found (name, port number, GID choice, MTU, link layer, …).
    pub(crate) info: PortInfo,
    /// Protection domain all of this port's QPs and memory registrations share.
    pub(crate) pd: Arc<ProtectionDomain>,
    /// The device context.
    pub(crate) context: Arc<Context>,
    events: Mutex<AsyncState>,
    /// Whether new connections use the mlx5 direct data path (mlx5 device, not disabled by
    /// `RIVET_MLX5_DIRECT=0`, and no set-up failure so far).
    direct: AtomicBool,
}

impl OpenPort {
    /// Open the device named in `info` and allocate a protection domain on it.
    pub(crate) fn open(info: &PortInfo) -> Result<Arc<Self>, VerbsError> {
        let list = DeviceList::new()?;
        let device =
            list.iter()
                .find(|d| d.name() == info.name)
                .ok_or(VerbsError::InvalidArgument {
                    what: "the discovered RDMA device disappeared",
                })?;
        let context = device.open()?;
        let pd = ProtectionDomain::new(&context)?;
        let direct = direct_path_wanted(&context, info);
        Ok(Arc::new(Self {
            info: info.clone(),
            pd,
            context,
            events: Mutex::new(AsyncState::default()),
            direct: AtomicBool::new(direct),
        }))
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

    /// Drain pending asynchronous events (non-blocking), then say whether anything fatal affects
    /// the QP `qpn`: the name of the event, or `None`.
    pub(crate) fn fatal_event_for(&self, qpn: u32) -> Option<&'static str> {
        let mut state = self.events.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let event = match self.context.get_async_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(e) => {
                    state
                        .port_failure
                        .get_or_insert("reading async events failed");
                    warn!(
                        "{} port {}: reading asynchronous events failed: {e}",
                        self.info.name, self.info.port
                    );
                    break;
                }
            };
            let (dev, port) = (&self.info.name, self.info.port);
            let name = event.name();
            match (event.event_type(), event.qp_num()) {
                (_, Some(qp)) if event.is_fatal() => {
                    warn!("{dev} port {port}: asynchronous event {name} on QP {qp}");
                    if state.failed_qps.len() >= MAX_FAILED_QPS {
                        state.failed_qps.remove(0);
                    }
                    state.failed_qps.push((qp, name));
                }
                (event_type::CQ_ERR, _) => {
                    warn!(
                        "{dev} port {port}: asynchronous event {name} (completion queue overrun)"
                    );
                    state.cq_failure = Some(name);
                }
                (event_type::DEVICE_FATAL, _) => {
                    warn!("{dev} port {port}: asynchronous event {name}: the device failed");
                    state.port_failure = Some(DEVICE_FATAL);
                }
                (event_type::PORT_ERR, _)
                    if event.port_num().is_none_or(|p| p == u32::from(port)) =>
                {
                    warn!("{dev} port {port}: asynchronous event {name}: the link went down");
                    state.port_failure = Some(name);
                }
                (event_type::PORT_ACTIVE, _) => {
                    info!(
                        INIT_NET,
                        "{dev} port {port}: asynchronous event {name}: the link is up"
                    );
                    // A link that came back serves new comms again; comms that saw the failure keep
                    // their (sticky) error.
                    if state.port_failure.is_some_and(|f| f != DEVICE_FATAL) {
                        state.port_failure = None;
                    }
                }
                _ => info!(INIT_NET, "{dev} port {port}: asynchronous event {name}"),
            }
            event.ack();
        }
        let for_qp = state
            .failed_qps
            .iter()
            .find(|(qp, _)| *qp == qpn)
            .map(|(_, name)| *name);
        state.port_failure.or(state.cq_failure).or(for_qp)
    }
}
