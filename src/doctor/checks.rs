//! One small pure function per check: inputs gathered elsewhere, a verdict with a hint out.

use std::fmt;

use super::pci::{ConfigFact, acs_redirects};

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Status {
    /// Fine.
    Ok,
    /// Works, but slower or fragile; or could not be verified.
    Warn,
    /// NCCL jobs will fail or hang here.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "OK",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
        })
    }
}

/// One answered check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Check {
    /// Short name (`memlock`, `port rxe0:1`).
    pub(crate) name: String,
    /// Verdict.
    pub(crate) status: Status,
    /// What was found.
    pub(crate) detail: String,
    /// What to do about it (empty when OK).
    pub(crate) hint: String,
}

impl Check {
    pub(crate) fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status,
            detail: detail.into(),
            hint: String::new(),
        }
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }
}

/// Below this, NCCL's connection set-up (and Rivet's) fails once a few peers are connected.
pub(crate) const MEMLOCK_MIN: u64 = 64 << 20;

/// `RLIMIT_MEMLOCK` (soft limit; `None` = unlimited).
pub(crate) fn memlock(soft: Option<u64>) -> Check {
    const HINT: &str = "NCCL registers every connection's buffers (and user buffers with ncclMemAlloc/UB registration): set `ulimit -l unlimited` (limits.conf memlock, or --ulimit memlock=-1 for containers)";
    match soft {
        None => Check::new("memlock", Status::Ok, "RLIMIT_MEMLOCK unlimited"),
        Some(n) if n >= MEMLOCK_MIN => Check::new(
            "memlock",
            Status::Warn,
            format!("RLIMIT_MEMLOCK {} KiB (NCCL wants unlimited)", n >> 10),
        )
        .hint(HINT),
        Some(n) => Check::new(
            "memlock",
            Status::Fail,
            format!(
                "RLIMIT_MEMLOCK {} KiB, below the {} MiB registrations need",
                n >> 10,
                MEMLOCK_MIN >> 20
            ),
        )
        .hint(HINT),
    }
}

/// One RDMA port as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SysPort {
    pub(crate) device: String,
    pub(crate) port: u8,
    /// `ports/<p>/state` text, e.g. `4: ACTIVE`.
    pub(crate) state: String,
    /// `ports/<p>/link_layer`: `InfiniBand` or `Ethernet`.
    pub(crate) link_layer: String,
    /// RoCE versions of the non-empty GID entries (from `gid_attrs/types`).
    pub(crate) roce_v2_gids: usize,
    /// The netdev behind the port (RoCE), from `gid_attrs/ndevs`.
    pub(crate) netdev: Option<String>,
    /// Its MTU.
    pub(crate) netdev_mtu: Option<u32>,
}

impl SysPort {
    fn is_active(&self) -> bool {
        self.state.contains("ACTIVE")
    }
    fn label(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }
}

/// Whether the machine has RDMA devices and an ACTIVE port; one line per port. `no_device` is
/// discovery's reason when libibverbs lists no device (e.g. no RDMA driver loaded).
pub(crate) fn ports(no_device: Option<&str>, ports: &[SysPort]) -> Vec<Check> {
    if no_device.is_some() || ports.is_empty() {
        let why = match no_device {
            Some(why) => format!("no RDMA device: {why}"),
            None => "no RDMA device: the listed devices have no port in sysfs".to_owned(),
        };
        return vec![
            Check::new("devices", Status::Warn, why)
                .hint("Rivet exposes no device and NCCL falls back to sockets; load the NIC's driver (mlx5_ib), or add Soft-RoCE: rdma link add rxe0 type rxe netdev eth0"),
        ];
    }
    let active = ports.iter().filter(|p| p.is_active()).count();
    let mut out = vec![if active == 0 {
        Check::new("devices", Status::Fail, format!("{} RDMA port(s), none ACTIVE", ports.len()))
            .hint("bring a port up: check the cable/switch (ibstat), `ip link set <netdev> up`, or the subnet manager (InfiniBand)")
    } else {
        Check::new(
            "devices",
            Status::Ok,
            format!("{} RDMA port(s), {active} ACTIVE", ports.len()),
        )
    }];
    for p in ports {
        let check = Check::new(
            format!("port {}", p.label()),
            if p.is_active() {
                Status::Ok
            } else {
                Status::Warn
            },
            format!("{}, link layer {}", p.state.trim(), p.link_layer),
        );
        out.push(if p.is_active() {
            check
        } else {
            check.hint("Rivet skips ports that are not ACTIVE")
        });
    }
    out
}

