//! The few sysfs files discovery reads, under a configurable root so tests can use a fake tree.
//!
//! A device's own files are read in the directory libibverbs reports for it (`ibdev_path`), not
//! in a directory derived from its name: a user-space provider (the project's verbs fabric) keeps
//! its device's tree elsewhere, and putting its library first on `LD_LIBRARY_PATH` must be enough
//! for discovery to find and describe its device.

use std::path::{Path, PathBuf};

use super::gid::parse_gid_type;

/// Files whose presence means a GPU peer-memory module is loaded (GPUDirect RDMA on CUDA pointers).
pub const PEER_MEMORY_FILES: [&str; 3] = [
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "sys/module/nvidia_peermem/version",
];

/// A filesystem root under which `sys/...` is read (`/` on a real system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::system()
    }
}

impl Sysfs {
    /// The real `/sys`.
    pub fn system() -> Self {
        Self {
            root: PathBuf::from("/"),
        }
    }

    /// A tree rooted at `root` (which contains `sys/class/infiniband/...`).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `<root>/sys/class/infiniband`.
    pub fn class_dir(&self) -> PathBuf {
        self.root.join("sys/class/infiniband")
    }

    /// Whether the kernel exposes any RDMA class directory at all.
    pub fn has_infiniband_class(&self) -> bool {
        self.class_dir().is_dir()
    }

    /// The sysfs directory of device `name`: its `ibdev_path` (an absolute path, read under the
    /// root), or `<class>/<name>` when libibverbs reported none.
    pub fn device_dir(&self, ibdev_path: Option<&Path>, name: &str) -> PathBuf {
        match ibdev_path {
            Some(path) => self.root.join(path.strip_prefix("/").unwrap_or(path)),
            None => self.class_dir().join(name),
        }
    }

    /// Whether any of [`PEER_MEMORY_FILES`] exists.
    pub fn peer_memory_present(&self) -> bool {
        self.peer_memory_file().is_some()
    }

    /// The first of [`PEER_MEMORY_FILES`] that exists, as an absolute path (`/sys/...` on a real
    /// system): which peer-memory client NCCL would find.
    pub fn peer_memory_file(&self) -> Option<PathBuf> {
        PEER_MEMORY_FILES
            .iter()
            .map(|f| self.root.join(f))
            .find(|path| path.exists())
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// RoCE version of GID `index` from `<device_dir>/ports/<port>/gid_attrs/types/<index>`;
/// `None` if unreadable (empty entries read as EINVAL) or unknown.
pub fn gid_roce_version(device_dir: &Path, port: u8, index: u32) -> Option<u8> {
    let path = device_dir.join(format!("ports/{port}/gid_attrs/types/{index}"));
    std::fs::read_to_string(path)
        .ok()
        .as_deref()
        .and_then(parse_gid_type)
}

/// The device's PCI path: realpath of `<device_dir>/device`; `None` for virtual devices
/// without one.
pub fn pci_path(device_dir: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(device_dir.join("device")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A fresh, empty directory under the system temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rivet-sysfs-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reads_gid_types_pci_path_and_peer_memory() {
        let root = scratch("tree");
        let sys = Sysfs::at(&root);
        assert!(!sys.has_infiniband_class());
        assert!(!sys.peer_memory_present());

        let types = root.join("sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types");
        fs::create_dir_all(&types).unwrap();
        fs::write(types.join("0"), "IB/RoCE v1\n").unwrap();
        fs::write(types.join("1"), "RoCE v2\n").unwrap();
        let pci = root.join("sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0");
        fs::create_dir_all(&pci).unwrap();
        std::os::unix::fs::symlink(&pci, root.join("sys/class/infiniband/mlx5_0/device")).unwrap();

        assert!(sys.has_infiniband_class());
        let mlx = sys.device_dir(None, "mlx5_0");
        assert_eq!(mlx, root.join("sys/class/infiniband/mlx5_0"));
        assert_eq!(gid_roce_version(&mlx, 1, 0), Some(1));
        assert_eq!(gid_roce_version(&mlx, 1, 1), Some(2));
        assert_eq!(gid_roce_version(&mlx, 1, 2), None);
        assert_eq!(pci_path(&mlx), Some(fs::canonicalize(&pci).unwrap()));
        assert_eq!(pci_path(&sys.device_dir(None, "rxe0")), None);

        let peer = root.join("sys/module/nvidia_peermem");
        fs::create_dir_all(&peer).unwrap();
        fs::write(peer.join("version"), "1.0\n").unwrap();
        assert_eq!(
            sys.peer_memory_file(),
            Some(root.join("sys/module/nvidia_peermem/version"))
        );
        assert!(sys.peer_memory_present());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_device_is_read_where_its_ibdev_path_points() {
        let root = scratch("ibdev");
        let sys = Sysfs::at(&root);
        // A provider whose device tree is not under /sys/class/infiniband.
        let own = Path::new("/run/fabric/sys/fab0");
        let dir = sys.device_dir(Some(own), "fab0");
        assert_eq!(dir, root.join("run/fabric/sys/fab0"));
        let types = dir.join("ports/1/gid_attrs/types");
        fs::create_dir_all(&types).unwrap();
        fs::write(types.join("0"), "RoCE v2\n").unwrap();
        assert_eq!(gid_roce_version(&dir, 1, 0), Some(2));
        // Nothing is read from the name-derived directory.
        assert_eq!(gid_roce_version(&sys.device_dir(None, "fab0"), 1, 0), None);
        // On the real system root the path is used as it is.
        assert_eq!(
            Sysfs::system().device_dir(Some(own), "fab0"),
            PathBuf::from("/run/fabric/sys/fab0")
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
