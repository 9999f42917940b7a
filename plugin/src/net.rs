//! The one implementation behind every ABI version: version-independent entry points that the
//! per-version shims in [`crate::abi::shims`] call after converting their arguments.
//!
//! Unsafe (opted in): `finalize` removes a context from its handle table, which [`crate::handle`]
//! makes `unsafe`: no reference to it may be in use, which NCCL's contract guarantees.

#![allow(unsafe_code)]

use crate::backend::device::{self, OpenPort};
use crate::config::Config;
use crate::devices::{self, DeviceProps, NoDevice, Port};
use crate::error::{NetError, NetResult};
use crate::handle::Registry;
use crate::log::{INIT_NET, info, warn};
use crate::mesh::{self, MeshDevice};
use crate::oob::iface;
use core::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

/// Per-communicator context of the v11+ ABI (`init(&ctx, commId, config, …)`).
#[derive(Debug)]
pub(crate) struct NetContext {
    /// NCCL's communicator hash, for log lines.
    pub(crate) comm_id: u64,
    /// `config->trafficClass`, when NCCL set one.
    pub(crate) traffic_class: Option<i32>,
}

/// Process-wide plugin state, present between the first successful `init` and the last `finalize`.
struct Global {
    ports: Arc<Vec<Port>>,
    /// With `RIVET_MESH=1`: the one device NCCL sees, over `ports`.
    mesh: Option<Arc<MeshDevice>>,
    config: Config,
    /// Live v11+ contexts plus one for a v6–v10 `init` (which has no `finalize`).
    users: usize,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

/// Live v11+ contexts.
static CONTEXTS: Registry<NetContext> = Registry::new(0x0c7c, "live NCCL communicator contexts");

fn global() -> MutexGuard<'static, Option<Global>> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether NCCL was told to use Rivet specifically (then a missing device is worth a WARN).
fn rivet_requested() -> bool {
    std::env::var("NCCL_NET").is_ok_and(|v| v.eq_ignore_ascii_case("rivet"))
}

/// Open the devices on first use; later calls share them. `users` counts who must `finalize`.
fn acquire(counted: bool) -> NetResult<()> {
    let mut global = global();
    if let Some(g) = global.as_mut() {
        if counted {
            g.users += 1;
        }
        return Ok(());
    }
    match devices::discover() {
        Ok(ports) => {
            // Before any memory is registered (only comms register).
            fork_policy();
            info!(INIT_NET, "initialized with {} port(s)", ports.len());
            let config = Config::from_env();
            #[cfg(test)]
            let config = crate::backend::sim::settle_config(config);
            let mesh = if config.mesh {
                Some(Arc::new(
                    mesh_device(&ports).map_err(|why| no_device(&NoDevice::BadSetting(why)))?,
                ))
            } else {
                None
            };
            device::set_retry_settings(Some((config.ib_timeout, config.ib_retry_cnt)));
            *global = Some(Global {
                ports: Arc::new(ports),
                mesh,
                config,
                users: usize::from(counted),
            });
            Ok(())
        }
        Err(why) => Err(no_device(&why)),
    }
}

/// The mesh device over `ports` (`RIVET_MESH=1`), logging which ports it holds.
fn mesh_device(ports: &[Port]) -> Result<MeshDevice, String> {
    let ifaddrs = iface::local_addresses()
        .map_err(|e| format!("RIVET_MESH=1: listing the interfaces failed: {e}"))?;
    let (device, notes) = mesh::build(ports, &ifaddrs)?;
    for note in notes {
        warn!("{note}");
    }
    let members: Vec<String> = device
        .members
        .iter()
        .map(|m| format!("{} {}", m.name, m.addr))
        .collect();
    info!(
        INIT_NET,
        "RIVET_MESH=1: one mesh device over {} port(s): {}",
        device.len(),
        members.join(", ")
    );
    Ok(device)
}

/// Fork policy: registered memory must stay intact in the parent when a child is forked after
/// `init` (PyTorch DataLoader workers do that). On kernels with copy-on-fork for pinned pages
/// (Linux 5.13+, which rdma-core reports as "fork unneeded") nothing is needed; otherwise Rivet
/// calls `ibv_fork_init` before registering anything, so libibverbs marks registered ranges
/// `MADV_DONTFORK`. Rivet never calls `madvise` on user buffers itself.
fn fork_policy() {
    const IBV_FORK_UNNEEDED: i32 = 2;
    match rivet_verbs_ffi::fork_status() {
        Ok(Some(IBV_FORK_UNNEEDED)) => info!(
            INIT_NET,
            "fork: the kernel keeps registered memory safe across fork()"
        ),
        Ok(_) => match rivet_verbs_ffi::fork_init() {
            Ok(()) => info!(
                INIT_NET,
                "fork: ibv_fork_init enabled fork-safe registration"
            ),
            Err(e) => warn!(
                "fork: ibv_fork_init failed ({e}); a child forked after init may corrupt transfers"
            ),
        },
        // No libibverbs: discovery reports that next.
        Err(_) => {}
    }
}

fn no_device(why: &NoDevice) -> NetError {
    let line = format!("{why}; NCCL will use another network");
    if rivet_requested() {
        warn!("{line}");
    } else {
        info!(INIT_NET, "{line}");
    }
    NetError::system(line).logged()
}

/// `init(logger)` of v6–v10: process-wide, idempotent, never finalized.
pub(crate) fn init() -> NetResult<()> {
    let first = global().is_none();
    acquire(first)
}

/// `init(&ctx, commId, config, …)` of v11+: one context per communicator.
pub(crate) fn init_context(comm_id: u64, traffic_class: Option<i32>) -> NetResult<*mut c_void> {
    acquire(true)?;
    let ctx = Box::new(NetContext {
        comm_id,
        traffic_class,
    });
    match CONTEXTS.insert(ctx) {
        Ok(handle) => Ok(handle.to_ptr()),
        Err(full) => {
            release();
            Err(NetError::system(format!("init: {full}")))
        }
    }
}

/// `finalize(ctx)`: drop the context; the last one closes the devices.
pub(crate) fn finalize(ctx: *mut c_void) -> NetResult<()> {
    let handle = CONTEXTS
        .decode(ctx)
        .ok_or_else(|| NetError::misuse("finalize: NULL or unknown context"))?;
    // SAFETY: NCCL finalizes a context only after closing every comm created under it, and no
    // other call uses it concurrently; no reference from `context` outlives those calls.
    let ctx = unsafe { CONTEXTS.remove(handle) }
        .ok_or_else(|| NetError::misuse("finalize: context already finalized"))?;
    info!(INIT_NET, "finalize for communicator {:#x}", ctx.comm_id);
    release();
    Ok(())
}

fn release() {
    let mut global = global();
    if let Some(g) = global.as_mut() {
        g.users = g.users.saturating_sub(1);
        if g.users == 0 {
            *global = None;
            device::set_retry_settings(None);
        }
    }
}

/// Look up a v11+ context (`None` for NULL: the v6–v10 entry points pass none).
pub(crate) fn context(ctx: *mut c_void) -> NetResult<Option<&'static NetContext>> {
    if ctx.is_null() {
        return Ok(None);
    }
    let handle = CONTEXTS
        .decode(ctx)
        .ok_or_else(|| NetError::misuse("unknown plugin context"))?;
    let ctx = CONTEXTS
        .find(handle)
        .ok_or_else(|| NetError::misuse("plugin context already finalized"))?;
    Ok(Some(ctx))
}

