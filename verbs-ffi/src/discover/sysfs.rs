//! The few sysfs files discovery reads, under a configurable root so tests can use a fake tree.

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

    /// RoCE version of GID `index` from `ports/<port>/gid_attrs/types/<index>`; `None` if unreadable
    /// (empty entries read as EINVAL) or unknown.
    pub fn gid_roce_version(&self, device: &str, port: u8, index: u32) -> Option<u8> {
        let path = self
            .class_dir()
            .join(device)
            .join(format!("ports/{port}/gid_attrs/types/{index}"));
        std::fs::read_to_string(path)
            .ok()
            .as_deref()
            .and_then(parse_gid_type)
    }

    /// The device's PCI path: realpath of `<class>/<device>/device`; `None` for virtual devices
    /// without one.
    pub fn pci_path(&self, device: &str) -> Option<PathBuf> {
        std::fs::canonicalize(self.class_dir().join(device).join("device")).ok()
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
        assert_eq!(sys.gid_roce_version("mlx5_0", 1, 0), Some(1));
        assert_eq!(sys.gid_roce_version("mlx5_0", 1, 1), Some(2));
        assert_eq!(sys.gid_roce_version("mlx5_0", 1, 2), None);
        assert_eq!(
            sys.pci_path("mlx5_0"),
            Some(fs::canonicalize(&pci).unwrap())
        );
        assert_eq!(sys.pci_path("rxe0"), None);

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
}
