//! C layouts of the CollNet tables `ncclCollNet_v6_t` … `ncclCollNet_v12_t` and the
//! scatter-gather element `ncclNetSGE` (v8 with a `uint32_t` size, v9+ with `size_t`), written
//! from NCCL's `net_v6.h` … `net_v12.h`, with const asserts on sizes and offsets. The exported
//! statics are in [`crate::abi::collnet_tables`]; `tests/c/loader.c` checks them again from C.
//!
//! Version history: v6/v7 have no `iallgather`/`ireducescatter` and an `int count`; v8 adds them
//! (with `uint32_t` SGE sizes) and a `size_t regMr` size; v9 a `size_t count`, `size_t` SGE
//! sizes and `makeVDevice`; v11 the per-communicator `ctx` (`init`, `listen`, `finalize`).

use super::tables::{DeregMrFn, DevicesFn, Fn0, ListenCtxFn, ListenFn, PropsFn, RegMrDmaBufFn};
use super::tables::{RegMrFn, RegMrIntFn, TestFn};
use super::types::*;
use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

type Ptr = *mut c_void;

/// `ncclNetSGE_v8_t`: one part of a scatter-gather list, with a 32-bit size.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetSgeV8 {
    /// Registration of the part (from the CollNet `regMr`).
    pub mhandle: Ptr,
    /// First byte.
    pub address: Ptr,
    /// Bytes.
    pub size: u32,
}
const _: () = {
    assert!(size_of::<NcclNetSgeV8>() == 24);
    assert!(offset_of!(NcclNetSgeV8, address) == 8);
    assert!(offset_of!(NcclNetSgeV8, size) == 16);
};

/// `ncclNetSGE_v9_t` … `_v12_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetSgeV9 {
    /// Registration of the part.
    pub mhandle: Ptr,
    /// First byte.
    pub address: Ptr,
    /// Bytes.
    pub size: usize,
}
const _: () = {
    assert!(size_of::<NcclNetSgeV9>() == 24);
    assert!(offset_of!(NcclNetSgeV9, size) == 16);
};

/// `connect(handles[], nranks, rank, listenComm, collComm)`.
pub type CollConnectFn =
    Option<unsafe extern "C" fn(*mut Ptr, c_int, c_int, Ptr, *mut Ptr) -> NcclResult>;
/// `reduceSupport(ncclDataType_t, ncclRedOp_t, int* supported)`.
pub type ReduceSupportFn = Option<unsafe extern "C" fn(c_int, c_int, *mut c_int) -> NcclResult>;
/// `iallreduce(collComm, sendData, recvData, int count, dataType, redOp, sendMh, recvMh, request)`.
pub type IallreduceIntFn = Option<
    unsafe extern "C" fn(Ptr, Ptr, Ptr, c_int, c_int, c_int, Ptr, Ptr, *mut Ptr) -> NcclResult,
>;
/// `iallreduce` with a `size_t count` (v9+).
pub type IallreduceFn = Option<
    unsafe extern "C" fn(Ptr, Ptr, Ptr, usize, c_int, c_int, Ptr, Ptr, *mut Ptr) -> NcclResult,
>;
/// `iallgather(collComm, sendData, nRecvParts, recvParts, bytesPerRank, windowOffset,
/// windowBytes, sendMhandle, request)`.
pub type IallgatherFn<Sge> = Option<
    unsafe extern "C" fn(
        Ptr,
        Ptr,
        c_int,
        *mut Sge,
        usize,
        usize,
        usize,
        Ptr,
        *mut Ptr,
    ) -> NcclResult,
>;
/// `ireducescatter(collComm, nSendParts, sendParts, recvData, bytesPerRank, windowOffset,
/// windowBytes, dataType, redOp, recvMhandle, request)`.
pub type IreducescatterFn<Sge> = Option<
    unsafe extern "C" fn(
        Ptr,
        c_int,
        *mut Sge,
        Ptr,
        usize,
        usize,
        usize,
        c_int,
        c_int,
        Ptr,
        *mut Ptr,
    ) -> NcclResult,
>;
/// `iflush(collComm, data, int size, mhandle, request)`.
pub type CollIflushFn = Option<unsafe extern "C" fn(Ptr, Ptr, c_int, Ptr, *mut Ptr) -> NcclResult>;
/// `init(logger)` (v6 – v10).
pub type InitFn = Option<unsafe extern "C" fn(NcclDebugLogger) -> NcclResult>;

