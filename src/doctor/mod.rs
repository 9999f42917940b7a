//! `rivet doctor`: checks the machine configuration RDMA jobs usually fail on, one line each.
//!
//! The checks are pure functions ([`checks`], [`pci`]); this module gathers their inputs from
//! sysfs under a root (`/`, or `--root DIR` for a fake tree in tests), from the environment and
//! from the plugin's own discovery, and prints the verdicts. The RDMA devices are the ones the
//! plugin's discovery lists (libibverbs' device list), each read in its own sysfs directory
//! (`ibdev_path`), so a user-space provider's device is checked like a kernel one;
//! `/sys/class/infiniband` only explains why there is none.

mod checks;
mod pci;

use rivet_verbs_ffi::discover::{DiscoverError, ListedDevice, Sysfs, list_devices, sysfs};
use rivet_verbs_ffi::name_list::NameList;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use checks::{Check, EnvName, GidPick, Status, SysPort};

const USAGE: &str = "usage: rivet doctor [--json] [--root DIR]

Checks the machine for what RDMA jobs usually fail on: memlock limit, RDMA ports, MTU, GID,
RoCE v2, GPU peer memory, PCIe ACS, IOMMU, relaxed ordering, NCCL_*/RIVET_* names, the socket
interface. One line per check: OK, WARN or FAIL, and a hint. Exit status 1 when a check FAILs.

  --json       one JSON object on stdout
  --root DIR   read sys/... under DIR instead of / (tests): the devices libibverbs lists are read
               at their sysfs paths under DIR; skips the GID discovery
