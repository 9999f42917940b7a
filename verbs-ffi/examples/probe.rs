//! Prints what libibverbs offers and every usable RDMA port, as the plugin would report them.
//!
//! Honours the NCCL variables the plugin will: `NCCL_IB_HCA`, `NCCL_IB_GID_INDEX`,
//! `NCCL_IB_ROCE_VERSION_NUM`, `NCCL_IB_ADDR_FAMILY` (read here, not in the library).
//!
//! Run: `cargo run -p rivet-verbs-ffi --example probe` (exit status 1 when no port is usable).

use std::process::ExitCode;

use rivet_verbs_ffi::discover::{AddrFamily, DiscoverOptions, GidPolicy, NameList};
use rivet_verbs_ffi::sys::mtu;
use rivet_verbs_ffi::{DeviceList, discover, mlx5, verbs};

fn options_from_env() -> Result<DiscoverOptions, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let filter = match var("NCCL_IB_HCA") {
        Some(spec) => NameList::parse(&spec).map_err(|e| e.to_string())?,
        None => NameList::all(),
    };
    let mut gid = GidPolicy::default();
    if let Some(v) = var("NCCL_IB_GID_INDEX") {
        let index: i64 = v
            .trim()
            .parse()
            .map_err(|_| format!("NCCL_IB_GID_INDEX={v:?} is not a number"))?;
        gid.index = u32::try_from(index).ok(); // negative = automatic, as in NCCL
    }
    if let Some(v) = var("NCCL_IB_ROCE_VERSION_NUM") {
        gid.roce_version = v
            .trim()
            .parse()
            .map_err(|_| format!("NCCL_IB_ROCE_VERSION_NUM={v:?} is not a number"))?;
    }
    if let Some(v) = var("NCCL_IB_ADDR_FAMILY") {
        gid.family = AddrFamily::parse(&v).ok_or(format!(
            "NCCL_IB_ADDR_FAMILY={v:?}: use AF_INET or AF_INET6"
        ))?;
    }
    Ok(DiscoverOptions {
        filter,
        gid,
        ..DiscoverOptions::default()
    })
}

fn main() -> ExitCode {
    let options = match options_from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("probe: {e}");
            return ExitCode::from(2);
        }
    };
    match verbs() {
        Ok(v) => println!(
            "libibverbs: {} (optional: {})",
            v.library,
            v.optional_symbols().join(", ")
        ),
        Err(e) => println!("libibverbs: {e}"),
    }
    match mlx5() {
        Ok(m) => println!(
            "libmlx5: loaded (is_supported: {}, create_qp: {})",
            m.is_supported.is_some(),
            m.create_qp.is_some()
        ),
        Err(e) => println!("libmlx5: not available ({e})"),
    }
    if let Ok(list) = DeviceList::new() {
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        println!(
            "devices: {}",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        );
    }
    match discover(&options) {
        Ok(ports) => {
            for p in &ports {
                println!(
                    "{}:{} {} {} Mb/s mtu {} lid {} gid[{}] {} ({}) guid {:#018x} max_qp {} ptr_support {:#x} pci {}",
                    p.name,
                    p.port,
                    p.link_layer,
                    p.speed_mbps,
                    mtu::bytes(p.active_mtu).unwrap_or(0),
                    p.lid,
                    p.gid_index,
                    p.gid_string,
                    p.why,
                    u64::from_be(p.guid),
                    p.max_qp,
                    p.ptr_support.0,
                    p.pci_path
                        .as_deref()
                        .map_or("-".into(), |p| p.display().to_string()),
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("no usable port: {e}");
            ExitCode::FAILURE
        }
    }
}
