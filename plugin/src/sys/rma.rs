//! C layouts of the RMA tables `ncclRma_v13_t` … `ncclRma_v16_t` (NCCL 2.30.7 loads v14, then
//! v13; its development tree and RCCL have v15 and v16), their configs and v16's properties,
//! written by hand from NCCL's `rma_v13.h` … `rma_v16.h` (v13 is the layout of the GIN v13
//! table, `gin_v13.h`), with const asserts on sizes and offsets. The exported statics are in
//! [`crate::abi::rma_tables`]; `tests/c/loader.c` checks them again from C.
//!
//! Version history: v13 (the GIN v13 layout) has a GIN config, `createContext` returns a device
//! handle, `regMrSym` a GIN handle, and `iputSignal` has no strong/weak flag; v14 a config of its
//! own (`nContexts`, `trafficClass`, `rankStride`) and `isStrongSignal`; v15 `optFlags` on
//! `iput`/`iputSignal`/`iget`; v16 `getRmaProperties` after `devices`.

use super::tables::{DevicesFn, Fn0, ListenCtxFn, PropsFn};
use super::types::*;
use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

type Ptr = *mut c_void;

/// `ncclNetDeviceType` `NCCL_NET_DEVICE_GIN_PROXY`: the type an RMA table's `getProperties`
/// must report for NCCL to keep the table.
pub const NCCL_NET_DEVICE_GIN_PROXY: c_int = 2;
/// `NCCL_NET_MR_FLAG_FORCE_SO`: register without relaxed ordering.
pub const NCCL_NET_MR_FLAG_FORCE_SO: u64 = 1;

/// `ncclGinConfig_v13_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclGinConfigV13 {
    /// Signals the device side uses (GIN; unused by a proxy backend).
    pub n_signals: c_int,
    /// Counters the device side uses (unused by a proxy backend).
    pub n_counters: c_int,
    /// Independent sets of connections.
    pub n_contexts: c_int,
    /// Queue depth hint (unused by a proxy backend).
    pub queue_depth: c_int,
    /// Traffic class, or unset.
    pub traffic_class: c_int,
}
const _: () = {
    assert!(size_of::<NcclGinConfigV13>() == 20);
    assert!(offset_of!(NcclGinConfigV13, n_contexts) == 8);
    assert!(offset_of!(NcclGinConfigV13, traffic_class) == 16);
};

/// `ncclRmaConfig_v14_t` (also v15's and v16's).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclRmaConfigV14 {
    /// Independent sets of connections.
    pub n_contexts: c_int,
    /// Traffic class, or unset (NCCL passes `INT_MIN` or -1).
    pub traffic_class: c_int,
    /// Connect to every `rankStride`-th rank (NCCL passes 1).
    pub rank_stride: c_int,
}
const _: () = {
    assert!(size_of::<NcclRmaConfigV14>() == 12);
    assert!(offset_of!(NcclRmaConfigV14, rank_stride) == 8);
};

/// `ncclRmaProperties_v16_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclRmaPropertiesV16 {
    /// Any signal received makes every put received on the communicator visible.
    pub flushes_all_puts_on_any_signal: bool,
}
const _: () = assert!(size_of::<NcclRmaPropertiesV16>() == 1);

/// `init(ctx, commId, logger)`.
pub type RmaInitFn = Option<unsafe extern "C" fn(*mut Ptr, u64, NcclDebugLogger) -> NcclResult>;
/// `connect(ctx, handles[], nranks, rank, listenComm, collComm)`.
pub type RmaConnectFn =
    Option<unsafe extern "C" fn(Ptr, *mut Ptr, c_int, c_int, Ptr, *mut Ptr) -> NcclResult>;
/// `regMrSym(collComm, data, size, type, mrFlags, mhandle)` (v14+).
pub type RegMrSymFn =
    Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, *mut Ptr) -> NcclResult>;
/// `regMrSymDmaBuf(collComm, data, size, type, offset, fd, mrFlags, mhandle)` (v14+).
pub type RegMrSymDmaBufFn =
    Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, u64, *mut Ptr) -> NcclResult>;
/// `deregMrSym(collComm, mhandle)`.
pub type DeregMrSymFn = Option<unsafe extern "C" fn(Ptr, Ptr) -> NcclResult>;
/// `iput(rmaCtx, context, srcOff, srcMh, size, dstOff, dstMh, rank, request)` (v13, v14).
pub type IputFn = Option<
    unsafe extern "C" fn(Ptr, c_int, u64, Ptr, usize, u64, Ptr, u32, *mut Ptr) -> NcclResult,
>;
/// `iput(…, rank, optFlags, request)` (v15+).
pub type IputOptFn = Option<
    unsafe extern "C" fn(Ptr, c_int, u64, Ptr, usize, u64, Ptr, u32, u32, *mut Ptr) -> NcclResult,