";

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// The sorted names in a directory (none when it cannot be read).
pub(crate) fn dir_names(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(path)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every port of the listed devices, from `ports/` in each device's sysfs directory.
fn sys_ports(root: &Path, devices: &[ListedDevice]) -> Vec<SysPort> {
    let mut out = Vec::new();
    for device in devices {
        let ports_dir = device.sysfs_dir.join("ports");
        for port_name in dir_names(&ports_dir) {
            let Ok(port) = port_name.parse::<u8>() else {
                continue;
            };
            let dir = ports_dir.join(&port_name);
            let types = dir.join("gid_attrs/types");
            let roce_v2_gids = dir_names(&types)
                .iter()
                .filter(|i| read(&types.join(i)).is_some_and(|t| t.trim() == "RoCE v2"))
                .count();
            let ndevs = dir.join("gid_attrs/ndevs");
            let netdev = dir_names(&ndevs)
                .iter()
                .filter_map(|i| read(&ndevs.join(i)))
                .map(|n| n.trim().to_owned())
                .find(|n| !n.is_empty());
            let netdev_mtu = netdev.as_ref().and_then(|n| {
                read(&root.join("sys/class/net").join(n).join("mtu"))?
                    .trim()
                    .parse()
                    .ok()
            });
            out.push(SysPort {
                device: device.name.clone(),
                port,
                state: read(&dir.join("state"))
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
                link_layer: read(&dir.join("link_layer"))
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
                roce_v2_gids,
                netdev,
                netdev_mtu,
            });
        }
    }
    out
}

/// What the plugin's discovery decided (real system only).
struct Discovery {
    picks: Result<Vec<GidPick>, String>,
    /// `(device:port, active MTU in bytes)`.
    active_mtu: Vec<(String, u32)>,
    dmabuf: Option<bool>,
}

fn discovery() -> Discovery {
    match nccl_net_rivet::devices::discover() {
        Ok(ports) => Discovery {
            picks: Ok(ports
                .iter()
                .map(|p| GidPick {
                    port: format!("{}:{}", p.info.name, p.info.port),
                    index: p.info.gid_index,
                    gid: p.info.gid_string.clone(),
                    roce_version: p.info.roce_version,
                    why: p.info.why.clone(),
                })
                .collect()),
            active_mtu: ports
                .iter()
                .map(|p| {
                    // ibv_mtu codes 1..=5 are 256 << (code - 1).
                    let bytes = if (1..=5).contains(&p.info.active_mtu) {
                        128u32 << p.info.active_mtu
                    } else {
                        0
                    };
                    (format!("{}:{}", p.info.name, p.info.port), bytes)
                })
                .collect(),
            dmabuf: ports.first().map(|p| p.info.ptr_support.dmabuf()),
        },
        Err(why) => Discovery {
            picks: Err(why.to_string()),
            active_mtu: Vec::new(),
            dmabuf: None,
        },
    }
}

/// PCI functions of NVIDIA display/3D controllers (realpaths).
fn gpus(root: &Path) -> Vec<PathBuf> {
    let devices = root.join("sys/bus/pci/devices");
    dir_names(&devices)
        .into_iter()
        .map(|d| devices.join(d))
        .filter(|d| {
            read(&d.join("vendor")).is_some_and(|v| v.trim() == "0x10de")
                && read(&d.join("class")).is_some_and(|c| c.trim().starts_with("0x03"))
        })
        .filter_map(|d| fs::canonicalize(d).ok())
        .collect()
}

/// Names in a NCCL list (`rivet_verbs_ffi::name_list`, the parser the plugin uses) that match nothing
/// in `existing` (by prefix, or exactly after `=`). A value the parser rejects is reported whole.
fn missing_names(variable: &str, spec: &str, existing: &[String]) -> Vec<EnvName> {
    let Ok(list) = NameList::parse(spec) else {
        return vec![EnvName {
            variable: variable.to_owned(),
            name: spec.to_owned(),
            excluded: false,
        }];
    };
    list.entries
        .iter()
        .filter(|entry| {
            !existing.iter().any(|e| {
                if list.exact {
                    *e == entry.name
                } else {
                    e.starts_with(entry.name.as_str())
                }
            })
        })
        .map(|entry| EnvName {
            variable: variable.to_owned(),
            name: entry.name.clone(),
            excluded: list.exclude,
        })
        .collect()
}

fn env_check(root: &Path, devices: &[ListedDevice]) -> Check {
    let devices: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    let netdevs = dir_names(&root.join("sys/class/net"));
    let mut missing = Vec::new();
    for (var, existing) in [("NCCL_IB_HCA", &devices), ("NCCL_SOCKET_IFNAME", &netdevs)] {
        if let Ok(v) = std::env::var(var) {
            missing.extend(missing_names(var, &v, existing));
        }
    }
    for var in ["RIVET_IBVERBS_LIB", "RIVET_PLUGIN_LIB"] {
        if let Ok(v) = std::env::var(var) {
            if v.contains('/') && !Path::new(&v).exists() {
                missing.push(EnvName {
                    variable: var.to_owned(),
                    name: v,
                    excluded: false,
                });
            }
        }
    }
    checks::env_names(&missing)
}

fn memlock_soft() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Every check, in print order. `listed` is the plugin's device list
/// ([`rivet_verbs_ffi::discover::list_devices`] over the same root), or why it is empty.
fn run_checks(root: &Path, listed: &Result<Vec<ListedDevice>, DiscoverError>) -> Vec<Check> {
    let real = root == Path::new("/");
    // First, which build gives these verdicts: the line the library logs at `init`.
    let mut out = vec![
        Check::new(
            "version",
            Status::Ok,
            nccl_net_rivet::version::line().to_string(),
        ),
        checks::memlock(memlock_soft()),
    ];
    let (devices, no_device) = match listed {
        Ok(devices) => (devices.as_slice(), None),
        Err(why) => (&[][..], Some(why.to_string())),
    };
    let ports = sys_ports(root, devices);
    out.extend(checks::ports(no_device.as_deref(), &ports));
    let found = if real {
        discovery()
    } else {
        Discovery {
            picks: Err("not asked (--root given: libibverbs discovery skipped)".into()),
            active_mtu: Vec::new(),
            dmabuf: None,
        }
    };
    if ports.is_empty() {
        for name in ["mtu", "roce-v2"] {
            out.push(Check::new(
                name,
                Status::Ok,
                "nothing to check: no RDMA port",
            ));
        }
    }
    for p in &ports {
        let label = format!("{}:{}", p.device, p.port);
        let active = found
            .active_mtu
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, m)| *m);
        out.push(checks::mtu(p, active));
        out.extend(checks::roce_v2(p));
    }
    out.extend(checks::gid(&found.picks, !ports.is_empty() && real));

    let peer_memory = Sysfs::at(root).peer_memory_present();
    let gpus = gpus(root);
    out.push(checks::gpu_memory(gpus.len(), peer_memory, found.dmabuf));

    // The PCI function behind each device, as discovery finds it (the `device` link in its
    // sysfs directory); virtual devices have none.
    let nics: Vec<(String, PathBuf)> = devices
        .iter()
        .filter_map(|d| Some((d.name.clone(), sysfs::pci_path(&d.sysfs_dir)?)))
        .collect();
    let mut bridges = BTreeSet::new();
    let mut root_complex_pairs = Vec::new();
    for (nic, nic_pci) in &nics {
        for gpu in &gpus {
            let (between, at_root) = pci::bridges_between(nic_pci, gpu);
            if at_root {
                let gpu_name = gpu.file_name().unwrap_or_default().to_string_lossy();
                root_complex_pairs.push(format!("{nic}-{gpu_name}"));
            }
            bridges.extend(between);
        }
    }
    if nics.is_empty() || gpus.is_empty() {
        out.push(Check::new(
            "acs",
            Status::Ok,
            format!(
                "nothing to check: {} PCI NIC(s), {} GPU(s)",
                nics.len(),
                gpus.len()
            ),
        ));
    }
    for bridge in &bridges {
        let config = fs::read(bridge.join("config")).unwrap_or_default();
        let name = bridge.file_name().unwrap_or_default().to_string_lossy();
        out.push(checks::acs(&name, pci::acs_control(&config)));
    }
    if !root_complex_pairs.is_empty() {
        out.push(
            Check::new(
                "acs topology",
                Status::Warn,
                format!(
                    "NIC and GPU meet only at the CPU: {}",
                    root_complex_pairs.join(", ")
                ),
            )
            .hint("GPUDirect RDMA between them crosses the CPU (NCCL's PHB/SYS distance); pair each GPU with a NIC under the same PCIe switch"),
        );
    }

    let iommus = dir_names(&root.join("sys/class/iommu")).len();
    let group_type = nics
        .first()
        .and_then(|(_, pci)| read(&pci.join("iommu_group/type")));
    out.push(checks::iommu(iommus, group_type.as_deref()));
    if nics.is_empty() {
        out.push(Check::new(
            "relaxed-ordering",
            Status::Ok,
            "no PCI NIC (virtual or no RDMA device)",
        ));
    }
    for (nic, pci) in &nics {
        let fact = match fs::read(pci.join("config")) {
            Ok(config) => pci::relaxed_ordering(&config),
            // Every PCI function has config space; a device link without it is a stand-in
            // (the verbs fabric's), with no PCIe capability to check.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => pci::ConfigFact::Absent,
            Err(_) => pci::ConfigFact::Unreadable,
        };
        out.push(checks::relaxed_ordering(nic, fact));
    }

    out.push(env_check(root, devices));
    let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
    let chosen = nccl_net_rivet::diag::socket_address().ok().flatten();
    let chosen_text = chosen.as_ref().map(|(n, a)| (n.clone(), a.to_string()));
    let operstate = chosen
        .as_ref()
        .and_then(|(n, _)| read(&root.join("sys/class/net").join(n).join("operstate")));
    out.push(checks::socket_if(
        ifname.as_deref(),
        chosen_text.as_ref().map(|(n, a)| (n.as_str(), a.as_str())),
        operstate.as_deref(),
    ));
    out
}

