//! The RDMA ports Rivet exposes to NCCL: discovered on the first `init`, opened on first use.
//!
//! Unsafe (opted in): `Port` holds C strings NCCL reads through raw pointers in its properties, so
//! it is marked `Send`/`Sync` by hand; the strings are owned by the port (by raw pointer, freed
//! on drop) and never change.

#![allow(unsafe_code)]

use crate::backend::OpenPort;
use crate::backend::device::GpuSetup;
use crate::config::GdrSettings;
use crate::sys::NCCL_NET_ID_UNDEF;
use core::ffi::{c_char, c_int};
use rivet_core::gdr::{DmaBuf, GdrFacts, GdrPolicy};
use rivet_verbs_ffi::discover::{AddrFamily, GidPolicy, NameList};
use rivet_verbs_ffi::mr::DmaBufProbe;
use rivet_verbs_ffi::{DiscoverError, DiscoverOptions, PortInfo, VerbsError};
use std::ffi::CString;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// What `getProperties` reports for one device, before it is cast into a versioned struct.
#[derive(Clone, Copy, Debug)]
pub struct DeviceProps {
    /// NUL-terminated device name with process lifetime.
    pub name: *const c_char,
    /// NUL-terminated PCI path with process lifetime.
    pub pci_path: *const c_char,
    /// NIC guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Mb/s.
    pub speed_mbps: c_int,
    /// Port number as NCCL sees it.
    pub port: c_int,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// `regIsGlobal` (v8+): 1 when a registration serves every comm of the device.
    pub reg_is_global: c_int,
    /// Physical members (a physical device lists itself).
    pub members: [c_int; 8],
    /// Number of valid entries in `members`.
    pub member_count: c_int,
    /// Rail id or -1.
    pub rail_id: i16,
    /// Plane id or -1.
    pub plane_id: i16,
}

/// Why Rivet has no device to offer. Its text is the one line NCCL's log shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoDevice {
    /// `RIVET_DISABLE=1` or `NCCL_IB_DISABLE=1`.
    Disabled(&'static str),
    /// An environment variable could not be parsed.
    BadSetting(String),
    /// Discovery found nothing usable.
    Discovery(DiscoverError),
}

impl fmt::Display for NoDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled(var) => write!(f, "disabled by {var}=1"),
            Self::BadSetting(why) => f.write_str(why),
            Self::Discovery(e) => write!(f, "no RDMA device: {e}"),
        }
    }
}

/// One port Rivet exposes.
#[derive(Debug)]
pub struct Port {
    /// What discovery found.
    pub info: PortInfo,
    /// The properties reported through `getProperties` (pointing into `name` and `pci_path`).
    pub props: DeviceProps,
    _name: PropString,
    /// `None` when the device has no PCI function (Soft-RoCE): NCCL then gets a NULL `pciPath`,
    /// as from its own IB transport, and places the NIC at the CPU.
    _pci_path: Option<PropString>,
    /// The GPUDirect settings the port's decision was made with.
    gdr: GdrSettings,
    opened: Mutex<Option<Arc<OpenPort>>>,
}

// SAFETY: `props` points only into the strings this value owns (heap buffers that do not move
// with the value, never written); everything else is immutable or behind a mutex.
unsafe impl Send for Port {}
// SAFETY: as above.
unsafe impl Sync for Port {}