fn ports() -> NetResult<Arc<Vec<Port>>> {
    global()
        .as_ref()
        .map(|g| Arc::clone(&g.ports))
        .ok_or_else(|| {
            NetError::misuse("the plugin is not initialized (init failed or was not called)")
        })
}

/// The settings read at `init`.
pub(crate) fn config() -> NetResult<Config> {
    global().as_ref().map(|g| g.config.clone()).ok_or_else(|| {
        NetError::misuse("the plugin is not initialized (init failed or was not called)")
    })
}

/// The mesh device, when `RIVET_MESH=1` made `dev` (then always 0) one; `Err` for a device that
/// does not exist.
pub(crate) fn mesh_device_for(dev: c_int) -> NetResult<Option<Arc<MeshDevice>>> {
    let mesh = global().as_ref().and_then(|g| g.mesh.clone());
    match mesh {
        Some(m) if dev == 0 => Ok(Some(m)),
        Some(_) => Err(NetError::invalid_argument(format!(
            "device {dev} does not exist (1 device: RIVET_MESH=1)"
        ))),
        None => Ok(None),
    }
}

/// Open member `member` of the mesh device (once; later calls share it).
pub(crate) fn open_mesh_member(mesh: &MeshDevice, member: usize) -> NetResult<Arc<OpenPort>> {
    let ports = ports()?;
    let port = mesh
        .members
        .get(member)
        .and_then(|m| ports.get(m.port))
        .ok_or_else(|| NetError::misuse(format!("mesh member {member} does not exist")))?;
    port.open().map_err(|e| {
        NetError::system(format!(
            "opening {} port {}: {e}",
            port.info.name, port.info.port
        ))
    })
}

/// Open device `dev` (once; later calls share it). Not for the mesh device, whose comms choose
/// their port per connection (`comm::listen`, `comm::connect`).
pub(crate) fn open_port(dev: c_int) -> NetResult<Arc<OpenPort>> {
    if mesh_device_for(dev)?.is_some() {
        return Err(NetError::invalid_usage(
            "RIVET_MESH=1: the mesh device chooses a port per connection; CollNet and other \
             users of a fixed port are not available on it"
                .to_owned(),
        ));
    }
    let ports = ports()?;
    let port = usize::try_from(dev)
        .ok()
        .and_then(|i| ports.get(i))
        .ok_or_else(|| {
            NetError::invalid_argument(format!(
                "device {dev} does not exist ({} devices)",
                ports.len()
            ))
        })?;
    port.open().map_err(|e| {
        NetError::system(format!(
            "opening {} port {}: {e}",
            port.info.name, port.info.port
        ))
    })
}

/// `devices(&n)`.
pub(crate) fn devices() -> NetResult<c_int> {
    if mesh_device_for(0)?.is_some() {
        return Ok(1);
    }
    Ok(c_int::try_from(ports()?.len()).unwrap_or(c_int::MAX))
}

/// `getProperties(dev)`.
pub(crate) fn properties(dev: c_int) -> NetResult<DeviceProps> {
    if let Some(mesh) = mesh_device_for(dev)? {
        return Ok(mesh.props);
    }
    let ports = ports()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| ports.get(i))
        .map(|p| p.props)
        .ok_or_else(|| {
            NetError::invalid_argument(format!(
                "device {dev} does not exist ({} devices)",
                ports.len()
            ))
        })
}
