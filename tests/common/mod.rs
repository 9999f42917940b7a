//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Run a VM lane command (`vm/run.sh …`, `vm/multi.sh …`), echo its stdout and stderr into the
/// test's output, and fail unless it exited 0. Returns (stdout, stderr).
#[allow(
    dead_code,
    reason = "the VM lanes use it; the loader test, which shares this module, does not"
)]
pub(crate) fn run_lane(command: &mut Command) -> (String, String) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "{:?} failed with {:?}",
        command.get_program(),
        output.status
    );
    (stdout, stderr)
}
