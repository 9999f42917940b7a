//! Device discovery: every usable port, described the way an NCCL net plugin reports it.
//!
//! The decisions (GID choice, speed tables, device identity; the `NCCL_IB_HCA` list syntax in
//! `crate::name_list`) live in pure modules with unit tests; [`discover`] only gathers the
//! inputs from libibverbs and sysfs and applies them.

pub mod gid;
pub mod identity;
pub mod speed;
pub mod sysfs;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::context::Context;
use crate::device::DeviceList;
use crate::error::VerbsError;
use crate::loader::verbs;
use crate::mr::{DmaBufProbe, dmabuf_probe};
use crate::pd::ProtectionDomain;
use crate::sys::{gid_type, link_layer, port_state};

pub use crate::name_list::{NameEntry, NameList, NameListError};
pub use gid::{AddrFamily, GidChoice, GidPolicy};
pub use identity::{NcclIdentity, PortLocation, nccl_identities, nccl_pci_path};
pub use sysfs::Sysfs;

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
}

impl LinkLayer {
    /// From `ibv_port_attr::link_layer`; `None` for unspecified or unknown values.
    pub fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            link_layer::INFINIBAND => Some(Self::InfiniBand),
            link_layer::ETHERNET => Some(Self::Ethernet),
            _ => None,
        }
    }

    /// The `ibv_port_attr::link_layer` value.
    pub fn raw(self) -> u8 {
        match self {
            Self::InfiniBand => link_layer::INFINIBAND,
            Self::Ethernet => link_layer::ETHERNET,
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InfiniBand => "InfiniBand",
            Self::Ethernet => "RoCE",
        })
    }
}

/// Which buffer kinds a port can register, as NCCL's `ptrSupport` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtrSupport(pub u32);

impl PtrSupport {
    /// `NCCL_PTR_HOST`.
    pub const HOST: u32 = 0x1;
    /// `NCCL_PTR_CUDA`: a GPU peer-memory module is loaded.
    pub const CUDA: u32 = 0x2;
    /// `NCCL_PTR_DMABUF`: `ibv_reg_dmabuf_mr` exists and the device accepts it.
    pub const DMABUF: u32 = 0x4;

    /// Whether CUDA pointers can be registered directly.
    pub fn cuda(self) -> bool {
        self.0 & Self::CUDA != 0
    }

    /// Whether dma-buf registration works.
    pub fn dmabuf(self) -> bool {
        self.0 & Self::DMABUF != 0
    }
}

/// One usable port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Port number (from 1).
    pub port: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Speed in Mb/s (0 if the port reports no known speed/width bits).
    pub speed_mbps: u32,
    /// GID index to use as `sgid_index`.
    pub gid_index: u32,
    /// The GID bytes.
    pub gid: [u8; 16],
    /// The GID as text (`::ffff:10.0.0.1`, `fe80::...`).
    pub gid_string: String,
    /// RoCE version of the GID (RoCE ports, when known).
    pub roce_version: Option<u8>,
    /// Why this GID was chosen.
    pub why: String,
    /// Realpath of the `device` link in the device's sysfs directory (its `ibdev_path`); `None`
    /// for virtual devices.
    pub pci_path: Option<PathBuf>,
    /// The PCI path NCCL's IB transport would report ([`identity::nccl_pci_path`]).
    pub nccl_pci_path: Option<String>,
    /// The port number NCCL's IB transport would report: [`port`](Self::port) plus the number of
    /// earlier ports on the same merged PCI path ([`identity::nccl_identities`]).
    pub nccl_port: u32,
    /// `sys_image_guid` as the library returns it (big-endian value); equal on all ports of a NIC.
    pub guid: u64,
    /// `max_qp` of the device.
    pub max_qp: u32,
    /// [`crate::sys::mtu`] code of the port.
    pub active_mtu: u32,
    /// LID (InfiniBand).
    pub lid: u16,
    /// `ibv_port_attr::flags` (e.g. GRH required).
    pub port_flags: u8,
    /// Registrable pointer kinds the host offers (peer memory, dma-buf); whether they are
    /// advertised to NCCL is `rivet_core::gdr`'s decision.
    pub ptr_support: PtrSupport,
    /// The peer-memory client file found (`/sys/module/nvidia_peermem/version`, …), if any.
    pub peer_memory: Option<String>,
    /// The dma-buf registration probe's answer for this device.
    pub dmabuf_probe: DmaBufProbe,
    /// Whether libibverbs has `ibv_reg_mr_iova2` (PCIe relaxed ordering).
    pub has_reg_mr_iova2: bool,
    /// Rail id from a selecting `NCCL_IB_HCA` entry.
    pub rail: Option<i32>,
    /// Plane id from a selecting `NCCL_IB_HCA` entry.
    pub plane: Option<i32>,
}

