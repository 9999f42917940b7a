//! The process-wide table of RDMA ports Rivet exposes to NCCL, opened on the first `init`.

use crate::props::DeviceProps;
use std::fmt;

/// Why Rivet has no device to offer. Each variant's text is the one line NCCL's log shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoDevice {
    /// The kernel exposes no RDMA devices at all.
    NoSysfs,
    /// `libibverbs.so.1` could not be loaded.
    NoLibrary(String),
    /// Devices exist but none has an ACTIVE InfiniBand or Ethernet port that passes `NCCL_IB_HCA`.
    NoActivePort(String),
    /// `RIVET_DISABLE`/`NCCL_IB_DISABLE` asked for no devices.
    Disabled(&'static str),
}

impl fmt::Display for NoDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSysfs => f.write_str(
                "no RDMA device: /sys/class/infiniband does not exist (no RDMA NIC, or its kernel driver is not loaded)",
            ),
            Self::NoLibrary(why) => write!(f, "no RDMA device usable: libibverbs.so.1 could not be loaded ({why}); install rdma-core/libibverbs1"),
            Self::NoActivePort(why) => write!(f, "no RDMA device usable: {why}"),
            Self::Disabled(var) => write!(f, "disabled by {var}=1"),
        }
    }
}

/// One port Rivet exposes, with its NCCL properties.
#[derive(Debug)]
pub struct Port {
    /// The properties reported through `getProperties`.
    pub props: DeviceProps,
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.props;
        // SAFETY: `name` and `pci_path` point to NUL-terminated strings the table owns for the
        // process lifetime (see `discover`).
        let (name, pci) = unsafe {
            (
                std::ffi::CStr::from_ptr(p.name).to_string_lossy(),
                std::ffi::CStr::from_ptr(p.pci_path).to_string_lossy(),
            )
        };
        write!(
            f,
            "{name} port {} speed {} Gb/s pci {pci}",
            p.port,
            p.speed_mbps / 1000
        )
    }
}

// SAFETY: `DeviceProps` holds pointers to strings the table owns for the process
// lifetime; the table is immutable once built, so sharing it between threads is fine.
unsafe impl Send for Port {}
// SAFETY: as above, `Port` is immutable after construction and its pointers target leaked,
// never-freed C strings.
unsafe impl Sync for Port {}

/// Find the ports Rivet can use.
pub fn discover() -> Result<Vec<Port>, NoDevice> {
    for var in ["RIVET_DISABLE", "NCCL_IB_DISABLE"] {
        if std::env::var(var).is_ok_and(|v| v.trim() == "1") {
            return Err(NoDevice::Disabled(if var == "RIVET_DISABLE" {
                "RIVET_DISABLE"
            } else {
                "NCCL_IB_DISABLE"
            }));
        }
    }
    if !std::path::Path::new("/sys/class/infiniband").is_dir() {
        return Err(NoDevice::NoSysfs);
    }
    Err(NoDevice::NoActivePort(
        "device discovery through libibverbs is not wired in yet".into(),
    ))
}
