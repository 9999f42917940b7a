//! Builds the C test programs that load the plugin the way NCCL does (with the `cc` crate's
//! compiler detection), and tells the tests where they are through `RIVET_C_LOADER`.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let programs = [
        ("loader", "tests/c/loader.c", "RIVET_C_LOADER"),
        ("transfer", "tests/c/transfer.c", "RIVET_C_TRANSFER"),
        (
            "conformance",
            "tests/c/conformance.c",
            "RIVET_C_CONFORMANCE",
        ),
        ("faults", "tests/c/faults.c", "RIVET_C_FAULTS"),
        ("collnet", "tests/c/collnet.c", "RIVET_C_COLLNET"),
        ("rma", "tests/c/rma.c", "RIVET_C_RMA"),
        (
            "all_connect",
            "tests/c/all_connect.c",
            "RIVET_C_ALL_CONNECT",
        ),
    ];
    for (name, source, env) in programs {
        println!("cargo:rerun-if-changed={source}");
        // The programs include the shared headers beside them.
        println!("cargo:rerun-if-changed=tests/c/harness.h");
        println!("cargo:rerun-if-changed=tests/c/nccl_net_abi.h");
        println!("cargo:rerun-if-changed=tests/c/nccl_collnet_abi.h");
        println!("cargo:rerun-if-changed=tests/c/nccl_rma_abi.h");
        let exe = out.join(name);
        let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
        let status = compiler
            .to_command()
            .args([
                "-std=c11",
                "-O1",
                "-g",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Itests/c",
            ])
            .arg(source)
            .arg("-o")
            .arg(&exe)
            .arg("-ldl")
            .arg("-lm")
            .status()
            .unwrap_or_else(|e| panic!("running the C compiler for {source}: {e}"));
        assert!(status.success(), "compiling {source} failed");
        println!("cargo:rustc-env={env}={}", exe.display());
    }
    println!("cargo:rerun-if-changed=tests/c/nccl_net_abi.h");
    println!("cargo:rerun-if-changed=tests/c/harness.h");
}