>;
/// `iputSignal(…, signalOff, signalMh, signalValue, signalOp, request)` (v13).
pub type IputSignalV13Fn = Option<
    unsafe extern "C" fn(
        Ptr,
        c_int,
        u64,
        Ptr,
        usize,
        u64,
        Ptr,
        u32,
        u64,
        Ptr,
        u64,
        u32,
        *mut Ptr,
    ) -> NcclResult,
>;
/// `iputSignal(…, signalOp, isStrongSignal, request)` (v14).
pub type IputSignalV14Fn = Option<
    unsafe extern "C" fn(
        Ptr,
        c_int,
        u64,
        Ptr,
        usize,
        u64,
        Ptr,
        u32,
        u64,
        Ptr,
        u64,
        u32,
        bool,
        *mut Ptr,
    ) -> NcclResult,
>;
/// `iputSignal(…, signalOp, isStrongSignal, optFlags, request)` (v15+).
pub type IputSignalOptFn = Option<
    unsafe extern "C" fn(
        Ptr,
        c_int,
        u64,
        Ptr,
        usize,
        u64,
        Ptr,
        u32,
        u64,
        Ptr,
        u64,
        u32,
        bool,
        u32,
        *mut Ptr,
    ) -> NcclResult,
>;
/// `iget(rmaCtx, context, remoteOff, remoteMh, size, localOff, localMh, rank, request)` (v13,
/// v14); the same shape as `iput`.
pub type IgetFn = IputFn;
/// `iget(…, rank, optFlags, request)` (v15+).
pub type IgetOptFn = IputOptFn;
/// `iflush(rmaCtx, context, mhandle, rank, request)`.
pub type RmaIflushFn = Option<unsafe extern "C" fn(Ptr, c_int, Ptr, u32, *mut Ptr) -> NcclResult>;
/// `test(collComm, request, done)`.
pub type RmaTestFn = Option<unsafe extern "C" fn(Ptr, Ptr, *mut c_int) -> NcclResult>;
/// `queryLastError(rmaCtx, hasError)`.
pub type QueryLastErrorFn = Option<unsafe extern "C" fn(Ptr, *mut bool) -> NcclResult>;

