//! GPUDirect RDMA: which memory a device may register (`ptrSupport`), whether registrations use
//! PCIe relaxed ordering, and whether GPU receives are flushed — decided from what the host
//! offers, as NCCL's IB transport decides it (`net_ib/gdr.cc`, `init.cc`), with the reason for
//! every answer so `rivet info` and the log can say why.
//!
//! Inputs are facts the plugin gathers (a peer-memory kernel module's file, the answer of a
//! dma-buf registration probe, the environment); nothing here reads them.
//!
//! - **`NCCL_PTR_CUDA`** when a peer-memory client is loaded (`nvidia_peermem`, or the older
//!   `nv_peer_mem` that shows as `/sys/kernel/mm/memory_peers/nv_mem*`): `ibv_reg_mr` then takes
//!   GPU virtual addresses.
//! - **`NCCL_PTR_DMABUF`** when `NCCL_DMABUF_ENABLE` is not 0 and the probe — `ibv_reg_dmabuf_mr`
//!   with fd −1 — fails with anything but `EOPNOTSUPP`/`EPROTONOSUPPORT` (normally `EBADF`: the
//!   kernel and provider took the call and only the fd was wrong). A library without the symbol
//!   (rdma-core < 34) means no.
//! - Either is advertised only when received GPU data can be made visible: the flush is
//!   available, or the user turned it off (`NCCL_GDR_FLUSH_DISABLE=1`, as with NCCL's transport).
//! - **Relaxed ordering** when `NCCL_IB_PCI_RELAXED_ORDERING` is 1 or 2 (default) and the library
//!   has `ibv_reg_mr_iova2`, which drops the bit where the device cannot honour it.

use core::fmt;

/// `errno` values the dma-buf probe distinguishes (Linux numbering).
pub mod errno {
    /// Bad file descriptor: the kernel and provider support dma-buf (the probe's fd is −1).
    pub const EBADF: i32 = 9;
    /// Protocol not supported.
    pub const EPROTONOSUPPORT: i32 = 93;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
}

/// What the dma-buf registration probe found, classified by the layer that ran it (the FFI
/// crate's probe knows which errno means support).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaBuf {
    /// libibverbs has no `ibv_reg_dmabuf_mr` (rdma-core < 34).
    NoSymbol,
    /// Not probed (no protection domain could be allocated).
    NotProbed,
    /// The kernel and provider take dma-buf registrations (the probe got through to the fd check).
    Accepted,
    /// The probe failed with this errno (`EOPNOTSUPP`, `EPROTONOSUPPORT`): not supported.
    Refused(i32),
}

/// The host facts and settings the decision uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrFacts<'a> {
    /// The peer-memory file found (e.g. `/sys/module/nvidia_peermem/version`), if any.
    pub peer_memory: Option<&'a str>,
    /// The dma-buf probe's answer.
    pub dmabuf: DmaBuf,
    /// `NCCL_DMABUF_ENABLE` (default 1).
    pub dmabuf_enable: i64,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (default 2: on where supported).
    pub relaxed_ordering: i64,
    /// Whether libibverbs has `ibv_reg_mr_iova2`.
    pub has_reg_mr_iova2: bool,
    /// `NCCL_GDR_FLUSH_DISABLE` (default 0).
    pub flush_disable: i64,
    /// Whether the data path can flush GPU receives (a loopback queue pair per receive comm).
    pub flush_available: bool,
}

/// Why a memory type is or is not advertised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Advertised; the fact that allowed it.
    Yes(&'a str),
    /// Not advertised, and why.
    No(&'static str),
    /// Not advertised: the dma-buf probe answered with this errno.
    ProbeRefused(i32),
}

impl Verdict<'_> {
    /// Whether the type is advertised.
    pub fn yes(&self) -> bool {
        matches!(self, Self::Yes(_))
    }
}

impl fmt::Display for Verdict<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Yes(why) => write!(f, "yes ({why})"),
            Self::No(why) => write!(f, "no ({why})"),
            Self::ProbeRefused(e) => {
                let name = match *e {
                    errno::EOPNOTSUPP => "EOPNOTSUPP",
                    errno::EPROTONOSUPPORT => "EPROTONOSUPPORT",
                    _ => "",
                };
                write!(f, "no (unsupported by the provider or kernel: {name} {e})")
            }
        }
    }
}

/// The decision for one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrPolicy<'a> {
    /// `NCCL_PTR_CUDA`.
    pub cuda: Verdict<'a>,
    /// `NCCL_PTR_DMABUF`.
    pub dmabuf: Verdict<'a>,
    /// Registrations ask for PCIe relaxed ordering.
    pub relaxed_ordering: bool,
    /// Receives into GPU memory are flushed before `test` of the flush reports done.
    pub flush: bool,
}

impl<'a> GdrPolicy<'a> {
    /// Decide from `facts`.
    pub fn decide(facts: &GdrFacts<'a>) -> Self {
        let flush = facts.flush_available && facts.flush_disable == 0;
        // Without a flush, and without the user saying they do not want one, GPU data could be
        // read before the NIC's writes land: advertise no GPU memory then.
        let visible = flush || facts.flush_disable != 0;
        let cuda = match facts.peer_memory {
            None => Verdict::No("no peer-memory module (nvidia_peermem) loaded"),
            Some(_) if !visible => Verdict::No("GPU receives cannot be flushed on this path"),
            Some(file) => Verdict::Yes(file),
        };
        let dmabuf = match facts.dmabuf {
            _ if facts.dmabuf_enable == 0 => Verdict::No("NCCL_DMABUF_ENABLE=0"),
            DmaBuf::NoSymbol => Verdict::No("libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)"),
            DmaBuf::NotProbed => Verdict::No("the device could not be probed"),
            DmaBuf::Refused(e) => Verdict::ProbeRefused(e),
            DmaBuf::Accepted if !visible => {
                Verdict::No("GPU receives cannot be flushed on this path")
            }
            DmaBuf::Accepted => Verdict::Yes("kernel and provider accept dma-buf"),
        };
        Self {
            cuda,
            dmabuf,
            relaxed_ordering: matches!(facts.relaxed_ordering, 1 | 2) && facts.has_reg_mr_iova2,
            flush,
        }
    }