/// What to look for.
#[derive(Debug, Clone, Default)]
pub struct DiscoverOptions {
    /// `NCCL_IB_HCA` filter.
    pub filter: NameList,
    /// GID selection for RoCE ports (a forced index also applies to InfiniBand ports).
    pub gid: GidPolicy,
    /// Where sysfs is.
    pub sysfs: Sysfs,
    /// `NCCL_IB_MERGE_VFS=0`: virtual functions are PCI devices of their own, not merged with
    /// their physical function, in the identity reported to NCCL.
    pub split_vfs: bool,
}

/// Why no port is usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoverError {
    /// libibverbs could not be loaded.
    Library(VerbsError),
    /// `/sys/class/infiniband` does not exist: no RDMA driver is loaded.
    NoInfinibandClass {
        /// The directory looked at.
        path: PathBuf,
    },
    /// Listing devices failed.
    DeviceList(VerbsError),
    /// libibverbs sees no device (no provider for the hardware, or no permission on `/dev/infiniband`).
    NoDevices,
    /// Devices exist but none has an ACTIVE IB/Ethernet port; one note per device or port.
    NoActivePort {
        /// What was found instead.
        notes: Vec<String>,
    },
    /// Active ports exist but the `NCCL_IB_HCA` filter removed all of them.
    AllFilteredOut {
        /// The filter.
        filter: String,
        /// The active ports it removed (`name:port`).
        ports: Vec<String>,
    },
    /// Active, selected ports exist but none is usable (e.g. no suitable GID).
    NoUsablePort {
        /// One note per port.
        notes: Vec<String>,
    },
}

impl fmt::Display for DiscoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Library(e) => write!(f, "RDMA unavailable: {e}"),
            Self::NoInfinibandClass { path } => {
                write!(
                    f,
                    "RDMA unavailable: {} does not exist (no RDMA driver loaded)",
                    path.display()
                )
            }
            Self::DeviceList(e) => write!(f, "cannot list RDMA devices: {e}"),
            Self::NoDevices => f.write_str("libibverbs found no RDMA devices"),
            Self::NoActivePort { notes } => {
                write!(f, "no ACTIVE InfiniBand/RoCE port: {}", notes.join("; "))
            }
            Self::AllFilteredOut { filter, ports } => {
                write!(
                    f,
                    "NCCL_IB_HCA={filter:?} removed every active port ({})",
                    ports.join(", ")
                )
            }
            Self::NoUsablePort { notes } => write!(f, "no usable RDMA port: {}", notes.join("; ")),
        }
    }
}

impl std::error::Error for DiscoverError {}

/// One device libibverbs lists, with the directory its sysfs files are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedDevice {
    /// Device name (`mlx5_0`, `rxe0`, `rfab0`).
    pub name: String,
    /// Its sysfs directory ([`Sysfs::device_dir`]: its `ibdev_path` under the root), holding
    /// `ports/<p>/…` and the `device` link to its PCI function.
    pub sysfs_dir: PathBuf,
}

/// Every device libibverbs lists (in its order), whatever the state of its ports, with the sysfs
/// directory discovery reads for it: what the `rivet` command's checks and counters look at, so
/// they see exactly the devices the plugin sees. The error says why there is none, as
/// [`discover`]'s does.
pub fn list_devices(sysfs: &Sysfs) -> Result<Vec<ListedDevice>, DiscoverError> {
    verbs().map_err(DiscoverError::Library)?;
    let list = device_list(sysfs)?;
    Ok(list
        .iter()
        .map(|device| {
            let name = device.name();
            ListedDevice {
                sysfs_dir: sysfs.device_dir(device.ibdev_path().as_deref(), &name),
                name,
            }
        })
        .collect())
}