/// The largest RoCE MTU a netdev MTU carries (the kernel's `iboe_get_mtu`: GRH, BTH, the largest
/// extension headers and ICRC subtracted).
pub(crate) fn roce_mtu_for_netdev(netdev_mtu: u32) -> u32 {
    let room = netdev_mtu.saturating_sub(40 + 12 + 4 + 28 + 4);
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| m <= room)
        .unwrap_or(0)
}

/// Active MTU of a port against its netdev's MTU.
pub(crate) fn mtu(port: &SysPort, active_mtu: Option<u32>) -> Check {
    let name = format!("mtu {}", port.label());
    if port.link_layer != "Ethernet" {
        return match active_mtu {
            Some(m) => Check::new(name, Status::Ok, format!("InfiniBand, active MTU {m}")),
            None => Check::new(
                name,
                Status::Ok,
                "InfiniBand, active MTU unknown (port not active)",
            ),
        };
    }
    let (Some(netdev), Some(net_mtu)) = (&port.netdev, port.netdev_mtu) else {
        return Check::new(
            name,
            Status::Warn,
            "RoCE port without a netdev in gid_attrs/ndevs",
        )
        .hint("the port has no IP-bearing netdev: RoCE needs an address on the interface");
    };
    let carried = roce_mtu_for_netdev(net_mtu);
    const JUMBO: &str = "RoCE messages are cut into small packets; set the netdev MTU to 9000 (jumbo frames) on every host and switch port, the same everywhere";
    let Some(active) = active_mtu else {
        let detail =
            format!("{netdev} MTU {net_mtu} carries RoCE MTU {carried}; active MTU not read");
        return if carried < 4096 {
            Check::new(name, Status::Warn, detail).hint(JUMBO)
        } else {
            Check::new(name, Status::Ok, detail)
        };
    };
    let detail =
        format!("active MTU {active}, {netdev} MTU {net_mtu} (carries RoCE MTU {carried})");
    if active > carried {
        Check::new(name, Status::Fail, detail)
            .hint("the port MTU exceeds what the netdev carries: packets are dropped; raise the netdev MTU")
    } else if active < 4096 && carried < 4096 {
        Check::new(name, Status::Warn, detail).hint(JUMBO)
    } else {
        Check::new(name, Status::Ok, detail)
    }
}

/// RoCE v2 GIDs on an Ethernet port.
pub(crate) fn roce_v2(port: &SysPort) -> Option<Check> {
    if port.link_layer != "Ethernet" {
        return None;
    }
    let name = format!("roce-v2 {}", port.label());
    Some(if port.roce_v2_gids > 0 {
        Check::new(
            name,
            Status::Ok,
            format!("{} RoCE v2 GID(s)", port.roce_v2_gids),
        )
    } else {
        Check::new(name, Status::Warn, "no RoCE v2 GID (only RoCE v1, or no IP address)")
            .hint("give the netdev an IP address; RoCE v1 is not routable: NCCL_IB_ROCE_VERSION_NUM=1 only if the fabric is RoCE v1")
    })
}

/// The GID Rivet would use on a port, as discovery chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GidPick {
    pub(crate) port: String,
    pub(crate) index: u32,
    pub(crate) gid: String,
    pub(crate) roce_version: Option<u8>,
    pub(crate) why: String,
}

/// Discovery's verdict: the GIDs it would use, or why no port is usable.
pub(crate) fn gid(discovery: &Result<Vec<GidPick>, String>, have_ports: bool) -> Vec<Check> {
    match discovery {
        Ok(picks) => picks
            .iter()
            .map(|p| {
                let version = p.roce_version.map(|v| format!(" RoCE v{v}")).unwrap_or_default();
                Check::new(
                    format!("gid {}", p.port),
                    Status::Ok,
                    format!("index {} {}{version}: {}", p.index, p.gid, p.why),
                )
            })
            .collect(),
        Err(why) if !have_ports => vec![Check::new("gid", Status::Warn, format!("no GID chosen: {why}"))],
        Err(why) => vec![Check::new("gid", Status::Fail, format!("Rivet would use no port: {why}"))
            .hint("see NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY and the port's IP addresses")],
    }
}

