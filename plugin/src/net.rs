//! The one implementation behind every ABI version: version-independent entry points that the
//! per-version shims in [`crate::abi::shims`] call after converting their arguments.
//!
//! Unsafe (opted in): `finalize` removes a context from its handle table, which [`crate::handle`]
//! makes `unsafe`: no reference to it may be in use, which NCCL's contract guarantees.

#![allow(unsafe_code)]

use crate::backend::OpenPort;
use crate::backend::device;
use crate::config::Config;
use crate::devices::{self, DeviceProps, FusedDevice, NoDevice, Port};
use crate::error::{NetError, NetResult};
use crate::handle::{Registry, registry};
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
    /// Virtual devices from `makeVDevice`, indexed after the ports.
    fused: Vec<Arc<FusedDevice>>,
    /// With `RIVET_MESH=1`: `makeVDevice` of the mesh device alone made device 1, the mesh
    /// device again (NCCL 2.24 – 2.26 ask for every device, single ones included).
    mesh_alias: bool,
    config: Config,
    /// Live v11+ contexts plus one for a v6–v10 `init` (which has no `finalize`).
    users: usize,
}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

/// Live v11+ contexts.
static CONTEXTS: Registry<NetContext> = registry!(0x0c7c, "live NCCL communicator contexts");

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
    // Which build NCCL loaded, before anything can fail (README "Confirm that NCCL loaded it").
    info!(INIT_NET, "{}", crate::version::line());
    match devices::discover() {
        Ok(ports) => {
            // Before any memory is registered (only comms register).
            fork_policy();
            info!(INIT_NET, "initialized with {} port(s)", ports.len());
            let config = Config::from_env();
            #[cfg(test)]
            let config = crate::backend::sim::settle_config(config);
            let mesh = if config.mesh && !cfg!(feature = "mesh") {
                return Err(no_device(&NoDevice::BadSetting(
                    "RIVET_MESH=1: this build has no mesh device (built without the `mesh` \
                     feature)"
                        .to_owned(),
                )));
            } else if config.mesh {
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
                fused: Vec::new(),
                mesh_alias: false,
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
///
/// A NULL context is accepted and does nothing: NCCL 2.28's loader (`ncclNetPluginInit` in
/// `src/plugin/net.cc`) calls `finalize(comm->netContext)` after this plugin's `init` failed,
/// when no context was ever written (the communicator is zero-allocated). A host without an
/// RDMA device must not show a WARN for that.
pub(crate) fn finalize(ctx: *mut c_void) -> NetResult<()> {
    if ctx.is_null() {
        info!(
            INIT_NET,
            "finalize without a context (init failed or never ran): nothing to release"
        );
        return Ok(());
    }
    let handle = CONTEXTS
        .decode(ctx)
        .ok_or_else(|| NetError::misuse("finalize: unknown context"))?;
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
            crate::stats::unpublish();
            *global = None;
            device::set_retry_settings(None);
        }
    }
}

/// Tests only: forget the devices (as if the last user had finalized), so the next `init`
/// discovers again (with another number of simulated ports). Every comm must be closed.
#[cfg(test)]
pub(crate) fn forget_devices_for_tests() {
    *global() = None;
    device::set_retry_settings(None);
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
    // Without the feature no mesh device is ever made: the constant answer lets the linker drop
    // the mesh paths of listen/connect.
    if !cfg!(feature = "mesh") {
        return Ok(None);
    }
    let (mesh, alias) = global()
        .as_ref()
        .map_or((None, false), |g| (g.mesh.clone(), g.mesh_alias));
    match mesh {
        Some(m) if dev == 0 || (alias && dev == 1) => Ok(Some(m)),
        Some(_) => Err(NetError::invalid_argument(format!(
            "device {dev} does not exist (RIVET_MESH=1: device 0 is the mesh device)"
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

/// The fused device `dev` names, if it is one (indices after the physical ports).
fn fused_device_for(dev: c_int) -> NetResult<Option<Arc<FusedDevice>>> {
    let global = global();
    let g = global.as_ref().ok_or_else(|| {
        NetError::misuse("the plugin is not initialized (init failed or was not called)")
    })?;
    Ok(usize::try_from(dev)
        .ok()
        .and_then(|i| i.checked_sub(g.ports.len()))
        .and_then(|i| g.fused.get(i))
        .cloned())
}

fn open(port: &Port) -> NetResult<Arc<OpenPort>> {
    port.open().map_err(|e| {
        NetError::system(format!(
            "opening {} port {}: {e}",
            port.info.name, port.info.port
        ))
    })
}

/// Open device `dev` (once; later calls share it). Not for the mesh device, whose comms choose
/// their port per connection (`comm::listen`, `comm::connect`), nor for a fused device of several
/// ports (`open_ports`).
#[cfg_attr(not(feature = "collnet"), allow(dead_code))] // only CollNet calls it
pub(crate) fn open_port(dev: c_int) -> NetResult<Arc<OpenPort>> {
    let mut ports = open_ports(dev)?;
    if ports.len() != 1 {
        return Err(NetError::invalid_usage(format!(
            "device {dev} fuses {} ports; CollNet and other users of one fixed port need a              physical device",
            ports.len()
        )));
    }
    Ok(ports.remove(0))
}

/// Open the ports of device `dev`: one for a physical device, every member (in order) for a
/// fused one. Not for the mesh device.
pub(crate) fn open_ports(dev: c_int) -> NetResult<Vec<Arc<OpenPort>>> {
    if mesh_device_for(dev)?.is_some() {
        return Err(NetError::invalid_usage(
            "RIVET_MESH=1: the mesh device chooses a port per connection; CollNet and other \
             users of a fixed port are not available on it"
                .to_owned(),
        ));
    }
    let ports = ports()?;
    if let Some(fused) = fused_device_for(dev)? {
        return fused
            .members
            .iter()
            .map(|&m| {
                ports
                    .get(m)
                    .ok_or_else(|| NetError::misuse(format!("fused member {m} vanished")))
                    .and_then(open)
            })
            .collect();
    }
    let port = usize::try_from(dev)
        .ok()
        .and_then(|i| ports.get(i))
        .ok_or_else(|| {
            NetError::invalid_argument(format!(
                "device {dev} does not exist ({} devices)",
                device_count()
            ))
        })?;
    Ok(vec![open(port)?])
}

/// Physical ports plus fused devices (1 on the mesh device).
fn device_count() -> usize {
    global().as_ref().map_or(0, |g| {
        if g.mesh.is_some() {
            1 + usize::from(g.mesh_alias)
        } else {
            g.ports.len() + g.fused.len()
        }
    })
}

/// `devices(&n)`.
pub(crate) fn devices() -> NetResult<c_int> {
    ports()?;
    Ok(c_int::try_from(device_count()).unwrap_or(c_int::MAX))
}

/// `getProperties(dev)`.
pub(crate) fn properties(dev: c_int) -> NetResult<DeviceProps> {
    if let Some(mesh) = mesh_device_for(dev)? {
        return Ok(mesh.props);
    }
    if let Some(fused) = fused_device_for(dev)? {
        return Ok(fused.props);
    }
    let ports = ports()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| ports.get(i))
        .map(|p| p.props)
        .ok_or_else(|| {
            NetError::invalid_argument(format!(
                "device {dev} does not exist ({} devices)",
                device_count()
            ))
        })
}

/// `makeVDevice(&d, {ndevs, devs})`: append a device fusing physical ports `members` and return
/// its index. As NCCL's IB transport: `NCCL_IB_MERGE_NICS=0` refuses fusing several ports, and
/// ports of different link layers are never fused. A single port makes a one-member device that
/// behaves as the port itself (NCCL 2.24 – 2.26 ask for those too).
pub(crate) fn make_vdevice(members: &[c_int]) -> NetResult<c_int> {
    let mut global = global();
    let g = global.as_mut().ok_or_else(|| {
        NetError::misuse("the plugin is not initialized (init failed or was not called)")
    })?;
    if g.mesh.is_some() {
        if members != [0] {
            return Err(NetError::invalid_usage(
                "makeVDevice: RIVET_MESH=1 already puts every port behind one device (device 0)"
                    .to_owned(),
            ));
        }
        g.mesh_alias = true;
        return Ok(1);
    }
    if members.len() > 1 && std::env::var("NCCL_IB_MERGE_NICS").is_ok_and(|v| v.trim() == "0") {
        return Err(NetError::invalid_usage(
            "makeVDevice: NCCL_IB_MERGE_NICS=0 forbids fusing ports".to_owned(),
        ));
    }
    let indices: Vec<usize> = members
        .iter()
        .map(|&m| usize::try_from(m).unwrap_or(usize::MAX))
        .collect();
    // Every communicator's topology set-up asks again: the same members get the same device, so
    // the list stays bounded by the distinct groups.
    if let Some(i) = g.fused.iter().position(|f| f.members == indices) {
        return c_int::try_from(g.ports.len() + i)
            .map_err(|_| NetError::system("makeVDevice: too many devices".to_owned()));
    }
    let fused = FusedDevice::new(&g.ports, &indices)
        .map_err(|why| NetError::invalid_argument(format!("makeVDevice: {why}")))?;
    let index = g.ports.len() + g.fused.len();
    let d = c_int::try_from(index)
        .map_err(|_| NetError::system("makeVDevice: too many devices".to_owned()))?;
    info!(
        INIT_NET,
        "makeVDevice: device {d} fuses {} port(s): {:?}",
        indices.len(),
        indices
    );
    g.fused.push(Arc::new(fused));
    Ok(d)
}