/// libibverbs' device list, or why it is empty. The device list, not sysfs, says which devices
/// exist: a user-space provider has devices the kernel does not know. The class directory only
/// explains an empty or failed list.
fn device_list(sysfs: &Sysfs) -> Result<DeviceList, DiscoverError> {
    let no_class = || DiscoverError::NoInfinibandClass {
        path: sysfs.class_dir(),
    };
    let list = match DeviceList::new() {
        Ok(list) => list,
        Err(_) if !sysfs.has_infiniband_class() => return Err(no_class()),
        Err(e) => return Err(DiscoverError::DeviceList(e)),
    };
    if list.is_empty() {
        return Err(if sysfs.has_infiniband_class() {
            DiscoverError::NoDevices
        } else {
            no_class()
        });
    }
    Ok(list)
}

/// Finds every ACTIVE InfiniBand or RoCE port that passes `options.filter`, with its GID, speed and
/// properties. Ports are returned in device-list order, then port order.
pub fn discover(options: &DiscoverOptions) -> Result<Vec<PortInfo>, DiscoverError> {
    let verbs = verbs().map_err(DiscoverError::Library)?;
    let list = device_list(&options.sysfs)?;
    let peer_memory = options
        .sysfs
        .peer_memory_file()
        .map(|p| p.display().to_string());
    let cuda = peer_memory.is_some();
    let mut found = Vec::new();
    let mut inactive_notes = Vec::new();
    let mut filtered = Vec::new();
    let mut unusable_notes = Vec::new();
    for device in list.iter() {
        let name = device.name();
        let device_dir = options
            .sysfs
            .device_dir(device.ibdev_path().as_deref(), &name);
        let context = match device.open() {
            Ok(c) => c,
            Err(e) => {
                inactive_notes.push(format!("{name}: {e}"));
                continue;
            }
        };
        let attr = match context.query_device() {
            Ok(a) => a,
            Err(e) => {
                inactive_notes.push(format!("{name}: {e}"));
                continue;
            }
        };
        let mut dmabuf: Option<DmaBufProbe> = None;
        for port in 1..=attr.phys_port_cnt {
            let port_attr = match context.query_port_ex(port) {
                Ok(p) => p,
                Err(e) => {
                    inactive_notes.push(format!("{name}:{port}: {e}"));
                    continue;
                }
            };
            if port_attr.state != port_state::ACTIVE {
                inactive_notes.push(format!(
                    "{name}:{port}: state {}",
                    port_state_name(port_attr.state)
                ));
                continue;
            }
            let Some(link) = LinkLayer::from_raw(port_attr.link_layer) else {
                inactive_notes.push(format!(
                    "{name}:{port}: link layer {}",
                    port_attr.link_layer
                ));
                continue;
            };
            if !options.filter.keeps(&name, Some(u32::from(port))) {
                filtered.push(format!("{name}:{port}"));
                continue;
            }
            let choice = match choose_gid(
                &context,
                &device_dir,
                port,
                link,
                port_attr.gid_tbl_len,
                &options.gid,
            ) {
                Ok(c) => c,
                Err(note) => {
                    unusable_notes.push(format!("{name}:{port}: {note}"));
                    continue;
                }
            };
            let probe = *dmabuf.get_or_insert_with(|| {
                if verbs.reg_dmabuf_mr.is_none() {
                    return DmaBufProbe::NoSymbol;
                }
                ProtectionDomain::new(&context)
                    .map_or(DmaBufProbe::NotProbed, |pd| dmabuf_probe(&pd))
            });
            let dmabuf = probe.accepted();
            let mut ptr_support = PtrSupport::HOST;
            if cuda {
                ptr_support |= PtrSupport::CUDA;
            }
            if dmabuf {
                ptr_support |= PtrSupport::DMABUF;
            }
            let entry = options.filter.entry_for(&name, u32::from(port));
            found.push(PortInfo {
                name: name.clone(),
                port,
                link_layer: link,
                speed_mbps: speed::port_speed_mbps(
                    port_attr.active_speed,
                    port_attr.active_speed_ex,
                    port_attr.active_width,
                )
                .unwrap_or(0),
                gid_index: choice.index,
                gid: choice.gid,
                gid_string: gid::gid_to_string(&choice.gid),
                roce_version: choice.roce_version,
                why: choice.why,
                pci_path: sysfs::pci_path(&device_dir),
                // Filled in below, once every port is known.
                nccl_pci_path: None,
                nccl_port: u32::from(port),
                guid: attr.sys_image_guid,
                max_qp: u32::try_from(attr.max_qp).unwrap_or(0),
                active_mtu: port_attr.active_mtu,
                lid: port_attr.lid,
                port_flags: port_attr.flags,
                ptr_support: PtrSupport(ptr_support),
                peer_memory: peer_memory.clone(),
                dmabuf_probe: probe,
                has_reg_mr_iova2: verbs.reg_mr_iova2.is_some(),
                rail: entry.and_then(|e| e.rail),
                plane: entry.and_then(|e| e.plane),
            });
        }
    }
    if !found.is_empty() {
        assign_nccl_identities(&mut found, options.split_vfs);
        return Ok(found);
    }
    if !unusable_notes.is_empty() {
        return Err(DiscoverError::NoUsablePort {
            notes: unusable_notes,
        });
    }
    if !filtered.is_empty() {
        return Err(DiscoverError::AllFilteredOut {
            filter: options.filter.to_string(),
            ports: filtered,
        });
    }
    Err(DiscoverError::NoActivePort {
        notes: inactive_notes,
    })
}

