//! Memory registration: `regMr`, `regMrDmaBuf`, `deregMr`.
//!
//! Unsafe (opted in): registering NCCL's buffer with the NIC (the kernel checks the range), and
//! `deregMr` removing the registration from its handle table, which [`crate::handle`] makes
//! `unsafe`.

#![allow(unsafe_code)]

use crate::backend::OpenPort;
use crate::backend::mr_cache::{CacheError, CachedMr, Memory};
use crate::error::{NetError, NetResult};
use crate::handle::{Handle, Ptr, Registry, registry, unknown};
use crate::sys::{NCCL_PTR_CUDA, NCCL_PTR_HOST};
use core::ffi::c_int;
use rivet_verbs_ffi::VerbsError;
use rivet_verbs_ffi::sys::access;
use std::sync::Arc;

/// A registered user buffer: a share of a registration in its port's cache.
#[derive(Debug)]
pub(crate) struct UserMr {
    /// `None` for a zero-length registration (the NIC cannot register 0 bytes; nothing is ever
    /// read from or written to it).
    share: Option<CachedMr>,
    pub(super) addr: u64,
    pub(super) len: u64,
    /// `share`'s local and remote keys (0 without one), beside the range they are checked
    /// against: the data path reads them with the range, not through the `Option`.
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    /// NCCL registered host memory (`NCCL_PTR_HOST`): the CPU may copy from and into it (the
    /// eager path); never GPU memory.
    pub(super) host: bool,
    /// The port whose protection domain (and cache) the registration belongs to.
    port: Arc<OpenPort>,
    /// On a fused device: the registrations on its other ports, in member order.
    others: Vec<(Arc<OpenPort>, Option<CachedMr>)>,
}

impl UserMr {
    /// The local (`remote` false) or remote keys of every port of the registration, in member
    /// order, into `keys`; how many. After the same range check as `lkey_for` (written with the data path, in `data.rs`).
    pub(crate) fn keys_for(
        &self,
        addr: u64,
        len: u64,
        remote: bool,
        keys: &mut [u32; 8],
    ) -> NetResult<usize> {
        let pick =
            |share: Option<&CachedMr>| share.map_or(0, |s| if remote { s.rkey } else { s.lkey });
        self.check(addr, len)?;
        keys[0] = pick(self.share.as_ref());
        for (key, (_, share)) in keys[1..].iter_mut().zip(&self.others) {
            *key = pick(share.as_ref());
        }
        Ok(1 + self.others.len().min(7))
    }

    /// Whether the registration belongs to `port`'s protection domain.
    pub(crate) fn is_on(&self, port: &Arc<OpenPort>) -> bool {
        Arc::ptr_eq(&self.port, port)
    }
}

impl Drop for UserMr {
    fn drop(&mut self) {
        // Only a release the cache never handed out can fail; nothing to undo then.
        if let Some(share) = self.share.take() {
            let _ = self.port.mrs.release(share.range);
        }
        for (port, share) in self.others.drain(..) {
            if let Some(share) = share {
                let _ = port.mrs.release(share.range);
            }
        }
    }
}

static MRS: Registry<UserMr> = registry!(0x3e3e, "live memory registrations");

/// Memory keys in one protection domain → the same registrations' keys in another
/// ([`key_map`]). Looked up by a scan: it is used once per key a failover replays (a sorted
/// table's sort cost the library more code than the scans cost time).
#[cfg(feature = "failover")]
#[derive(Debug, Default)]
pub(crate) struct KeyTable(Vec<(u32, u32)>);

#[cfg(feature = "failover")]
impl KeyTable {
    /// The key that `old` becomes.
    pub(crate) fn get(&self, old: u32) -> Option<u32> {
        self.0.iter().find(|&&(o, _)| o == old).map(|&(_, new)| new)
    }
}

/// Port failover to another device: for every live registration made in both `from`'s and
/// `to`'s protection domains (a fused device's members), its key in `from`'s → its key in
/// `to`'s (remote keys when `remote`, local otherwise). A lane that moved from `from` to `to`
/// rewrites the keys of its outstanding work with it.
#[cfg(feature = "failover")]
pub(crate) fn key_map(from: &Arc<OpenPort>, to: &Arc<OpenPort>, remote: bool) -> KeyTable {
    let mut pairs = Vec::new();
    MRS.for_each(|mr| {
        let members = std::iter::once((&mr.port, mr.share.as_ref()))
            .chain(mr.others.iter().map(|(port, share)| (port, share.as_ref())));
        let (mut old, mut new) = (None, None);
        for (port, share) in members {
            let key = share.map(|s| if remote { s.rkey } else { s.lkey });
            // Keys belong to protection domains: a registration made through another port of
            // the same device is as good.
            if port.same_domain(from) {
                old = old.or(key);
            } else if port.same_domain(to) {
                new = new.or(key);
            }
        }
        if let (Some(old), Some(new)) = (old, new) {
            pairs.push((old, new));
        }
    });
    KeyTable(pairs)
}

/// Look up a memory handle passed to isend/irecv.
#[inline]
pub(crate) fn lookup(call: &str, mh: Ptr) -> NetResult<&'static UserMr> {
    MRS.lookup(call, "mhandle", mh).map(|(_, mr)| mr)
}

/// Register `size` bytes at `data` in `port`'s protection domain.
#[cfg_attr(not(feature = "collnet"), allow(dead_code))] // only CollNet calls it
pub(crate) fn reg_mr(
    port: Arc<OpenPort>,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    strong_order: bool,
) -> NetResult<Ptr> {
    reg_mr_on(vec![port], data, size, kind, dmabuf, strong_order)
}