/// GPU peer memory and dma-buf: what Rivet would advertise.
pub(crate) fn gpu_memory(gpus: usize, peer_memory: bool, dmabuf: Option<bool>) -> Check {
    let dmabuf_text = match dmabuf {
        Some(true) => "dma-buf registration works",
        Some(false) => "dma-buf registration unsupported",
        None => "dma-buf not probed (no device)",
    };
    let detail = format!(
        "{gpus} NVIDIA GPU(s), peer-memory module {}, {dmabuf_text}; what Rivet advertises per port and why: `rivet info` (gdr: ...)",
        if peer_memory { "loaded" } else { "not loaded" }
    );
    if gpus > 0 && !peer_memory && dmabuf != Some(true) {
        Check::new("gpu-memory", Status::Warn, detail)
            .hint("for GPUDirect RDMA load nvidia-peermem (modprobe nvidia-peermem) or use a kernel and driver with dma-buf")
    } else {
        Check::new("gpu-memory", Status::Ok, detail)
    }
}

/// ACS on one bridge between a NIC and a GPU.
pub(crate) fn acs(bridge: &str, control: ConfigFact<u16>) -> Check {
    let name = format!("acs {bridge}");
    match control {
        ConfigFact::Known(ctl) if acs_redirects(ctl) => Check::new(
            name,
            Status::Fail,
            format!("ACS control {ctl:#06x}: peer-to-peer requests are redirected to the root complex"),
        )
        .hint("GPU<->NIC traffic detours through the CPU (slow, or hangs with GPUDirect): disable ACS on this bridge (setpci -s <bdf> ECAP_ACS+6.w=0) or in the BIOS"),
        ConfigFact::Known(ctl) => Check::new(name, Status::Ok, format!("ACS control {ctl:#06x}: no redirect")),
        ConfigFact::Absent => Check::new(name, Status::Ok, "no ACS capability"),
        ConfigFact::Unreadable => Check::new(name, Status::Warn, "config space not readable")
            .hint("run as root to read the extended capabilities"),
    }
}

/// IOMMU mode (`iommu_group/type` of the NIC, or whether any IOMMU is registered).
pub(crate) fn iommu(iommus: usize, nic_group_type: Option<&str>) -> Check {
    match nic_group_type.map(str::trim) {
        Some("identity") => Check::new("iommu", Status::Ok, "NIC's IOMMU group is passthrough (identity)"),
        Some(t @ ("DMA" | "DMA-FQ")) => Check::new(
            "iommu",
            Status::Warn,
            format!("NIC's IOMMU group translates DMA ({t})"),
        )
        .hint("GPUDirect peer-to-peer may fail or slow down under translation: boot with iommu=pt (amd_iommu=pt / intel_iommu=on iommu=pt)"),
        Some(t) => Check::new("iommu", Status::Ok, format!("NIC's IOMMU group type {t}")),
        None if iommus == 0 => Check::new("iommu", Status::Ok, "no IOMMU registered"),
        None => Check::new("iommu", Status::Ok, format!("{iommus} IOMMU(s); no PCI NIC to check")),
    }
}

/// PCIe Relaxed Ordering on a NIC.
pub(crate) fn relaxed_ordering(nic: &str, fact: ConfigFact<bool>) -> Check {
    let name = format!("relaxed-ordering {nic}");
    match fact {
        ConfigFact::Known(true) => Check::new(name, Status::Ok, "enabled in PCIe Device Control"),
        ConfigFact::Known(false) => Check::new(name, Status::Warn, "disabled in PCIe Device Control")
            .hint("on AMD and virtualised hosts relaxed ordering raises bandwidth; enable it (setpci CAP_EXP+8.w) where the platform supports it"),
        ConfigFact::Absent => Check::new(name, Status::Ok, "no PCIe capability"),
        ConfigFact::Unreadable => Check::new(name, Status::Warn, "config space not readable")
            .hint("run as root to read the PCIe capability"),
    }
}