/// Gives every port of `ports` (in exposure order) the PCI path and port number NCCL's IB
/// transport would report for it ([`identity::nccl_identities`]).
pub fn assign_nccl_identities(ports: &mut [PortInfo], split_vfs: bool) {
    let paths: Vec<Option<String>> = ports
        .iter()
        .map(|p| p.pci_path.as_ref().map(|path| path.display().to_string()))
        .collect();
    let locations: Vec<PortLocation<'_>> = ports
        .iter()
        .zip(&paths)
        .map(|(p, path)| PortLocation {
            pci_path: path.as_deref(),
            port: p.port,
        })
        .collect();
    let identities = nccl_identities(&locations, split_vfs);
    for (port, identity) in ports.iter_mut().zip(identities) {
        port.nccl_pci_path = identity.pci_path;
        port.nccl_port = identity.port;
    }
}

fn port_state_name(state: u32) -> &'static str {
    match state {
        port_state::NOP => "NOP",
        port_state::DOWN => "DOWN",
        port_state::INIT => "INIT",
        port_state::ARMED => "ARMED",
        port_state::ACTIVE => "ACTIVE",
        port_state::ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

/// Reads the port's GID table and applies the policy; the error is a note for the caller.
fn choose_gid(
    context: &Context,
    device_dir: &Path,
    port: u8,
    link: LinkLayer,
    table_len: i32,
    policy: &GidPolicy,
) -> Result<GidChoice, String> {
    let table_len = u32::try_from(table_len).unwrap_or(0);
    if link == LinkLayer::InfiniBand {
        let (index, why) = match policy.index {
            Some(index) => (index, "GID index was requested"),
            None => {
                let routable = (gid::IB_ROUTABLE_GID_INDEX < table_len)
                    .then(|| context.query_gid(port, gid::IB_ROUTABLE_GID_INDEX).ok())
                    .flatten()
                    .map(|g| g.raw);
                gid::choose_ib_gid_index(routable.as_ref())
            }
        };
        let gid = context.query_gid(port, index).map_err(|e| e.to_string())?;
        return Ok(GidChoice {
            index,
            gid: gid.raw,
            roce_version: None,
            why: why.to_owned(),
        });
    }
    let mut table = Vec::with_capacity(table_len as usize);
    for index in 0..table_len {
        table.push(read_roce_gid(context, device_dir, port, index)?);
    }
    gid::choose_roce_gid(&table, policy).map_err(|e| e.to_string())
}

/// One RoCE GID entry with its version: from `_ibv_query_gid_ex` when present, else from
/// `ibv_query_gid` plus sysfs.
fn read_roce_gid(
    context: &Context,
    device_dir: &Path,
    port: u8,
    index: u32,
) -> Result<gid::GidCandidate, String> {
    match context.query_gid_ex(port, index) {
        Ok(entry) => {
            let roce_version = match entry.gid_type {
                gid_type::ROCE_V2 => Some(2),
                // On an Ethernet port the "IB" type is RoCE v1.
                gid_type::ROCE_V1 | gid_type::IB => Some(1),
                _ => None,
            };
            return Ok(gid::GidCandidate {
                index,
                gid: entry.gid.raw,
                roce_version,
            });
        }
        Err(e) if e.errno() == Some(libc::ENODATA) => {
            return Ok(gid::GidCandidate {
                index,
                gid: [0; 16],
                roce_version: None,
            });
        }
        Err(_) => {} // absent or failing: fall back to the compat path
    }
    let gid = context.query_gid(port, index).map_err(|e| e.to_string())?;
    Ok(gid::GidCandidate {
        index,
        gid: gid.raw,
        roce_version: sysfs::gid_roce_version(device_dir, port, index),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_layers_round_trip() {
        assert_eq!(LinkLayer::from_raw(1), Some(LinkLayer::InfiniBand));
        assert_eq!(LinkLayer::from_raw(2), Some(LinkLayer::Ethernet));
        assert_eq!(LinkLayer::from_raw(0), None);
        assert_eq!(LinkLayer::Ethernet.raw(), 2);
    }

    #[test]
    fn errors_explain_themselves() {
        let e = DiscoverError::AllFilteredOut {
            filter: "=mlx5_1".into(),
            ports: vec!["mlx5_10:1".into()],
        };
        assert_eq!(
            e.to_string(),
            "NCCL_IB_HCA=\"=mlx5_1\" removed every active port (mlx5_10:1)"
        );
        let e = DiscoverError::NoInfinibandClass {
            path: "/sys/class/infiniband".into(),
        };
        assert!(e.to_string().contains("no RDMA driver"));
        let e = DiscoverError::NoActivePort {
            notes: vec!["rxe0:1: state DOWN".into()],
        };
        assert!(e.to_string().ends_with("rxe0:1: state DOWN"));
    }

    #[test]
    fn ptr_support_bits_match_nccl() {
        assert_eq!(
            (PtrSupport::HOST, PtrSupport::CUDA, PtrSupport::DMABUF),
            (1, 2, 4)
        );
        let p = PtrSupport(PtrSupport::HOST | PtrSupport::DMABUF);
        assert!(p.dmabuf() && !p.cuda());
    }

    #[test]
    fn the_device_listing_is_libibverbs_list_read_where_discovery_reads() {
        // Whatever libibverbs this host loads: the listing names its devices in its order, each
        // with the directory discovery reads (ibdev_path under the root), or fails as discovery
        // does.
        let sysfs = Sysfs::at("/nonexistent-rivet-root");
        let listed = list_devices(&sysfs);
        let Ok(list) = DeviceList::new() else {
            assert!(listed.is_err(), "{listed:?}");
            return;
        };
        if list.is_empty() {
            let discovered = discover(&DiscoverOptions {
                sysfs: sysfs.clone(),
                ..DiscoverOptions::default()
            });
            assert_eq!(listed, Err(discovered.unwrap_err()));
            return;
        }
        let listed = listed.expect("devices listed");
        assert_eq!(listed.len(), list.len());
        for (entry, device) in listed.iter().zip(list.iter()) {
            assert_eq!(entry.name, device.name());
            assert_eq!(
                entry.sysfs_dir,
                sysfs.device_dir(device.ibdev_path().as_deref(), &entry.name)
            );
            assert!(entry.sysfs_dir.starts_with("/nonexistent-rivet-root"));
        }
    }

    #[test]
    fn an_empty_device_list_without_the_class_directory_names_it() {
        // Only meaningful where libibverbs loads and lists no device; elsewhere another outcome
        // (the library error, or the devices found) is right.
        let options = DiscoverOptions {
            sysfs: Sysfs::at("/nonexistent-rivet-root"),
            ..DiscoverOptions::default()
        };
        let listed = DeviceList::new().map(|l| l.len());
        match (listed, discover(&options)) {
            (Ok(0) | Err(_), Err(DiscoverError::NoInfinibandClass { path })) => {
                assert_eq!(
                    path,
                    PathBuf::from("/nonexistent-rivet-root/sys/class/infiniband")
                );
            }
            (_, Err(DiscoverError::Library(_))) => {}
            (Ok(n), outcome) if n > 0 => assert!(
                !matches!(outcome, Err(DiscoverError::NoInfinibandClass { .. })),
                "{n} devices listed, yet {outcome:?}"
            ),
            (listed, other) => panic!("listed {listed:?}: unexpected {other:?}"),
        }
    }
}
