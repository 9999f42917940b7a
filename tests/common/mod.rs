//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};

/// The plugin library built next to the running test (`target/<profile>/libnccl_net_rivet.so`),
/// or `RIVET_PLUGIN_LIB`.
pub(crate) fn plugin_library() -> PathBuf {
    if let Some(path) = std::env::var_os("RIVET_PLUGIN_LIB") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/libnccl_net_rivet.so
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let lib = profile_dir.join("libnccl_net_rivet.so");
    assert!(
        lib.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        lib.display()
    );
    lib
}