fn text(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        let _ = write!(s, "{:<4} {}: {}", c.status.to_string(), c.name, c.detail);
        if !c.hint.is_empty() {
            let _ = write!(s, " (hint: {})", c.hint);
        }
        s.push('\n');
    }
    s
}

fn json(checks: &[Check]) -> String {
    use crate::bench::report::json_str;
    let count = |st| checks.iter().filter(|c| c.status == st).count();
    let items: Vec<String> = checks
        .iter()
        .map(|c| {
            format!(
                "{{\"check\":{},\"status\":{},\"detail\":{},\"hint\":{}}}",
                json_str(&c.name),
                json_str(&c.status.to_string()),
                json_str(&c.detail),
                json_str(&c.hint)
            )
        })
        .collect();
    format!(
        "{{\"ok\":{},\"warn\":{},\"fail\":{},\"checks\":[{}]}}\n",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        items.join(",")
    )
}

/// `rivet doctor [--json] [--root DIR]`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    let mut as_json = false;
    let mut root = PathBuf::from("/");
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => as_json = true,
            "--root" => match it.next() {
                Some(dir) => root = PathBuf::from(dir),
                None => {
                    eprintln!("rivet doctor: --root needs a directory\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "--help" | "-h" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("rivet doctor: unknown argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let checks = run_checks(&root, &list_devices(&Sysfs::at(&root)));
    print!(
        "{}",
        if as_json {
            json(&checks)
        } else {
            text(&checks)
        }
    );
    if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests;