/// `ncclRma_v13_t` (the layout of `ncclGin_v13_t`).
#[repr(C)]
#[derive(Debug)]
pub struct NcclRmaV13 {
    /// Name.
    pub name: *const c_char,
    /// `init`.
    pub init: RmaInitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties`.
    pub get_properties: PropsFn<NcclNetPropertiesV12>,
    /// `listen(ctx, dev, handle, listenComm)`.
    pub listen: ListenCtxFn,
    /// `connect`.
    pub connect: RmaConnectFn,
    /// `createContext(collComm, config, ginCtx, devHandle)`.
    pub create_context: Option<
        unsafe extern "C" fn(
            Ptr,
            *mut NcclGinConfigV13,
            *mut Ptr,
            *mut *mut NcclNetDeviceHandle,
        ) -> NcclResult,
    >,
    /// `regMrSym(collComm, data, size, type, mrFlags, mhandle, ginHandle)`.
    pub reg_mr_sym:
        Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, *mut Ptr, *mut Ptr) -> NcclResult>,
    /// `regMrSymDmaBuf(…, mrFlags, mhandle, ginHandle)`.
    pub reg_mr_sym_dma_buf: Option<
        unsafe extern "C" fn(
            Ptr,
            Ptr,
            usize,
            c_int,
            u64,
            c_int,
            u64,
            *mut Ptr,
            *mut Ptr,
        ) -> NcclResult,
    >,
    /// `deregMrSym`.
    pub dereg_mr_sym: DeregMrSymFn,
    /// `destroyContext`.
    pub destroy_context: Fn0,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `iput`.
    pub iput: IputFn,
    /// `iputSignal` (no strong/weak flag).
    pub iput_signal: IputSignalV13Fn,
    /// `iget`.
    pub iget: IgetFn,
    /// `iflush`.
    pub iflush: RmaIflushFn,
    /// `test`.
    pub test: RmaTestFn,
    /// `ginProgress`.
    pub progress: Fn0,
    /// `queryLastError`.
    pub query_last_error: QueryLastErrorFn,
    /// `finalize`.
    pub finalize: Fn0,
}
const _: () = {
    assert!(size_of::<NcclRmaV13>() == 168);
    assert!(offset_of!(NcclRmaV13, create_context) == 48);
    assert!(offset_of!(NcclRmaV13, iput) == 104);
    assert!(offset_of!(NcclRmaV13, test) == 136);
    assert!(offset_of!(NcclRmaV13, finalize) == 160);
};

/// `ncclRma_v14_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclRmaV14 {
    /// Name.
    pub name: *const c_char,
    /// `init`.
    pub init: RmaInitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties`.
    pub get_properties: PropsFn<NcclNetPropertiesV12>,
    /// `listen`.
    pub listen: ListenCtxFn,
    /// `connect`.
    pub connect: RmaConnectFn,
    /// `createContext(collComm, config, rmaCtx)`.
    pub create_context:
        Option<unsafe extern "C" fn(Ptr, *mut NcclRmaConfigV14, *mut Ptr) -> NcclResult>,
    /// `regMrSym`.
    pub reg_mr_sym: RegMrSymFn,
    /// `regMrSymDmaBuf`.
    pub reg_mr_sym_dma_buf: RegMrSymDmaBufFn,
    /// `deregMrSym`.
    pub dereg_mr_sym: DeregMrSymFn,
    /// `destroyContext`.
    pub destroy_context: Fn0,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `iput`.
    pub iput: IputFn,
    /// `iputSignal`.
    pub iput_signal: IputSignalV14Fn,
    /// `iget`.
    pub iget: IgetFn,
    /// `iflush`.
    pub iflush: RmaIflushFn,
    /// `test`.
    pub test: RmaTestFn,
    /// `rmaProgress`.
    pub progress: Fn0,
    /// `queryLastError`.
    pub query_last_error: QueryLastErrorFn,
    /// `finalize`.
    pub finalize: Fn0,
}
const _: () = {
    assert!(size_of::<NcclRmaV14>() == 168);
    assert!(offset_of!(NcclRmaV14, iput_signal) == 112);
    assert!(offset_of!(NcclRmaV14, finalize) == 160);
};

/// `ncclRma_v15_t`: v14 with `optFlags`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclRmaV15 {
    /// Name.
    pub name: *const c_char,
    /// `init`.
    pub init: RmaInitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties`.
    pub get_properties: PropsFn<NcclNetPropertiesV12>,
    /// `listen`.
    pub listen: ListenCtxFn,
    /// `connect`.
    pub connect: RmaConnectFn,
    /// `createContext`.
    pub create_context:
        Option<unsafe extern "C" fn(Ptr, *mut NcclRmaConfigV14, *mut Ptr) -> NcclResult>,
    /// `regMrSym`.
    pub reg_mr_sym: RegMrSymFn,
    /// `regMrSymDmaBuf`.
    pub reg_mr_sym_dma_buf: RegMrSymDmaBufFn,
    /// `deregMrSym`.
    pub dereg_mr_sym: DeregMrSymFn,
    /// `destroyContext`.
    pub destroy_context: Fn0,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `iput`.
    pub iput: IputOptFn,
    /// `iputSignal`.
    pub iput_signal: IputSignalOptFn,
    /// `iget`.
    pub iget: IgetOptFn,
    /// `iflush`.
    pub iflush: RmaIflushFn,
    /// `test`.
    pub test: RmaTestFn,
    /// `rmaProgress`.
    pub progress: Fn0,
    /// `queryLastError`.
    pub query_last_error: QueryLastErrorFn,
    /// `finalize`.
    pub finalize: Fn0,
}
const _: () = {
    assert!(size_of::<NcclRmaV15>() == 168);
    assert!(offset_of!(NcclRmaV15, iget) == 120);
};

/// `ncclRma_v16_t`: v15 with `getRmaProperties` after `devices`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclRmaV16 {
    /// Name.
    pub name: *const c_char,
    /// `init`.
    pub init: RmaInitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getRmaProperties(collComm, props)`.
    pub get_rma_properties:
        Option<unsafe extern "C" fn(Ptr, *mut NcclRmaPropertiesV16) -> NcclResult>,
    /// `getProperties`.
    pub get_properties: PropsFn<NcclNetPropertiesV12>,
    /// `listen`.
    pub listen: ListenCtxFn,
    /// `connect`.
    pub connect: RmaConnectFn,
    /// `createContext`.
    pub create_context:
        Option<unsafe extern "C" fn(Ptr, *mut NcclRmaConfigV14, *mut Ptr) -> NcclResult>,
    /// `regMrSym`.
    pub reg_mr_sym: RegMrSymFn,
    /// `regMrSymDmaBuf`.
    pub reg_mr_sym_dma_buf: RegMrSymDmaBufFn,
    /// `deregMrSym`.
    pub dereg_mr_sym: DeregMrSymFn,
    /// `destroyContext`.
    pub destroy_context: Fn0,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `iput`.
    pub iput: IputOptFn,
    /// `iputSignal`.
    pub iput_signal: IputSignalOptFn,
    /// `iget`.
    pub iget: IgetOptFn,
    /// `iflush`.
    pub iflush: RmaIflushFn,
    /// `test`.
    pub test: RmaTestFn,
    /// `rmaProgress`.
    pub progress: Fn0,
    /// `queryLastError`.
    pub query_last_error: QueryLastErrorFn,
    /// `finalize`.
    pub finalize: Fn0,
}
const _: () = {
    assert!(size_of::<NcclRmaV16>() == 176);
    assert!(offset_of!(NcclRmaV16, get_rma_properties) == 24);
    assert!(offset_of!(NcclRmaV16, iput) == 112);
    assert!(offset_of!(NcclRmaV16, finalize) == 168);
};
