//! Replays of the loops NCCL 2.24 – 2.30 run over a plugin's `makeVDevice` while building its
//! topology (`ncclTopoProcessNet` → `ncclTopoMakeVNics` → `ncclTopoAutoMerge` →
//! `ncclTopoMakeVnic` in `src/graph/topo.cc`), driven against the `makeVDevice` entry of every
//! exported table that has one. Written from NCCL's source; NCCL itself cannot run here.
//!
//! What the loops do with the entry:
//! - every version: a NULL `makeVDevice` means "use the physical devices" and nothing is called;
//! - 2.24.3 – 2.25.1: called for every NIC group, one-device groups included; a failure aborts
//!   communicator init;
//! - 2.26.2 – 2.26.6: called for every group too; a failure marks the group's devices unplaced and
//!   restarts the placement at `i = 0` (then `i++`), so a one-device group that fails is retried
//!   forever once there are 2 NICs or more (NCCL holds its net lock meanwhile);
//! - 2.27.3 – 2.30: one-device groups are skipped; a failed group is split (its members moved to
//!   `PATH_DIS`) and placement restarts, which terminates.
//!
//! Each replay is bounded, so a loop that would never end shows up as a failure, not a hang.
//!
//! Unsafe (opted in): the replay calls the exported `extern "C"` entries as NCCL does, and one test
//! entry is itself an `extern "C"` function.

#![allow(unsafe_code)]

use super::tables::{ncclNetPlugin_v9, ncclNetPlugin_v10, ncclNetPlugin_v11, ncclNetPlugin_v12};
use crate::sys::{
    NCCL_INVALID_USAGE, NCCL_SUCCESS, NcclNetVDevicePropsV9, NcclNetVDevicePropsV12, NcclResult,
};
use core::ffi::c_int;

/// NCCL's path types, as far as merging is concerned.
const PATH_LOC: u32 = 0;
const PATH_PORT: u32 = 1;
const PATH_PIX: u32 = 3;
const PATH_SYS: u32 = 9;
const PATH_DIS: u32 = 11;

/// How many `makeVDevice` calls a replay allows before it calls the loop endless. A terminating
/// loop over 8 NICs makes at most a few dozen.
const MAX_CALLS: usize = 10_000;

/// The three behaviours NCCL's versions have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// 2.24.3 – 2.25.1.
    FatalOnFailure,
    /// 2.26.2 – 2.26.6.
    RetryIncludingSingles,
    /// 2.27.3 – 2.30.
    SkipSingles,
}

const FAMILIES: [Family; 3] = [
    Family::FatalOnFailure,
    Family::RetryIncludingSingles,
    Family::SkipSingles,
];

/// How the NICs sit relative to each other (NCCL's `paths[i][j]`).
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Every NIC on its own PCI switch: all groups have one device.
    Separate,
    /// Dual-port cards: NICs `2k` and `2k+1` are `PATH_PORT` apart, merged by the default level.
    DualPort,
    /// Every NIC behind one PCI switch, merged with `NCCL_NET_MERGE_LEVEL=PIX`.
    OneSwitch,
}

const LAYOUTS: [Layout; 3] = [Layout::Separate, Layout::DualPort, Layout::OneSwitch];

impl Layout {
    fn path(self, i: usize, j: usize) -> u32 {
        if i == j {
            return PATH_LOC;
        }
        match self {
            Self::Separate => PATH_SYS,
            Self::DualPort if i / 2 == j / 2 => PATH_PORT,
            Self::DualPort => PATH_SYS,
            Self::OneSwitch => PATH_PIX,
        }
    }

    /// `NCCL_NET_MERGE_LEVEL` for the layout (default `PORT`).
    fn merge_level(self) -> u32 {
        match self {
            Self::OneSwitch => PATH_PIX,
            _ => PATH_PORT,
        }
    }
}

/// The request struct of one table version, as NCCL fills it.
trait VProps: Default {
    fn push(&mut self, dev: c_int);
    fn len(&self) -> usize;
    fn dev(&self, k: usize) -> usize;
    /// `NCCL_NET_MAX_DEVS_PER_NIC` for this version.
    const MAX_DEVS: usize;
}

/// Both request layouts have `ndevs` and a `devs` array; only the array length differs.
macro_rules! vprops {
    ($ty:ty, $max:expr) => {
        impl VProps for $ty {
            fn push(&mut self, dev: c_int) {
                self.devs[self.ndevs as usize] = dev;
                self.ndevs += 1;
            }
            fn len(&self) -> usize {
                self.ndevs as usize
            }
            fn dev(&self, k: usize) -> usize {
                self.devs[k] as usize
            }
            const MAX_DEVS: usize = $max;
        }
    };
}
vprops!(NcclNetVDevicePropsV9, 4);
vprops!(NcclNetVDevicePropsV12, 8);

type MakeVDevice<V> = Option<unsafe extern "C" fn(*mut c_int, *mut V) -> NcclResult>;

/// How NCCL's topology set-up ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// `makeVDevice` is NULL: NCCL uses the physical devices.
    Physical,
    /// Every group was placed; `made` virtual devices were created.
    Merged { made: usize },
}

/// Why NCCL's topology set-up would not finish.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The error aborts communicator init (2.24 / 2.25).
    InitFails(NcclResult),
    /// The placement loop does not terminate.
    Endless,
    /// `makeVDevice` reported success but returned a physical device's index.
    IndexNotNew(c_int),
}