/// `ncclCollNet_v6_t` and `ncclCollNet_v7_t` (they differ only in the properties struct).
#[repr(C)]
#[derive(Debug)]
pub struct NcclCollNetV6<Props> {
    /// Name, for NCCL's log.
    pub name: *const c_char,
    /// `init(logger)`.
    pub init: InitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties`.
    pub get_properties: PropsFn<Props>,
    /// `listen(dev, handle, listenComm)`.
    pub listen: ListenFn,
    /// `connect`.
    pub connect: CollConnectFn,
    /// `reduceSupport`.
    pub reduce_support: ReduceSupportFn,
    /// `regMr(collComm, data, int size, type, mhandle)`.
    pub reg_mr: RegMrIntFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `iallreduce` (int count).
    pub iallreduce: IallreduceIntFn,
    /// `iflush`.
    pub iflush: CollIflushFn,
    /// `test(request, done, size)`.
    pub test: TestFn,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
}
const _: () = {
    assert!(size_of::<NcclCollNetV6<NcclNetPropertiesV6>>() == 120);
    assert!(size_of::<NcclCollNetV6<NcclNetPropertiesV7>>() == 120);
    assert!(offset_of!(NcclCollNetV6<NcclNetPropertiesV6>, connect) == 40);
    assert!(offset_of!(NcclCollNetV6<NcclNetPropertiesV6>, reduce_support) == 48);
    assert!(offset_of!(NcclCollNetV6<NcclNetPropertiesV6>, iallreduce) == 80);
    assert!(offset_of!(NcclCollNetV6<NcclNetPropertiesV6>, close_listen) == 112);
};

/// `ncclCollNet_v8_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclCollNetV8 {
    /// Name.
    pub name: *const c_char,
    /// `init(logger)`.
    pub init: InitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties(dev, ncclNetProperties_v8_t*)`.
    pub get_properties: PropsFn<NcclNetPropertiesV8>,
    /// `listen`.
    pub listen: ListenFn,
    /// `connect`.
    pub connect: CollConnectFn,
    /// `reduceSupport`.
    pub reduce_support: ReduceSupportFn,
    /// `regMr(collComm, data, size_t size, type, mhandle)`.
    pub reg_mr: RegMrFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `iallreduce` (int count).
    pub iallreduce: IallreduceIntFn,
    /// `iallgather` (v8 SGE).
    pub iallgather: IallgatherFn<NcclNetSgeV8>,
    /// `ireducescatter` (v8 SGE).
    pub ireducescatter: IreducescatterFn<NcclNetSgeV8>,
    /// `iflush`.
    pub iflush: CollIflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
}
const _: () = {
    assert!(size_of::<NcclCollNetV8>() == 136);
    assert!(offset_of!(NcclCollNetV8, iallreduce) == 80);
    assert!(offset_of!(NcclCollNetV8, iallgather) == 88);
    assert!(offset_of!(NcclCollNetV8, ireducescatter) == 96);
    assert!(offset_of!(NcclCollNetV8, iflush) == 104);
    assert!(offset_of!(NcclCollNetV8, close_listen) == 128);
};

/// `ncclCollNet_v9_t` and `ncclCollNet_v10_t` (same layout; v10's properties are v9's).
#[repr(C)]
#[derive(Debug)]
pub struct NcclCollNetV9 {
    /// Name.
    pub name: *const c_char,
    /// `init(logger)`.
    pub init: InitFn,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties(dev, ncclNetProperties_v9_t*)`.
    pub get_properties: PropsFn<NcclNetPropertiesV9>,
    /// `listen`.
    pub listen: ListenFn,
    /// `connect`.
    pub connect: CollConnectFn,
    /// `reduceSupport`.
    pub reduce_support: ReduceSupportFn,
    /// `regMr`.
    pub reg_mr: RegMrFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `iallreduce` (size_t count).
    pub iallreduce: IallreduceFn,
    /// `iallgather`.
    pub iallgather: IallgatherFn<NcclNetSgeV9>,
    /// `ireducescatter`.
    pub ireducescatter: IreducescatterFn<NcclNetSgeV9>,
    /// `iflush`.
    pub iflush: CollIflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `makeVDevice(int* d, ncclNetVDeviceProps_v9_t*)`.
    pub make_vdevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV9) -> NcclResult>,
}
const _: () = {
    assert!(size_of::<NcclCollNetV9>() == 144);
    assert!(offset_of!(NcclCollNetV9, make_vdevice) == 136);
};

/// `ncclCollNet_v11_t` and `ncclCollNet_v12_t`: the per-communicator context, `finalize`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclCollNetV11<Props, VProps> {
    /// Name.
    pub name: *const c_char,
    /// `init(void** ctx, uint64_t commId, logger)` (no config, no profiler callback).
    pub init: Option<unsafe extern "C" fn(*mut Ptr, u64, NcclDebugLogger) -> NcclResult>,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties`.
    pub get_properties: PropsFn<Props>,
    /// `listen(ctx, dev, handle, listenComm)`.
    pub listen: ListenCtxFn,
    /// `connect`.
    pub connect: CollConnectFn,
    /// `reduceSupport`.
    pub reduce_support: ReduceSupportFn,
    /// `regMr`.
    pub reg_mr: RegMrFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `iallreduce`.
    pub iallreduce: IallreduceFn,
    /// `iallgather`.
    pub iallgather: IallgatherFn<NcclNetSgeV9>,
    /// `ireducescatter`.
    pub ireducescatter: IreducescatterFn<NcclNetSgeV9>,
    /// `iflush`.
    pub iflush: CollIflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeColl`.
    pub close_coll: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `makeVDevice`.
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut VProps) -> NcclResult>,
    /// `finalize(ctx)`.
    pub finalize: Fn0,
}
const _: () = {
    assert!(size_of::<NcclCollNetV11<NcclNetPropertiesV11, NcclNetVDevicePropsV9>>() == 152);
    assert!(size_of::<NcclCollNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>>() == 152);
    assert!(
        offset_of!(NcclCollNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>, make_vdevice)
            == 136
    );
    assert!(
        offset_of!(NcclCollNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>, finalize) == 144
    );
};
