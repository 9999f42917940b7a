//! The registrations of one opened port, shared by every comm on it: `rivet_core::regcache`'s
//! policy over the port device's memory registrations.
//!
//! Unsafe (opted in): a miss registers the caller's memory with the NIC; the caller (`regMr`)
//! promises NCCL keeps it mapped until the matching `deregMr`.

#![allow(unsafe_code)]

use super::port_device::{PortDevice, VerbsDevice};
use rivet_core::regcache::{Acquired, PageRange, RegCache, RegCacheError};
use rivet_verbs_ffi::VerbsError;
use std::os::fd::RawFd;
use std::sync::Mutex;

/// Page size the cache rounds to. Registering whole 4 KiB pages is right on every Linux page
/// size: the kernel pins the pages the range touches whatever their size.
const PAGE: u64 = 4096;

/// Where the memory of a registration comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Memory {
    /// Process memory (host, or GPU memory through a peer-memory client), by address.
    Mapped,
    /// A dma-buf: the memory at `addr` is `fd` from byte `offset` on.
    DmaBuf {
        /// The dma-buf file descriptor (NCCL may close it after `regMrDmaBuf` returns).
        fd: RawFd,
        /// Offset of `addr`'s byte inside the dma-buf.
        offset: u64,
    },
}

/// One `regMr` handle's share of a cached registration.
#[derive(Debug)]
pub(crate) struct CachedMr {
    /// The registration's key in the cache.
    pub(crate) range: PageRange,
    /// Local key.
    pub(crate) lkey: u32,
    /// Remote key.
    pub(crate) rkey: u32,
}

/// Why a registration failed.
#[derive(Debug)]
pub(crate) enum CacheError {
    /// The verbs call failed.
    Verbs(VerbsError),
    /// The cache refused (empty range, a release too many).
    Cache(RegCacheError),
    /// A dma-buf registration whose offset is smaller than the distance from the page start to
    /// `addr`, so the page-aligned range cannot be expressed in the dma-buf.
    UnalignedDmaBuf {
        /// The offset NCCL passed.
        offset: u64,
        /// Bytes from the page start to the buffer.
        lead: u64,
    },
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Verbs(e) => e.fmt(f),
            Self::Cache(e) => write!(f, "registration cache: {e}"),
            Self::UnalignedDmaBuf { offset, lead } => write!(
                f,
                "the dma-buf offset {offset} is smaller than the buffer's distance from its page start ({lead} bytes)"
            ),
        }
    }
}

/// The cache of one port (one protection domain), registering with the port's device.
#[derive(Debug)]
pub(crate) struct MrCache<D: PortDevice = VerbsDevice> {
    device: D,
    regions: Mutex<RegCache<D::Registration>>,
}

impl<D: PortDevice> MrCache<D> {
    /// An empty cache for registrations with `device`.
    pub(crate) fn new(device: D) -> Self {
        Self {
            device,
            regions: Mutex::new(RegCache::new(PAGE)),
        }
    }

    /// Register `len` bytes at `addr`, or take a share of a registration that covers them.
    ///
    /// # Safety
    /// For [`Memory::Mapped`], `addr..addr+len` must stay mapped in this process until the
    /// returned share is [`release`](Self::release)d (NCCL's `regMr`/`deregMr` contract).
    pub(crate) unsafe fn acquire(
        &self,
        addr: u64,
        len: u64,
        memory: Memory,
        access: u32,
    ) -> Result<CachedMr, CacheError> {
        let mut cache = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let range = match cache.acquire(addr, len).map_err(CacheError::Cache)? {
            Acquired::Hit(range) => {
                let (lkey, rkey) = D::keys(
                    cache
                        .get(range)
                        .ok_or(CacheError::Cache(RegCacheError::NotCached(range)))?,
                );
                return Ok(CachedMr { range, lkey, rkey });
            }
            Acquired::Miss(range) => range,
        };
        let size = usize::try_from(range.len()).map_err(|_| {
            CacheError::Verbs(VerbsError::InvalidArgument {
                what: "registration larger than the address space",
            })
        })?;
        let dmabuf = match memory {
            Memory::Mapped => None,
            Memory::DmaBuf { fd, offset } => {
                let lead = addr - range.start;
                let start = offset
                    .checked_sub(lead)
                    .ok_or(CacheError::UnalignedDmaBuf { offset, lead })?;
                Some((fd, start))
            }
        };
        // SAFETY: the pages of `addr..addr+len` are the caller's mapped memory (the function's
        // contract); registering the whole pages they lie on pins nothing else (the kernel pins
        // per page anyway). A dma-buf is the kernel's to keep.
        let mr = unsafe { self.device.register(range.start, size, dmabuf, access) }
            .map_err(CacheError::Verbs)?;
        insert::<D>(&mut cache, range, mr)
    }

    /// Give back one share of `range`; the last share deregisters the memory.
    pub(crate) fn release(&self, range: PageRange) -> Result<(), RegCacheError> {
        let mut cache = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        // Deregistration (the region's drop) happens here, under the lock, so a concurrent
        // `acquire` of the same pages cannot find the entry gone but the pages still registered.
        cache.release(range).map(drop)
    }
}

/// Cache a new registration of `range`; the caller's share of it.
fn insert<D: PortDevice>(
    cache: &mut RegCache<D::Registration>,
    range: PageRange,
    mr: D::Registration,
) -> Result<CachedMr, CacheError> {
    let (lkey, rkey) = D::keys(&mr);
    cache.insert(range, mr).map_err(CacheError::Cache)?;
    Ok(CachedMr { range, lkey, rkey })
}
