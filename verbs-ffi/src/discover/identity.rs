//! The identity NCCL's own IB transport gives each port (`net_ib/init.cc`): a PCI path with the
//! function (and, by default, virtual-function) digits zeroed, and a port number made unique among
//! the ports that share that path.
//!
//! NCCL treats two devices with equal (`guid`, `port`) as one physical port: it shares their
//! bandwidth in the topology search and uses the pair in rail checks. The verbs port of each PF of
//! a multi-PF ConnectX is 1 and every PF reports the same `sys_image_guid`, so NCCL reports
//! `port = verbs port + realPort`, where `realPort` counts the earlier devices on the same merged
//! PCI path. Rivet reports the same numbers, so NCCL sees each PF at full bandwidth.

/// The PCI path NCCL reports for the realpath `path` of `/sys/class/infiniband/<dev>/device`: the
/// last character (the PCI function) set to `0`, so the ports of a multi-port NIC are one NIC, and
/// unless `split_vfs` (`NCCL_IB_MERGE_VFS=0`) the two device digits before the `.` too, so virtual
/// functions merge with their physical function.
pub fn nccl_pci_path(path: &str, split_vfs: bool) -> String {
    let mut bytes = path.as_bytes().to_vec();
    let n = bytes.len();
    if n >= 1 {
        bytes[n - 1] = b'0';
    }
    if !split_vfs && n >= 4 {
        bytes[n - 3] = b'0';
        bytes[n - 4] = b'0';
    }
    String::from_utf8(bytes).unwrap_or_else(|_| path.to_owned())
}

/// Whether NCCL counts the device at merged path `other` as the same PCI device as `path`: it
/// compares all but the last 4 characters (the merged device and function digits), or all but
/// the last one with `NCCL_IB_MERGE_VFS=0`.
fn same_pci_device(path: &str, other: &str, split_vfs: bool) -> bool {
    let ignored = if split_vfs { 1 } else { 4 };
    match path.len().checked_sub(ignored) {
        Some(n) => other.len() >= n && path.as_bytes()[..n] == other.as_bytes()[..n],
        None => path == other,
    }
}

/// Where one discovered port sits: its device's PCI realpath (`None` for a virtual device such
/// as Soft-RoCE) and its verbs port number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortLocation<'a> {
    /// Realpath of `/sys/class/infiniband/<dev>/device`.
    pub pci_path: Option<&'a str>,
    /// Verbs port number (from 1).
    pub port: u8,
}

/// How NCCL's IB transport would report one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclIdentity {
    /// The merged PCI path ([`nccl_pci_path`]); `None` without a PCI device.
    pub pci_path: Option<String>,
    /// `port + realPort`: the verbs port plus the number of earlier ports on the same merged PCI
    /// path.
    pub port: u32,
}

/// The NCCL-visible identity of each port of `ports`, given in the order the devices are
/// exposed (earlier ports on the same PCI device raise the numbers of later ones).
pub fn nccl_identities(ports: &[PortLocation<'_>], split_vfs: bool) -> Vec<NcclIdentity> {
    let merged: Vec<Option<String>> = ports
        .iter()
        .map(|p| p.pci_path.map(|path| nccl_pci_path(path, split_vfs)))
        .collect();
    merged
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let real_port = path.as_deref().map_or(0, |path| {
                merged[..i]
                    .iter()
                    .flatten()
                    .filter(|earlier| same_pci_device(path, earlier, split_vfs))
                    .count()
            });
            NcclIdentity {
                pci_path: path.clone(),
                port: u32::from(ports[i].port).saturating_add(real_port as u32),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PF0: &str = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0";
    const PF1: &str = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.1";
    const OTHER_NIC: &str = "/sys/devices/pci0000:80/0000:80:02.0/0000:af:00.0";
    const VF_A: &str = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.2";
    const VF_B: &str = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:01.3";

    fn at(pci_path: Option<&str>, port: u8) -> PortLocation<'_> {
        PortLocation { pci_path, port }
    }

    fn ports_of(ids: &[NcclIdentity]) -> Vec<u32> {
        ids.iter().map(|i| i.port).collect()
    }

    #[test]
    fn pci_path_merges_functions_and_virtual_functions_like_nccl() {
        assert_eq!(nccl_pci_path(PF1, true), PF0);
        assert_eq!(nccl_pci_path(VF_B, false), PF0);
        assert_eq!(
            nccl_pci_path(VF_B, true),
            "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:01.0"
        );
        assert_eq!(nccl_pci_path("", false), "");
    }

    #[test]
    fn the_two_pfs_of_one_card_get_distinct_ports() {
        // mlx5_0 and mlx5_1: two PFs of one dual-port ConnectX, each with verbs port 1 and the
        // same sys_image_guid. NCCL reports ports 1 and 2; a third NIC starts again at 1.
        let ids = nccl_identities(
            &[at(Some(PF0), 1), at(Some(PF1), 1), at(Some(OTHER_NIC), 1)],
            false,
        );
        assert_eq!(ports_of(&ids), [1, 2, 1]);
        assert_eq!(ids[0].pci_path.as_deref(), Some(PF0));
        assert_eq!(ids[1].pci_path.as_deref(), Some(PF0));
        assert_eq!(ids[2].pci_path.as_deref(), Some(OTHER_NIC));
    }

    #[test]
    fn a_dual_port_device_counts_its_first_port() {
        // One PCI function with two verbs ports: NCCL reports 1 and 2 + 1.
        let ids = nccl_identities(&[at(Some(PF0), 1), at(Some(PF0), 2)], false);
        assert_eq!(ports_of(&ids), [1, 3]);
    }

    #[test]
    fn virtual_functions_share_the_pf_numbering_unless_split() {
        let ports = [at(Some(PF0), 1), at(Some(VF_A), 1), at(Some(VF_B), 1)];
        assert_eq!(ports_of(&nccl_identities(&ports, false)), [1, 2, 3]);
        // NCCL_IB_MERGE_VFS=0: 3b:00.2 still merges with 3b:00.0 (same device digits), 3b:01.3
        // is a device of its own.
        let split = nccl_identities(&ports, true);
        assert_eq!(ports_of(&split), [1, 2, 1]);
        assert_eq!(
            split[2].pci_path.as_deref(),
            Some("/sys/devices/pci0000:00/0000:00:02.0/0000:3b:01.0")
        );
    }

    #[test]
    fn devices_without_a_pci_path_keep_their_verbs_port() {
        let ids = nccl_identities(&[at(None, 1), at(None, 1), at(Some(PF0), 1)], false);
        assert_eq!(ports_of(&ids), [1, 1, 1]);
        assert_eq!(ids[0].pci_path, None);
    }
}
