//! The RDMA ports Rivet exposes to NCCL: discovered on the first `init`, opened on first use.

use crate::abi::types::{NCCL_NET_ID_UNDEF, NCCL_PTR_HOST};
use crate::backend::device::OpenPort;
use crate::props::DeviceProps;
use rivet_verbs_ffi::discover::{AddrFamily, GidPolicy, HcaFilter};
use rivet_verbs_ffi::{DiscoverError, DiscoverOptions, PortInfo, VerbsError};
use std::ffi::CString;
use std::fmt;
use std::sync::{Arc, Mutex};

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
    _name: CString,
    /// `None` when the device has no PCI function (Soft-RoCE): NCCL then gets a NULL `pciPath`,
    /// as from its own IB transport, and places the NIC at the CPU.
    _pci_path: Option<CString>,
    opened: Mutex<Option<Arc<OpenPort>>>,
}

// SAFETY: `props` points only into the CStrings this value owns (heap buffers that do not move
// with the value); everything else is immutable or behind a mutex.
unsafe impl Send for Port {}
// SAFETY: as above.
unsafe impl Sync for Port {}

impl Port {
    fn new(index: usize, info: PortInfo) -> Self {
        let clean = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        let name = clean(&info.name);
        let merge_vfs = std::env::var("NCCL_IB_MERGE_VFS").map_or(true, |v| v.trim() != "0");
        let pci = info
            .pci_path
            .as_ref()
            .map(|p| clean(&nccl_pci_path(&p.display().to_string(), merge_vfs)));
        let mut members = [0; 8];
        members[0] = i32::try_from(index).unwrap_or(i32::MAX);
        let props = DeviceProps {
            name: name.as_ptr(),
            pci_path: pci.as_ref().map_or(core::ptr::null(), |p| p.as_ptr()),
            guid: info.guid,
            // Host memory only until GPUDirect (peer memory / DMA-BUF) registration is supported.
            ptr_support: NCCL_PTR_HOST,
            speed_mbps: i32::try_from(info.speed_mbps).unwrap_or(i32::MAX),
            port: i32::from(info.port),
            // What both the device and Rivet's connection table hold (NCCL reads it as a cap on
            // the channels it runs over the NIC).
            max_comms: i32::try_from(info.max_qp.min(crate::registry::MAX_ENTRIES as u32))
                .unwrap_or(i32::MAX),
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
            opened: Mutex::new(None),
        }
    }

    /// The opened device (context + protection domain), opening it on first use.
    pub(crate) fn open(&self) -> Result<Arc<OpenPort>, VerbsError> {
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(port) = opened.as_ref() {
            return Ok(Arc::clone(port));
        }
        let port = OpenPort::open(&self.info)?;
        *opened = Some(Arc::clone(&port));
        Ok(port)
    }
}

/// The PCI path NCCL's own IB transport reports, so topology detection places Rivet's NICs
/// exactly where it would place its own: the function digit set to 0 (the ports of a multi-port
/// NIC are one NIC), and with `NCCL_IB_MERGE_VFS` (default on) the device digits too (virtual
/// functions merge with their physical function).
pub(crate) fn nccl_pci_path(path: &str, merge_vfs: bool) -> String {
    let mut bytes = path.as_bytes().to_vec();
    let n = bytes.len();
    if n >= 1 {
        bytes[n - 1] = b'0';
    }
    if merge_vfs && n >= 4 {
        bytes[n - 3] = b'0';
        bytes[n - 4] = b'0';
    }
    String::from_utf8(bytes).unwrap_or_else(|_| path.to_owned())
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
        // Opening the port (context + protection domain, kept for later comms) tells which data
        // path its connections take.
        let path = self.open().map_or("unavailable", |p| p.path_name());
        let mut ptr = String::from("host");
        if i.ptr_support.cuda() {
            ptr.push_str("+cuda(not used yet)");
        }
        if i.ptr_support.dmabuf() {
            ptr.push_str("+dmabuf(not used yet)");
        }
        write!(
            f,
            "{} port {} {link} {} Gb/s gid[{}] {} ({}) mtu {} pci {pci} ptr {ptr} path {path}",
            i.name,
            i.port,
            f64::from(i.speed_mbps) / 1000.0,
            i.gid_index,
            i.gid_string,
            i.why,
            128u32 << i.active_mtu.min(5),
        )
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Discovery options from `NCCL_IB_HCA`, `NCCL_IB_GID_INDEX`, `NCCL_IB_ROCE_VERSION_NUM` and
/// `NCCL_IB_ADDR_FAMILY`.
fn options_from_env() -> Result<DiscoverOptions, NoDevice> {
    let mut options = DiscoverOptions::default();
    if let Some(spec) = env("NCCL_IB_HCA") {
        options.filter = HcaFilter::parse(&spec)
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
    let found = rivet_verbs_ffi::discover(&options).map_err(NoDevice::Discovery)?;
    Ok(found
        .into_iter()
        .enumerate()
        .map(|(i, info)| Port::new(i, info))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::nccl_pci_path;

    #[test]
    fn pci_path_merges_functions_and_virtual_functions_like_nccl() {
        let path = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.1";
        assert_eq!(
            nccl_pci_path(path, false),
            "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0"
        );
        let vf = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:01.3";
        assert_eq!(
            nccl_pci_path(vf, true),
            "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0"
        );
        assert_eq!(nccl_pci_path("", true), "");
    }
}
