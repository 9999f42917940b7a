//! The simulated fabric's shared state: one `rivet_core::sim::Fabric`, the mirrors of the
//! simulated port's registrations, the endpoints' slots, and the translation of work requests
//! from process addresses to the fabric's (see the parent module). It imports nothing of the
//! plugin: the simulated port's device (`super::device`) registers here.
//!
//! Unsafe (opted in): copying between a registered buffer and its mirror reads and writes process
//! memory by address (inside a registration, which NCCL keeps mapped until `deregMr`), and the
//! fabric's state, which is single-threaded (`Rc`), is shared behind a mutex with a hand-written
//! `Send`.

#![allow(unsafe_code)]

use rivet_core::nic::{RemoteRegion, Sge};
use rivet_core::sim::{EndpointId, Fabric, MemoryRegion, QpConfig, SimNic};
use std::sync::{Mutex, MutexGuard};

/// Keys of advertised inbound regions: bit 31 clear, so never one of the fabric's remote keys.
pub(super) const ADVERTISED_RKEY: u32 = 0x4000_0000;
/// Base address of advertised inbound regions (one 4 GiB window per endpoint).
pub(super) const ADVERTISED_ADDR: u64 = 0x7e00_0000_0000;

static WORLD: Mutex<Option<World>> = Mutex::new(None);

/// Create the fabric if it does not exist yet.
pub(super) fn create() {
    world().get_or_insert_with(World::new);
}

/// Register `len` bytes at `addr` (a page range the registration cache missed on): give them a
/// mirror in the fabric. Dropping the result deregisters the mirror.
pub(super) fn register(addr: u64, len: u64) -> SimMr {
    let mut guard = world();
    let w = guard.get_or_insert_with(World::new);
    let sim_addr = w.fabric.alloc(w.device, len as usize);
    let sim = w.fabric.register(w.device, sim_addr, len);
    w.mirrors.push(Mirror {
        real: addr,
        len,
        sim,
    });
    SimMr {
        lkey: sim.lkey,
        rkey: sim.rkey,
    }
}

/// A registration of the simulated port: the keys of its mirror.
#[derive(Debug)]
pub(crate) struct SimMr {
    lkey: u32,
    rkey: u32,
}

impl SimMr {
    /// (local key, remote key).
    pub(crate) fn keys(&self) -> (u32, u32) {
        (self.lkey, self.rkey)
    }
}

impl Drop for SimMr {
    fn drop(&mut self) {
        let mut guard = world();
        let Some(w) = guard.as_mut() else { return };
        let Some(i) = w.mirrors.iter().position(|m| m.sim.lkey == self.lkey) else {
            return;
        };
        let m = w.mirrors.remove(i);
        w.fabric.deregister(w.device, m.sim.lkey);
        // Nothing is copied back into memory that is no longer registered.
        w.copies
            .retain(|c| c.real < m.real || c.real >= m.real + m.len);
    }
}

pub(super) fn world() -> MutexGuard<'static, Option<World>> {
    WORLD.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fabric and what this backend knows of it.
pub(super) struct World {
    pub(super) fabric: Fabric,
    /// The one fabric endpoint: every queue pair and registration of the simulated port.
    pub(super) device: EndpointId,
    pub(super) endpoints: Vec<Slot>,
    /// Live registrations (deregistered ones are removed).
    mirrors: Vec<Mirror>,
    /// Writes into registered buffers posted and not yet copied back.
    copies: Vec<CopyBack>,
}

// SAFETY: `Fabric` and `SimNic` share their state through `Rc`, which must not be touched from
// two threads at once. Every one of those values lives inside the `World`, which is reachable
// only through `WORLD`'s mutex; nothing here hands an `Rc` (or a reference into one) out of a
// locked section, so all clones, uses and drops happen under the lock, one thread at a time.
unsafe impl Send for World {}

impl World {
    pub(super) fn new() -> Self {
        let fabric = Fabric::new();
        let device = fabric.endpoint();
        Self {
            fabric,
            device,
            endpoints: Vec::new(),
            mirrors: Vec::new(),
            copies: Vec::new(),
        }
    }