impl Port {
    fn new(index: usize, info: PortInfo, gdr: GdrSettings) -> Self {
        let ptr_support = gdr_policy(&info, &gdr).ptr_support();
        let clean =
            |s: &str| PropString::new(CString::new(s.replace('\0', "")).unwrap_or_default());
        let name = clean(&info.name);
        let pci = info.nccl_pci_path.as_deref().map(clean);
        let mut members = [0; 8];
        members[0] = i32::try_from(index).unwrap_or(i32::MAX);
        let props = DeviceProps {
            name: name.as_ptr(),
            pci_path: pci.as_ref().map_or(core::ptr::null(), |p| p.as_ptr()),
            guid: info.guid,
            // Host memory, and GPU memory where the host offers it and receives can be flushed
            // (`rivet_core::gdr`).
            ptr_support,
            speed_mbps: i32::try_from(info.speed_mbps).unwrap_or(i32::MAX),
            // Not the verbs port: NCCL's numbering, unique among the PFs of one card (which share
            // `guid`), so NCCL does not take them for one port and halve their bandwidth.
            port: i32::try_from(info.nccl_port).unwrap_or(i32::MAX),
            // What both the device and Rivet's connection table hold (NCCL reads it as a cap on
            // the channels it runs over the NIC).
            max_comms: i32::try_from(info.max_qp.min(crate::handle::MAX_ENTRIES as u32))
                .unwrap_or(i32::MAX),
            // The registration cache is per port, and every comm of this device is on it.
            reg_is_global: 1,
            members,
            member_count: 1,
            rail_id: info
                .rail
                .and_then(|r| i16::try_from(r).ok())
                .unwrap_or(NCCL_NET_ID_UNDEF),
            plane_id: info
                .plane
                .and_then(|p| i16::try_from(p).ok())
                .unwrap_or(NCCL_NET_ID_UNDEF),
        };
        Self {
            info,
            props,
            _name: name,
            _pci_path: pci,
            gdr,
            opened: Mutex::new(None),
        }
    }

    /// The opened device (context + protection domain), opening it on first use.
    pub(crate) fn open(&self) -> Result<Arc<OpenPort>, VerbsError> {
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(port) = opened.as_ref() {
            return Ok(Arc::clone(port));
        }
        #[cfg(test)]
        if crate::backend::sim::installed() {
            let port = crate::backend::sim::open_port(&self.info);
            *opened = Some(Arc::clone(&port));
            return Ok(port);
        }
        let port = OpenPort::open(&self.info, self.gpu_setup())?;
        *opened = Some(Arc::clone(&port));
        Ok(port)
    }
}

/// A C string `props` points into, held by the raw pointer [`CString::into_raw`] gives. A
/// `CString` would not do: it owns its buffer as a `Box`, and moving a `Box` (into the `Port`, the
/// `Port` into its `Vec`) asserts unique access to the buffer, which invalidates the pointers
/// taken before under Rust's aliasing rules (Miri reports the later read as undefined behaviour).
#[derive(Debug)]
pub(crate) struct PropString(NonNull<c_char>);

impl PropString {
    pub(crate) fn new(s: CString) -> Self {
        // `into_raw` never returns NULL.
        Self(NonNull::new(s.into_raw()).unwrap_or_else(|| unreachable!("CString::into_raw")))
    }

    /// The NUL-terminated string, valid while `self` lives.
    pub(crate) fn as_ptr(&self) -> *const c_char {
        self.0.as_ptr()
    }
}

impl Drop for PropString {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `CString::into_raw` and is given back once, here.
        drop(unsafe { CString::from_raw(self.0.as_ptr()) });
    }
}

/// The dma-buf probe's answer as the GPUDirect decision takes it: the probe says which errno
/// means support.
fn dmabuf_fact(probe: DmaBufProbe) -> DmaBuf {
    match probe {
        DmaBufProbe::NoSymbol => DmaBuf::NoSymbol,
        DmaBufProbe::NotProbed => DmaBuf::NotProbed,
        DmaBufProbe::Answered(_) if probe.accepted() => DmaBuf::Accepted,
        DmaBufProbe::Answered(errno) => DmaBuf::Refused(errno),
    }
}

/// This port's GPUDirect decision (`rivet_core::gdr`). The flush is available on every data path
/// (a libibverbs loopback queue pair, `backend::flush`).
fn gdr_policy<'a>(info: &'a PortInfo, gdr: &GdrSettings) -> GdrPolicy<'a> {
    GdrPolicy::decide(&GdrFacts {
        peer_memory: info.peer_memory.as_deref(),
        dmabuf: dmabuf_fact(info.dmabuf_probe),
        dmabuf_enable: gdr.dmabuf_enable,
        relaxed_ordering: gdr.relaxed_ordering,
        has_reg_mr_iova2: info.has_reg_mr_iova2,
        flush_disable: gdr.flush_disable,
        flush_available: true,
    })
}