/// Names in `NCCL_*`/`RIVET_*` variables that match nothing on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvName {
    pub(crate) variable: String,
    pub(crate) name: String,
    /// A leading `^`: the name is excluded, so a missing one is harmless.
    pub(crate) excluded: bool,
}

pub(crate) fn env_names(missing: &[EnvName]) -> Check {
    if missing.is_empty() {
        return Check::new(
            "env",
            Status::Ok,
            "every device and interface named in NCCL_*/RIVET_* exists",
        );
    }
    let text: Vec<String> = missing
        .iter()
        .map(|m| format!("{}: {:?} does not exist", m.variable, m.name))
        .collect();
    let status = if missing.iter().all(|m| m.excluded) {
        Status::Warn
    } else {
        Status::Fail
    };
    Check::new("env", status, text.join("; "))
        .hint("fix the variable (names are prefixes unless the list starts with =; ^ excludes); `rivet info` lists the ports")
}

/// The interface and address the handshake sockets would use.
pub(crate) fn socket_if(
    ifname: Option<&str>,
    chosen: Option<(&str, &str)>,
    operstate: Option<&str>,
) -> Check {
    let var = ifname
        .map(|v| format!("NCCL_SOCKET_IFNAME={v:?}"))
        .unwrap_or_else(|| "NCCL_SOCKET_IFNAME unset".into());
    match chosen {
        None => Check::new("socket-if", Status::Fail, format!("{var}: no interface that is up has an address"))
            .hint("Rivet's handshake needs a TCP address: fix NCCL_SOCKET_IFNAME or bring the interface up"),
        Some((name, addr)) => {
            let state = operstate.map(str::trim).unwrap_or("unknown");
            let detail = format!("{var}: {name} {addr} (operstate {state})");
            if state == "down" {
                Check::new("socket-if", Status::Fail, detail).hint("bring the interface up")
            } else if name == "lo" {
                Check::new("socket-if", Status::Warn, detail)
                    .hint("only loopback: other hosts cannot reach this rank; set NCCL_SOCKET_IFNAME")
            } else {
                Check::new("socket-if", Status::Ok, detail)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, link: &str, v2: usize, mtu: Option<u32>) -> SysPort {
        SysPort {
            device: "mlx5_0".into(),
            port: 1,
            state: state.into(),
            link_layer: link.into(),
            roce_v2_gids: v2,
            netdev: mtu.map(|_| "eth2".into()),
            netdev_mtu: mtu,
        }
    }

    #[test]
    fn memlock_verdicts() {
        assert_eq!(memlock(None).status, Status::Ok);
        assert_eq!(memlock(Some(8 << 20)).status, Status::Fail);
        assert!(memlock(Some(8 << 20)).detail.contains("8192 KiB"));
        assert_eq!(memlock(Some(1 << 30)).status, Status::Warn);
    }

    #[test]
    fn port_verdicts() {
        let none = ports(Some("libibverbs found no RDMA devices"), &[]);
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].status, Status::Warn);
        assert_eq!(
            none[0].detail,
            "no RDMA device: libibverbs found no RDMA devices"
        );
        let portless = ports(None, &[]);
        assert_eq!(portless[0].status, Status::Warn);
        assert!(portless[0].detail.contains("no port"));
        let down = ports(None, &[port("1: DOWN", "Ethernet", 0, None)]);
        assert_eq!(down[0].status, Status::Fail);
        assert_eq!(down[1].status, Status::Warn);
        let up = ports(
            None,
            &[
                port("4: ACTIVE", "Ethernet", 1, None),
                port("1: DOWN", "InfiniBand", 0, None),
            ],
        );
        assert_eq!(up[0].status, Status::Ok);
        assert_eq!(up[0].detail, "2 RDMA port(s), 1 ACTIVE");
    }

    #[test]
    fn mtu_matches_the_kernel_rule() {
        assert_eq!(roce_mtu_for_netdev(1500), 1024);
        assert_eq!(roce_mtu_for_netdev(4200), 4096);
        assert_eq!(roce_mtu_for_netdev(9000), 4096);
        assert_eq!(
            mtu(&port("4: ACTIVE", "Ethernet", 1, Some(9000)), Some(4096)).status,
            Status::Ok
        );
        assert_eq!(
            mtu(&port("4: ACTIVE", "Ethernet", 1, Some(1500)), Some(1024)).status,
            Status::Warn
        );
        assert_eq!(
            mtu(&port("4: ACTIVE", "Ethernet", 1, Some(1500)), Some(4096)).status,
            Status::Fail
        );
        assert_eq!(
            mtu(&port("4: ACTIVE", "InfiniBand", 0, None), Some(4096)).status,
            Status::Ok
        );
    }

    #[test]
    fn roce_v2_gid_presence() {
        assert_eq!(
            roce_v2(&port("4: ACTIVE", "Ethernet", 2, None))
                .unwrap()
                .status,
            Status::Ok
        );
        assert_eq!(
            roce_v2(&port("4: ACTIVE", "Ethernet", 0, None))
                .unwrap()
                .status,
            Status::Warn
        );
        assert!(roce_v2(&port("4: ACTIVE", "InfiniBand", 0, None)).is_none());
    }

    #[test]
    fn gid_verdicts() {
        let pick = GidPick {
            port: "rxe0:1".into(),
            index: 1,
            gid: "::ffff:10.0.2.15".into(),
            roce_version: Some(2),
            why: "first RoCE v2 IPv4 GID".into(),
        };
        let ok = gid(&Ok(vec![pick]), true);
        assert_eq!(
            ok[0].detail,
            "index 1 ::ffff:10.0.2.15 RoCE v2: first RoCE v2 IPv4 GID"
        );
        assert_eq!(gid(&Err("x".into()), true)[0].status, Status::Fail);
        assert_eq!(gid(&Err("x".into()), false)[0].status, Status::Warn);
    }

    #[test]
    fn gpu_memory_verdicts() {
        assert_eq!(gpu_memory(0, false, None).status, Status::Ok);
        assert_eq!(gpu_memory(8, false, Some(false)).status, Status::Warn);
        assert_eq!(gpu_memory(8, true, Some(false)).status, Status::Ok);
        assert!(
            gpu_memory(8, true, Some(true))
                .detail
                .contains("peer-memory module loaded")
        );
    }

    #[test]
    fn acs_iommu_relaxed_ordering_verdicts() {
        assert_eq!(
            acs("0000:02:01.0", ConfigFact::Known(0x1d)).status,
            Status::Fail
        );
        assert_eq!(
            acs("0000:02:01.0", ConfigFact::Known(0x11)).status,
            Status::Ok
        );
        assert_eq!(
            acs("0000:02:01.0", ConfigFact::Unreadable).status,
            Status::Warn
        );
        assert_eq!(iommu(1, Some("DMA-FQ\n")).status, Status::Warn);
        assert_eq!(iommu(1, Some("identity\n")).status, Status::Ok);
        assert_eq!(iommu(0, None).status, Status::Ok);
        assert_eq!(
            relaxed_ordering("mlx5_0", ConfigFact::Known(false)).status,
            Status::Warn
        );
        assert_eq!(
            relaxed_ordering("mlx5_0", ConfigFact::Known(true)).status,
            Status::Ok
        );
    }

    #[test]
    fn env_and_socket_verdicts() {
        assert_eq!(env_names(&[]).status, Status::Ok);
        let missing = EnvName {
            variable: "NCCL_IB_HCA".into(),
            name: "mlx5_9".into(),
            excluded: false,
        };
        assert_eq!(env_names(&[missing]).status, Status::Fail);
        let excluded = EnvName {
            variable: "NCCL_IB_HCA".into(),
            name: "mlx5_9".into(),
            excluded: true,
        };
        assert_eq!(env_names(&[excluded]).status, Status::Warn);
        assert_eq!(socket_if(Some("eth9"), None, None).status, Status::Fail);
        assert_eq!(
            socket_if(None, Some(("eth0", "10.0.2.15")), Some("up\n")).status,
            Status::Ok
        );
        assert_eq!(
            socket_if(None, Some(("eth0", "10.0.2.15")), Some("down")).status,
            Status::Fail
        );
        assert_eq!(
            socket_if(None, Some(("lo", "127.0.0.1")), None).status,
            Status::Warn
        );
    }
}