/// Register `size` bytes at `data` in the protection domain of every port of `ports` (a fused
/// device's members, in order; at least one). `strong_order`: no relaxed ordering (NCCL's
/// `NCCL_NET_MR_FLAG_FORCE_SO`; like NCCL's IB transport, honoured when the pages are registered
/// anew, not for a range the cache already holds).
pub(crate) fn reg_mr_on(
    ports: Vec<Arc<OpenPort>>,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    strong_order: bool,
) -> NetResult<Ptr> {
    if data.is_null() && size > 0 {
        return Err(NetError::invalid_argument("regMr: NULL buffer"));
    }
    if (data as u64).checked_add(size as u64).is_none() {
        return Err(NetError::invalid_argument(format!(
            "regMr: {size} bytes at {data:p} wrap the address space"
        )));
    }
    let mut ports = ports.into_iter();
    let port = ports
        .next()
        .ok_or_else(|| NetError::misuse("regMr: no port"))?;
    let share = register(&port, data, size, kind, dmabuf, strong_order)?;
    let mut entry = Box::new(UserMr {
        lkey: share.as_ref().map_or(0, |s| s.lkey),
        rkey: share.as_ref().map_or(0, |s| s.rkey),
        share,
        addr: data as u64,
        len: size as u64,
        host: kind == NCCL_PTR_HOST,
        port,
        others: Vec::new(),
    });
    for other in ports {
        // A failure drops `entry`, releasing what was registered so far.
        let share = register(&other, data, size, kind, dmabuf, strong_order)?;
        entry.others.push((other, share));
    }
    MRS.insert(entry)
        .map(Handle::to_ptr)
        .map_err(|full| NetError::system(format!("regMr: {full}")))
}

/// One port's share of a registration (`None` for 0 bytes).
fn register(
    port: &Arc<OpenPort>,
    data: Ptr,
    size: usize,
    kind: c_int,
    dmabuf: Option<(u64, c_int)>,
    strong_order: bool,
) -> NetResult<Option<CachedMr>> {
    // NCCL's access flags (remote atomics too: the RMA tables' signals are fetch-and-adds into
    // registered memory); relaxed ordering where the port's decision allows it and the caller
    // did not force strong ordering (the library drops the bit where the device cannot honour
    // it).
    let mut flags =
        access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
    if port.gpu.relaxed_ordering && !strong_order {
        flags |= access::RELAXED_ORDERING;
    }
    let memory = match dmabuf {
        Some((offset, fd)) => Memory::DmaBuf { fd, offset },
        // GPU memory by address goes through the peer-memory client, like host memory.
        None if kind == NCCL_PTR_HOST || (kind == NCCL_PTR_CUDA && port.gpu.cuda) => Memory::Mapped,
        None => {
            return Err(NetError::invalid_usage(format!(
                "regMr: memory type {kind} is not advertised by {} port {} (see `rivet info`: a \
                 peer-memory module makes NCCL_PTR_CUDA available, otherwise register GPU memory \
                 as a DMA-BUF)",
                port.info.name, port.info.port
            )));
        }
    };
    if size == 0 {
        return Ok(None);
    }
    // SAFETY: NCCL registers memory it owns and keeps it mapped until `deregMr`, which releases
    // this share (the drop of its `UserMr`).
    let acquired = unsafe { port.mrs.acquire(data as u64, size as u64, memory, flags) };
    Ok(Some(
        acquired.map_err(|e| reg_error(&e, data, size, dmabuf))?,
    ))
}

fn reg_error(err: &CacheError, data: Ptr, size: usize, dmabuf: Option<(u64, c_int)>) -> NetError {
    let CacheError::Verbs(verbs) = err else {
        return NetError::invalid_argument(format!(
            "regMr of {size} bytes at {data:p} failed: {err}"
        ));
    };
    if let Some((offset, fd)) = dmabuf {
        let why = match verbs {
            VerbsError::Unsupported { .. } => {
                "; this libibverbs predates ibv_reg_dmabuf_mr (rdma-core v34)"
            }
            _ => "",
        };
        return NetError::system(format!(
            "regMrDmaBuf of {size} bytes (fd {fd}, offset {offset}) failed: {verbs}{why}"
        ));
    }
    // The verbs error already carries the RLIMIT_MEMLOCK hint for ENOMEM/EPERM.
    let hint = match verbs.errno() {
        Some(libc::EFAULT | libc::EINVAL) => "; the range is not mapped memory of this process",
        _ => "",
    };
    NetError::system(format!(
        "regMr of {size} bytes at {data:p} failed: {verbs}{hint}"
    ))
}

/// Deregister `mh`, which must belong to `port` (the port of the comm NCCL named).
pub(crate) fn dereg_mr(port: &Arc<OpenPort>, mh: Ptr) -> NetResult<()> {
    let (handle, mr) = MRS.lookup("deregMr", "mhandle", mh)?;
    if !mr.is_on(port) {
        return Err(unknown("deregMr", "mhandle", mh));
    }
    // SAFETY: NCCL deregisters a buffer only after the transfers using it completed and never
    // concurrently with a call using it; `mr` is not used past here.
    unsafe { MRS.remove(handle) }
        .map(drop)
        .ok_or_else(|| unknown("deregMr", "mhandle", mh))
}