impl Port {
    /// The data path its connections take (`verbs`, `mlx5-direct`, or `unavailable` when the
    /// device cannot be opened). Opens the port (context and protection domain, kept for later
    /// comms): the path is decided then.
    pub fn data_path(&self) -> &'static str {
        self.open().map_or("unavailable", |p| p.path_name())
    }

    /// The GPUDirect decision, with its reasons (for `rivet info` and the INIT log).
    pub fn gdr(&self) -> GdrPolicy<'_> {
        gdr_policy(&self.info, &self.gdr)
    }

    /// What the opened port does with GPU memory.
    fn gpu_setup(&self) -> GpuSetup {
        let policy = self.gdr();
        GpuSetup {
            cuda: policy.cuda.yes(),
            relaxed_ordering: policy.relaxed_ordering,
            // NCCL's rule: a flush queue pair where GPU memory is in use and the flush is not
            // disabled; the test switch forces it on host memory.
            flush: (policy.flush && policy.gpu()) || self.gdr.flush_host_memory,
        }
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.info;
        let link = match i.link_layer {
            rivet_verbs_ffi::discover::LinkLayer::InfiniBand => "InfiniBand",
            rivet_verbs_ffi::discover::LinkLayer::Ethernet => "RoCE",
        };
        let pci = i
            .pci_path
            .as_ref()
            .map_or_else(|| "-".to_owned(), |p| p.display().to_string());
        let path = self.data_path();
        write!(
            f,
            "{} port {} {link} {} Gb/s gid[{}] {} ({}) mtu {} pci {pci} path {path}; gdr: {}",
            i.name,
            i.port,
            f64::from(i.speed_mbps) / 1000.0,
            i.gid_index,
            i.gid_string,
            i.why,
            128u32 << i.active_mtu.min(5),
            self.gdr(),
        )
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Discovery options from `NCCL_IB_HCA`, `NCCL_IB_GID_INDEX`, `NCCL_IB_ROCE_VERSION_NUM`,
/// `NCCL_IB_ADDR_FAMILY` and `NCCL_IB_MERGE_VFS`.
fn options_from_env() -> Result<DiscoverOptions, NoDevice> {
    let mut options = DiscoverOptions::default();
    if let Some(spec) = env("NCCL_IB_HCA") {
        options.filter = NameList::parse(&spec)
            .map_err(|e| NoDevice::BadSetting(format!("NCCL_IB_HCA={spec:?}: {e}")))?;
    }
    let mut gid = GidPolicy::default();
    if let Some(v) = env("NCCL_IB_GID_INDEX") {
        let index: i64 = v.parse().map_err(|_| {
            NoDevice::BadSetting(format!("NCCL_IB_GID_INDEX={v:?} is not a number"))
        })?;
        gid.index = u32::try_from(index).ok();
    }
    if let Some(v) = env("NCCL_IB_ROCE_VERSION_NUM") {
        gid.roce_version = match v.as_str() {
            "1" => 1,
            "2" => 2,
            _ => {
                return Err(NoDevice::BadSetting(format!(
                    "NCCL_IB_ROCE_VERSION_NUM={v:?} must be 1 or 2"
                )));
            }
        };
    }
    if let Some(v) = env("NCCL_IB_ADDR_FAMILY") {
        gid.family = AddrFamily::parse(&v).ok_or_else(|| {
            NoDevice::BadSetting(format!(
                "NCCL_IB_ADDR_FAMILY={v:?} must be AF_INET or AF_INET6"
            ))
        })?;
    }
    options.gid = gid;
    // NCCL reads it as an integer; only 0 turns merging off.
    options.split_vfs = env("NCCL_IB_MERGE_VFS").is_some_and(|v| v.parse::<i64>() == Ok(0));
    Ok(options)
}

/// Find the ports Rivet can use.
pub fn discover() -> Result<Vec<Port>, NoDevice> {
    for var in ["RIVET_DISABLE", "NCCL_IB_DISABLE"] {
        if env(var).as_deref() == Some("1") {
            return Err(NoDevice::Disabled(if var == "RIVET_DISABLE" {
                "RIVET_DISABLE"
            } else {
                "NCCL_IB_DISABLE"
            }));
        }
    }
    let options = options_from_env()?;
    let gdr = GdrSettings::from_env();
    #[cfg(test)]
    if crate::backend::sim::installed() {
        use crate::backend::sim::{PORT_GUID, PORT_NAME};
        if crate::backend::sim::no_device() {
            return Err(NoDevice::Discovery(DiscoverError::NoDevices));
        }
        return Ok((0..crate::backend::sim::ports())
            .map(|i| {
                let name = if i == 0 {
                    PORT_NAME.to_owned()
                } else {
                    format!("sim{i}")
                };
                let info = fake_port_info(&name, None, 1, PORT_GUID + i as u64);
                Port::new(i, info, gdr)
            })
            .collect());
    }
    let found = rivet_verbs_ffi::discover(&options).map_err(NoDevice::Discovery)?;
    Ok(found
        .into_iter()
        .enumerate()
        .map(|(i, info)| Port::new(i, info, gdr))
        .collect())
}

#[cfg(test)]
/// A discovered InfiniBand port as discovery builds it, before the NCCL identities are assigned
/// (for unit tests of what is derived from ports).
pub(crate) fn fake_port_info(name: &str, pci_path: Option<&str>, port: u8, guid: u64) -> PortInfo {
    use rivet_verbs_ffi::discover::{LinkLayer, PtrSupport};
    PortInfo {
        name: name.into(),
        port,
        link_layer: LinkLayer::InfiniBand,
        speed_mbps: 400_000,
        gid_index: 0,
        gid: [0; 16],
        gid_string: "::".into(),
        roce_version: None,
        why: "test".into(),
        pci_path: pci_path.map(std::path::PathBuf::from),
        nccl_pci_path: None,
        nccl_port: u32::from(port),
        guid,
        max_qp: 1024,
        active_mtu: 5,
        lid: 1,
        port_flags: 0,
        ptr_support: PtrSupport(PtrSupport::HOST),
        peer_memory: None,
        dmabuf_probe: DmaBufProbe::NoSymbol,
        has_reg_mr_iova2: true,
        rail: None,
        plane: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{DmaBufProbe, Port, fake_port_info as fake_port};
    use rivet_verbs_ffi::discover::assign_nccl_identities;
    use std::ffi::CStr;

    #[test]
    fn the_pfs_of_one_card_are_distinct_ports_to_nccl() {
        // Two PFs of one ConnectX (verbs port 1 each, one sys_image_guid), one VF of the first,
        // and a second card.
        let card = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00";
        let mut infos = vec![
            fake_port("mlx5_0", Some(&format!("{card}.0")), 1, 0xaa),
            fake_port("mlx5_1", Some(&format!("{card}.1")), 1, 0xaa),
            fake_port("mlx5_2", Some(&format!("{card}.2")), 1, 0xaa),
            fake_port(
                "mlx5_3",
                Some("/sys/devices/pci0000:80/0000:af:00.0"),
                1,
                0xbb,
            ),
        ];
        assign_nccl_identities(&mut infos, false);
        let ports: Vec<Port> = infos
            .into_iter()
            .enumerate()
            .map(|(i, info)| Port::new(i, info, crate::config::GdrSettings::default()))
            .collect();
        let identity: Vec<(u64, i32)> =
            ports.iter().map(|p| (p.props.guid, p.props.port)).collect();
        assert_eq!(identity, [(0xaa, 1), (0xaa, 2), (0xaa, 3), (0xbb, 1)]);
        for port in &ports[..3] {
            // SAFETY: `pci_path` points into the CString `port` owns.
            let pci = unsafe { CStr::from_ptr(port.props.pci_path) };
            assert_eq!(pci.to_str().unwrap(), format!("{card}.0"));
        }
    }

    #[test]
    fn ptr_support_and_the_flush_follow_the_gdr_decision() {
        use crate::config::GdrSettings;
        let mut info = fake_port("mlx5_0", None, 1, 0xaa);
        // Soft-RoCE: host memory only, no flush queue pair.
        info.dmabuf_probe = DmaBufProbe::Answered(95);
        let port = Port::new(0, info.clone(), GdrSettings::default());
        assert_eq!(port.props.ptr_support, 1);
        assert!(!port.gpu_setup().flush && !port.gpu_setup().cuda);
        // The test switch forces the flush queue pair on host memory, advertising nothing more.
        let forced = GdrSettings {
            flush_host_memory: true,
            ..GdrSettings::default()
        };
        let port = Port::new(0, info.clone(), forced);
        assert_eq!(port.props.ptr_support, 1);
        assert!(port.gpu_setup().flush);
        // A GPU host: peer memory and dma-buf, each receive comm flushes.
        info.peer_memory = Some("/sys/module/nvidia_peermem/version".into());
        info.dmabuf_probe = DmaBufProbe::Answered(9);
        let port = Port::new(0, info.clone(), GdrSettings::default());
        assert_eq!(port.props.ptr_support, 1 | 2 | 4);
        let setup = port.gpu_setup();
        assert!(setup.flush && setup.cuda && setup.relaxed_ordering);
        assert!(port.to_string().contains("gpu flush on"), "{port}");
        // NCCL_GDR_FLUSH_DISABLE=1: GPU memory still advertised, no flush.
        let no_flush = GdrSettings {
            flush_disable: 1,
            ..GdrSettings::default()
        };
        let port = Port::new(0, info, no_flush);
        assert_eq!(port.props.ptr_support, 7);
        assert!(!port.gpu_setup().flush);
    }
}

/// A virtual device fusing physical ports (NCCL's `makeVDevice`): a connection on it opens
/// queue pairs on every member and stripes each message over them (`comm::connect`).
#[derive(Debug)]
pub struct FusedDevice {
    /// The member ports' device indices, in NCCL's order.
    pub members: Vec<usize>,
    /// `getProperties` of the fused device (pointing into `_name`).
    pub props: DeviceProps,
    _name: PropString,
}

// SAFETY: `props` points only into the strings this value or its members own (heap buffers that
// do not move and are never written); everything else is immutable.
unsafe impl Send for FusedDevice {}
// SAFETY: as above.
unsafe impl Sync for FusedDevice {}

impl FusedDevice {
    /// Fuse `ports[members[..]]`, as NCCL's IB transport does: the name joins the members' with
    /// `+`, the speed is their sum, the rail is kept when all share it; the rest is the first
    /// member's (its PCI path places the device; the pointer types are what every member offers).
    /// The members must exist, differ, and share one link layer.
    pub fn new(ports: &[Port], members: &[usize]) -> Result<Self, String> {
        if members.is_empty() || members.len() > 8 {
            return Err(format!(
                "a fused device takes 1 to 8 ports, not {}",
                members.len()
            ));
        }
        let mut parts = Vec::with_capacity(members.len());
        for (i, &m) in members.iter().enumerate() {
            let port = ports.get(m).ok_or_else(|| {
                format!(
                    "device {m} is not a physical port (there are {})",
                    ports.len()
                )
            })?;
            if members[..i].contains(&m) {
                return Err(format!("device {m} is listed twice"));
            }
            parts.push(port);
        }
        let first = parts[0];
        if let Some(other) = parts
            .iter()
            .find(|p| p.info.link_layer != first.info.link_layer)
        {
            return Err(format!(
                "{} and {} use different link layers (InfiniBand and RoCE cannot be fused)",
                first.info.name, other.info.name
            ));
        }
        let joined: Vec<&str> = parts.iter().map(|p| p.info.name.as_str()).collect();
        let name =
            PropString::new(CString::new(joined.join("+").replace('\0', "")).unwrap_or_default());
        let mut member_list = [0; 8];
        for (slot, &m) in member_list.iter_mut().zip(members) {
            *slot = c_int::try_from(m).unwrap_or(c_int::MAX);
        }
        let rail = first.props.rail_id;
        let props = DeviceProps {
            name: name.as_ptr(),
            speed_mbps: parts
                .iter()
                .fold(0i32, |sum, p| sum.saturating_add(p.props.speed_mbps)),
            ptr_support: parts.iter().fold(first.props.ptr_support, |bits, p| {
                bits & p.props.ptr_support
            }),
            max_comms: parts
                .iter()
                .map(|p| p.props.max_comms)
                .min()
                .unwrap_or(first.props.max_comms),
            members: member_list,
            member_count: c_int::try_from(members.len()).unwrap_or(8),
            rail_id: if parts.iter().all(|p| p.props.rail_id == rail) {
                rail
            } else {
                NCCL_NET_ID_UNDEF
            },
            // NCCL 2.30's IB transport gives a fused device a plane bit mask of its own making;
            // Rivet has no plane data for fused ports, so it reports "unknown".
            plane_id: NCCL_NET_ID_UNDEF,
            ..first.props
        };
        Ok(Self {
            members: members.to_vec(),
            props,
            _name: name,
        })
    }
}