    /// `ptrSupport` bits: `NCCL_PTR_HOST` (1) always, `NCCL_PTR_CUDA` (2), `NCCL_PTR_DMABUF` (4).
    pub fn ptr_support(&self) -> i32 {
        1 | if self.cuda.yes() { 2 } else { 0 } | if self.dmabuf.yes() { 4 } else { 0 }
    }

    /// Whether any GPU memory is advertised.
    pub fn gpu(&self) -> bool {
        self.cuda.yes() || self.dmabuf.yes()
    }
}

impl fmt::Display for GdrPolicy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flush = match (self.gpu(), self.flush) {
            (false, _) => "n/a (no GPU memory)",
            (true, true) => "on",
            (true, false) => "off",
        };
        write!(
            f,
            "cuda {}, dmabuf {}, relaxed ordering {}, gpu flush {flush}",
            self.cuda,
            self.dmabuf,
            if self.relaxed_ordering { "on" } else { "off" },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    const HOST_ONLY: GdrFacts<'static> = GdrFacts {
        peer_memory: None,
        dmabuf: DmaBuf::Refused(errno::EOPNOTSUPP),
        dmabuf_enable: 1,
        relaxed_ordering: 2,
        has_reg_mr_iova2: true,
        flush_disable: 0,
        flush_available: true,
    };

    #[test]
    fn soft_roce_offers_host_memory_only_and_says_why() {
        let p = GdrPolicy::decide(&HOST_ONLY);
        assert_eq!(p.ptr_support(), 1);
        let text = p.to_string();
        assert!(text.contains("no peer-memory module"), "{text}");
        assert!(text.contains("EOPNOTSUPP 95"), "{text}");
        assert!(p.flush, "the flush itself is available");
    }

    #[test]
    fn peer_memory_gives_cuda_and_ebadf_gives_dmabuf() {
        let p = GdrPolicy::decide(&GdrFacts {
            peer_memory: Some("/sys/module/nvidia_peermem/version"),
            dmabuf: DmaBuf::Accepted,
            ..HOST_ONLY
        });
        assert_eq!(p.ptr_support(), 1 | 2 | 4);
        assert!(p.to_string().contains("nvidia_peermem"));
        // A refusal is "no" whatever its errno, and says which.
        for e in [errno::EPROTONOSUPPORT, errno::EOPNOTSUPP] {
            let p = GdrPolicy::decide(&GdrFacts {
                dmabuf: DmaBuf::Refused(e),
                ..HOST_ONLY
            });
            assert_eq!(p.dmabuf, Verdict::ProbeRefused(e));
        }
    }

    #[test]
    fn no_gpu_memory_without_a_flush_unless_the_user_disabled_it() {
        let facts = GdrFacts {
            peer_memory: Some("/sys/kernel/mm/memory_peers/nv_mem/version"),
            dmabuf: DmaBuf::Accepted,
            flush_available: false,
            ..HOST_ONLY
        };
        let p = GdrPolicy::decide(&facts);
        assert_eq!(p.ptr_support(), 1);
        assert!(!p.flush);
        let p = GdrPolicy::decide(&GdrFacts {
            flush_disable: 1,
            ..facts
        });
        assert_eq!(
            p.ptr_support(),
            7,
            "NCCL_GDR_FLUSH_DISABLE=1 is the user's call"
        );
        assert!(!p.flush);
        // Flush available but disabled by the user: GPU memory yes, no flush.
        let p = GdrPolicy::decide(&GdrFacts {
            flush_disable: 1,
            flush_available: true,
            ..facts
        });
        assert_eq!((p.ptr_support(), p.flush), (7, false));
    }

    #[test]
    fn dmabuf_follows_the_switch_and_the_symbol() {
        let yes = GdrFacts {
            dmabuf: DmaBuf::Accepted,
            ..HOST_ONLY
        };
        assert!(GdrPolicy::decide(&yes).dmabuf.yes());
        let off = GdrPolicy::decide(&GdrFacts {
            dmabuf_enable: 0,
            ..yes
        });
        assert_eq!(off.dmabuf, Verdict::No("NCCL_DMABUF_ENABLE=0"));
        for probe in [DmaBuf::NoSymbol, DmaBuf::NotProbed] {
            assert!(
                !GdrPolicy::decide(&GdrFacts {
                    dmabuf: probe,
                    ..yes
                })
                .dmabuf
                .yes()
            );
        }
    }

    #[test]
    fn relaxed_ordering_as_nccl() {
        for (setting, iova2, on) in [
            (2, true, true),
            (1, true, true),
            (0, true, false),
            (2, false, false),
            (1, false, false),
            (3, true, false),
        ] {
            let p = GdrPolicy::decide(&GdrFacts {
                relaxed_ordering: setting,
                has_reg_mr_iova2: iova2,
                ..HOST_ONLY
            });
            assert_eq!(p.relaxed_ordering, on, "setting {setting}, iova2 {iova2}");
        }
    }
}