/// One replay of `ncclTopoMakeVNics` + `ncclTopoAutoMerge` for `nics` physical devices.
fn replay<V: VProps>(
    family: Family,
    make: MakeVDevice<V>,
    nics: usize,
    layout: Layout,
) -> Result<Outcome, Failure> {
    // ncclTopoProcessNet: usePhysicalDevices = (dumpXmlFile || makeVDevice == NULL).
    let Some(make) = make else {
        return Ok(Outcome::Physical);
    };
    let merge_level = layout.merge_level();
    let mut paths: Vec<u32> = (0..nics * nics)
        .map(|k| layout.path(k / nics, k % nics))
        .collect();
    let mut placed = vec![false; nics];
    let mut calls = 0;
    let mut made = 0;
    // `for (int i = 0; i < n; i++)` whose body may set `i = 0` (so the next round is `i = 1`).
    let mut i = 0;
    while i < nics {
        if !placed[i] {
            let mut props = V::default();
            props.push(i as c_int);
            placed[i] = true;
            for j in 0..nics {
                if paths[i * nics + j] <= merge_level && !placed[j] && j != i {
                    props.push(j as c_int);
                    placed[j] = true;
                }
                if props.len() == V::MAX_DEVS {
                    break;
                }
            }
            // ncclTopoMakeVnic.
            let result = if family == Family::SkipSingles && props.len() == 1 {
                NCCL_SUCCESS
            } else {
                calls += 1;
                if calls > MAX_CALLS {
                    return Err(Failure::Endless);
                }
                let mut index: c_int = -1;
                // SAFETY: NCCL passes a valid out-pointer and a filled request of the table's
                // version; both live on this stack frame for the call.
                let result = unsafe { make(&mut index, &mut props) };
                if result == NCCL_SUCCESS {
                    // NCCL appends virtual devices after the physical ones.
                    if usize::try_from(index).map_or(true, |d| d < nics) {
                        return Err(Failure::IndexNotNew(index));
                    }
                    made += 1;
                }
                result
            };
            if result != NCCL_SUCCESS {
                if family == Family::FatalOnFailure {
                    return Err(Failure::InitFails(result));
                }
                placed[i] = false;
                for k in 1..props.len() {
                    let dev = props.dev(k);
                    placed[dev] = false;
                    paths[i * nics + dev] = PATH_DIS;
                    paths[dev * nics + i] = PATH_DIS;
                }
                i = 0;
            }
        }
        i += 1;
    }
    Ok(Outcome::Merged { made })
}

/// Run every family over 1, 2, 4 and 8 NICs in every layout; collect what failed.
fn replay_all<V: VProps>(table: &str, make: MakeVDevice<V>) -> Vec<String> {
    let mut failures = Vec::new();
    for family in FAMILIES {
        for nics in [1, 2, 4, 8] {
            for layout in LAYOUTS {
                if let Err(why) = replay(family, make, nics, layout) {
                    failures.push(format!(
                        "{table} {family:?} {nics} NIC(s) {layout:?}: {why:?}"
                    ));
                }
            }
        }
    }
    failures
}

/// Every exported table's `makeVDevice` lets every NCCL version's set-up finish, on an
/// initialized plugin with 8 (simulated) ports, as NCCL calls it after `devices()`.
#[test]
fn every_nccl_version_finishes_topology_setup_with_every_table() {
    let _serial = super::export_tests::serial();
    crate::backend::sim::set_ports(8);
    crate::net::forget_devices_for_tests();
    let table = &ncclNetPlugin_v12.0;
    let mut ctx = core::ptr::null_mut();
    // SAFETY: as NCCL calls init: a live out-pointer; NULL config, logger and profiler are
    // allowed.
    let rc = unsafe { (table.init.unwrap())(&mut ctx, 0x7e9, core::ptr::null_mut(), None, None) };
    assert_eq!(rc, NCCL_SUCCESS, "init");
    let mut failures = Vec::new();
    failures.extend(replay_all("v9", ncclNetPlugin_v9.0.make_vdevice));
    failures.extend(replay_all("v10", ncclNetPlugin_v10.0.make_vdevice));
    failures.extend(replay_all("v11", ncclNetPlugin_v11.0.make_vdevice));
    failures.extend(replay_all("v12", ncclNetPlugin_v12.0.make_vdevice));
    // SAFETY: the context `init` returned, finalized once.
    assert_eq!(unsafe { (table.finalize.unwrap())(ctx) }, NCCL_SUCCESS);
    crate::backend::sim::set_ports(1);
    crate::net::forget_devices_for_tests();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An entry that refuses every request (what Rivet exported before).
///
/// # Safety
/// None needed: it reads neither pointer.
unsafe extern "C" fn refuse_all(_d: *mut c_int, _props: *mut NcclNetVDevicePropsV9) -> NcclResult {
    NCCL_INVALID_USAGE
}

/// The replay tells the failures apart: a refusing entry fails init on 2.24, never ends on 2.26
/// with two NICs, and is survived by 2.27+.
#[test]
fn replay_detects_a_refusing_make_vdevice() {
    let make: MakeVDevice<NcclNetVDevicePropsV9> = Some(refuse_all);
    assert_eq!(
        replay(Family::FatalOnFailure, make, 1, Layout::Separate),
        Err(Failure::InitFails(NCCL_INVALID_USAGE))
    );
    assert_eq!(
        replay(Family::RetryIncludingSingles, make, 2, Layout::Separate),
        Err(Failure::Endless)
    );
    assert_eq!(
        replay(Family::SkipSingles, make, 8, Layout::DualPort),
        Ok(Outcome::Merged { made: 0 })
    );
    assert_eq!(
        replay::<NcclNetVDevicePropsV9>(Family::FatalOnFailure, None, 8, Layout::DualPort),
        Ok(Outcome::Physical)
    );
}
