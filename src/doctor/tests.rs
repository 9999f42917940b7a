//! The doctor over fake sysfs trees: a RoCE NIC and a GPU under one PCIe switch. The device list
//! is given as discovery would return it (a name and the sysfs directory its `ibdev_path` names).

use super::*;
use pci::tests::config_space;

/// A fresh, empty directory under the system temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rivet-doctor-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: impl AsRef<[u8]>) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// The device list discovery returns for one device whose `ibdev_path` is `ibdev_path`.
fn listed(root: &Path, name: &str, ibdev_path: &str) -> Result<Vec<ListedDevice>, DiscoverError> {
    Ok(vec![ListedDevice {
        name: name.to_owned(),
        sysfs_dir: Sysfs::at(root).device_dir(Some(Path::new(ibdev_path)), name),
    }])
}

/// mlx5_0 (port ACTIVE, RoCE on eth2 with MTU `mtu`) and one NVIDIA GPU behind the switch ports
/// 0000:02:01.0 and 0000:02:02.0, the first with ACS control `acs`; the NIC's IOMMU group
/// translates DMA. The device's files are in `<root>/<ibdev_path>`.
fn tree(name: &str, ibdev_path: &str, acs: u16, mtu: u32, peer_memory: bool) -> PathBuf {
    let root = scratch(name);
    let sw = root.join("sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0");
    let nic = sw.join("0000:02:01.0/0000:03:00.0");
    let gpu = sw.join("0000:02:02.0/0000:04:00.0");
    write(
        &sw.join("0000:02:01.0/config"),
        config_space(false, Some(acs)),
    );
    write(
        &sw.join("0000:02:02.0/config"),
        config_space(false, Some(0)),
    );
    write(&nic.join("config"), config_space(true, None));
    write(&gpu.join("vendor"), "0x10de\n");
    write(&gpu.join("class"), "0x030200\n");
    let groups = root.join("sys/kernel/iommu_groups/7");
    write(&groups.join("type"), "DMA-FQ\n");
    std::os::unix::fs::symlink(&groups, nic.join("iommu_group")).unwrap();
    write(&root.join("sys/class/iommu/dmar0/x"), "");
    let pci_devices = root.join("sys/bus/pci/devices");
    fs::create_dir_all(&pci_devices).unwrap();
    std::os::unix::fs::symlink(&gpu, pci_devices.join("0000:04:00.0")).unwrap();
    std::os::unix::fs::symlink(&nic, pci_devices.join("0000:03:00.0")).unwrap();
    let dev = root.join(ibdev_path.trim_start_matches('/'));
    fs::create_dir_all(&dev).unwrap();
    std::os::unix::fs::symlink(&nic, dev.join("device")).unwrap();
    let port = dev.join("ports/1");
    write(&port.join("state"), "4: ACTIVE\n");
    write(&port.join("link_layer"), "Ethernet\n");
    write(&port.join("gid_attrs/types/0"), "IB/RoCE v1\n");
    write(&port.join("gid_attrs/types/1"), "RoCE v2\n");
    write(&port.join("gid_attrs/ndevs/0"), "eth2\n");
    write(&root.join("sys/class/net/eth2/mtu"), format!("{mtu}\n"));
    if peer_memory {
        write(&root.join("sys/module/nvidia_peermem/version"), "1.0\n");
    }
    root
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {checks:#?}"))
}

#[test]
fn acs_redirect_on_the_switch_port_fails() {
    let root = tree("acs", KERNEL_PATH, 0x001d, 9000, true);
    let checks = run_checks(&root, &listed(&root, "mlx5_0", KERNEL_PATH));
    let acs = find(&checks, "acs 0000:02:01.0");
    assert_eq!(acs.status, Status::Fail, "{acs:?}");
    assert_eq!(find(&checks, "acs 0000:02:02.0").status, Status::Ok);
    assert_eq!(find(&checks, "devices").status, Status::Ok);
    assert_eq!(find(&checks, "roce-v2 mlx5_0:1").status, Status::Ok);
    assert_eq!(find(&checks, "mtu mlx5_0:1").status, Status::Ok);
    assert_eq!(find(&checks, "gpu-memory").status, Status::Ok);
    assert!(
        find(&checks, "gpu-memory")
            .detail
            .starts_with("1 NVIDIA GPU(s), peer-memory module loaded")
    );
    assert_eq!(find(&checks, "iommu").status, Status::Warn);
    assert_eq!(find(&checks, "relaxed-ordering mlx5_0").status, Status::Ok);
    assert!(json(&checks).contains("\"check\":\"acs 0000:02:01.0\",\"status\":\"FAIL\""));
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn clean_switch_small_mtu_and_no_peer_memory() {
    let root = tree("clean", KERNEL_PATH, 0x0011, 1500, false);
    let checks = run_checks(&root, &listed(&root, "mlx5_0", KERNEL_PATH));
    assert_eq!(find(&checks, "acs 0000:02:01.0").status, Status::Ok);
    assert_eq!(find(&checks, "mtu mlx5_0:1").status, Status::Warn);
    assert_eq!(find(&checks, "gpu-memory").status, Status::Warn);
    assert!(!checks.iter().any(|c| c.name == "acs topology"));
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn empty_root_says_there_is_no_device() {
    let root = scratch("empty");
    let none = Err(DiscoverError::NoInfinibandClass {
        path: Sysfs::at(&root).class_dir(),
    });
    let checks = run_checks(&root, &none);
    let devices = find(&checks, "devices");
    assert_eq!(devices.status, Status::Warn);
    assert!(devices.detail.starts_with("no RDMA device: "));
    assert!(devices.detail.contains("no RDMA driver loaded"));
    assert_eq!(find(&checks, "gpu-memory").status, Status::Ok);
    assert_eq!(find(&checks, "acs").status, Status::Ok);
    fs::remove_dir_all(&root).unwrap();
}

/// Where the kernel's devices are (`ibdev_path` of mlx5_0).
const KERNEL_PATH: &str = "/sys/class/infiniband/mlx5_0";

#[test]
fn a_device_outside_the_class_directory_is_checked_where_its_ibdev_path_points() {
    // A user-space provider's device (the verbs fabric): its tree is elsewhere and the root has
    // no class directory at all.
    let own = "/run/fabric/sys/class/infiniband/mlx5_0";
    let root = tree("ibdev", own, 0x001d, 9000, true);
    assert!(!root.join("sys/class/infiniband").exists());
    let checks = run_checks(&root, &listed(&root, "mlx5_0", own));
    assert_eq!(find(&checks, "devices").status, Status::Ok);
    assert_eq!(find(&checks, "port mlx5_0:1").status, Status::Ok);
    assert_eq!(find(&checks, "roce-v2 mlx5_0:1").status, Status::Ok);
    // The PCI checks follow the `device` link found there.
    assert_eq!(find(&checks, "acs 0000:02:01.0").status, Status::Fail);
    assert_eq!(find(&checks, "relaxed-ordering mlx5_0").status, Status::Ok);
    assert_eq!(find(&checks, "iommu").status, Status::Warn);
    // The same tree, listed with the kernel's path, has no device there.
    let checks = run_checks(&root, &listed(&root, "mlx5_0", KERNEL_PATH));
    assert_eq!(find(&checks, "devices").status, Status::Warn);
    assert!(
        !checks
            .iter()
            .any(|c| c.name.starts_with("relaxed-ordering mlx5_0"))
    );
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn env_names_match_like_nccl() {
    let existing = vec!["mlx5_0".to_owned(), "mlx5_1".to_owned()];
    assert!(missing_names("NCCL_IB_HCA", "mlx5", &existing).is_empty());
    assert!(missing_names("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1", &existing).is_empty());
    let missing = missing_names("NCCL_IB_HCA", "=mlx5", &existing);
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].name, "mlx5");
    let excluded = missing_names("NCCL_IB_HCA", "^mlx5_9", &existing);
    assert!(excluded[0].excluded);
    assert_eq!(checks::env_names(&excluded).status, Status::Warn);
}