    /// The mirror registered under `key` (its local or remote key) holding `addr..addr+len`.
    fn mirror(&self, key: u32, addr: u64, len: u64) -> Option<&Mirror> {
        let end = addr.checked_add(len)?;
        self.mirrors.iter().find(|m| {
            (m.sim.lkey == key || m.sim.rkey == key) && addr >= m.real && end <= m.real + m.len
        })
    }

    /// The local payload as the fabric sees it: a registered buffer's bytes are copied into its
    /// mirror first. Anything else goes to the fabric as it is (and fails there).
    pub(super) fn local(&self, sge: Sge) -> Sge {
        let Some(m) = self.mirror(sge.lkey, sge.addr, u64::from(sge.len)) else {
            return sge;
        };
        let sim_addr = m.sim.addr + (sge.addr - m.real);
        // SAFETY: `sge.addr..+len` lies inside a registration (checked by `mirror`), whose
        // buffer NCCL keeps mapped and readable until `deregMr`.
        let bytes = unsafe { real_bytes(sge.addr, sge.len as usize) };
        self.fabric.write(self.device, sim_addr, bytes);
        Sge {
            addr: sim_addr,
            len: sge.len,
            lkey: m.sim.lkey,
        }
    }

    /// The remote address and key as the fabric sees them.
    pub(super) fn remote(&mut self, addr: u64, rkey: u32, len: usize) -> (u64, u32) {
        if let Some(id) = rkey.checked_sub(ADVERTISED_RKEY)
            && let Some(slot) = self.endpoints.get(id as usize)
            && let Some(nic) = &slot.nic
        {
            let actual = nic.inbound_region();
            return (
                actual.addr + addr.wrapping_sub(slot.advertised.addr),
                actual.rkey,
            );
        }
        let Some(m) = self.mirror(rkey, addr, len as u64) else {
            return (addr, rkey);
        };
        let sim_addr = m.sim.addr + (addr - m.real);
        // The mirror starts equal to the buffer, so copying the range back after a write that
        // never happened (a failed request) changes nothing.
        // SAFETY: inside a registration, as in `local`.
        let bytes = unsafe { real_bytes(addr, len) };
        self.fabric.write(self.device, sim_addr, bytes);
        self.copies.push(CopyBack {
            sim: sim_addr,
            real: addr,
            len,
        });
        (sim_addr, rkey)
    }

    /// Copy `bytes` (an eager message out of an inbound region) into the registered buffer at
    /// `dst`, as the verbs endpoint's copy does; nothing outside a registration is written.
    pub(super) fn deliver(&self, bytes: &[u8], dst: u64) {
        if bytes.is_empty() {
            return;
        }
        let inside = self.mirrors.iter().any(|m| {
            dst >= m.real
                && (dst - m.real)
                    .checked_add(bytes.len() as u64)
                    .is_some_and(|end| end <= m.len)
        });
        if inside {
            // SAFETY: `dst..+len` lies inside a live registration (just checked); NCCL does not
            // touch a receive buffer while its request is outstanding.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len()) };
        }
    }

    /// Run the fabric, then copy what it wrote into registered buffers back into them.
    pub(super) fn run(&mut self) {
        self.fabric.run_until_idle();
        for c in &self.copies {
            let bytes = self.fabric.read(self.device, c.sim, c.len);
            // SAFETY: `c.real..+len` lies inside a live registration (checked when the write was
            // posted; a deregistration drops its copies); NCCL does not touch a receive buffer
            // while its request is outstanding.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), c.real as *mut u8, c.len) };
        }
        // Requests still waiting (none unless a test holds a link down) are copied again later.
        if self.fabric.pending() == 0 {
            self.copies.clear();
        }
    }
}

/// `len` bytes of process memory at `addr`.
///
/// # Safety
/// `addr..addr+len` must be mapped, readable and not written during the returned borrow.
unsafe fn real_bytes<'a>(addr: u64, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// A registration and its mirror in the fabric.
struct Mirror {
    real: u64,
    len: u64,
    sim: MemoryRegion,
}

/// A posted write into a registered buffer.
struct CopyBack {
    sim: u64,
    real: u64,
    len: usize,
}

/// One endpoint: its geometry and, once connected, its end of a fabric pair.
pub(super) struct Slot {
    pub(super) config: QpConfig,
    /// The inbound region as advertised to the peer.
    pub(super) advertised: RemoteRegion,
    pub(super) nic: Option<SimNic>,
    pub(super) peer: Option<usize>,
}
