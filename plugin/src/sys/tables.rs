//! C layouts of the function tables `ncclNet_v6_t` … `ncclNet_v11_t` (v12 is the v11 layout
//! over v12's property structs), written by hand from NCCL's headers, with const asserts on
//! their sizes and field offsets. The exported statics that fill them are in
//! [`crate::abi::tables`]; the C loader test (`tests/abi_loader.rs`) checks them again from C.

use super::types::*;
use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

type Ptr = *mut c_void;
/// A call on one handle (`closeSend`, `finalize`, …).
pub type Fn0 = Option<unsafe extern "C" fn(Ptr) -> NcclResult>;
/// `devices(int*)`.
pub type DevicesFn = Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>;
/// `getProperties(dev, props)` over the version's properties struct.
pub type PropsFn<P> = Option<unsafe extern "C" fn(c_int, *mut P) -> NcclResult>;
/// `listen(dev, handle, listenComm)`.
pub type ListenFn = Option<unsafe extern "C" fn(c_int, Ptr, *mut Ptr) -> NcclResult>;
/// `listen(ctx, dev, handle, listenComm)` (v11+).
pub type ListenCtxFn = Option<unsafe extern "C" fn(Ptr, c_int, Ptr, *mut Ptr) -> NcclResult>;
type DevHandleOut = *mut *mut NcclNetDeviceHandle;
/// `regMr` with an `int` size (v6 – v7).
pub type RegMrIntFn = Option<unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, *mut Ptr) -> NcclResult>;
/// `regMr` with a `size_t` size (v8 on).
pub type RegMrFn = Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, *mut Ptr) -> NcclResult>;
/// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)`.
pub type RegMrDmaBufFn =
    Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, *mut Ptr) -> NcclResult>;
/// `deregMr(comm, mhandle)`.
pub type DeregMrFn = Option<unsafe extern "C" fn(Ptr, Ptr) -> NcclResult>;
type IflushFn = Option<
    unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut c_int, *mut Ptr, *mut Ptr) -> NcclResult,
>;
/// `test(request, done, sizes)`.
pub type TestFn = Option<unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> NcclResult>;
type GetDeviceMrFn = Option<unsafe extern "C" fn(Ptr, Ptr, *mut Ptr) -> NcclResult>;
type IrecvConsumedFn = Option<unsafe extern "C" fn(Ptr, c_int, Ptr) -> NcclResult>;

/// `ncclNet_v6_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetV6 {
    /// Plugin name.
    pub name: *const c_char,
    /// `init(logger)`.
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger) -> NcclResult>,
    /// `devices(int*)`.
    pub devices: DevicesFn,
    /// `getProperties(dev, props)`.
    pub get_properties: PropsFn<NcclNetPropertiesV6>,
    /// `listen(dev, handle, listenComm)`.
    pub listen: ListenFn,
    /// `connect(dev, handle, sendComm)`.
    pub connect: Option<unsafe extern "C" fn(c_int, Ptr, *mut Ptr) -> NcclResult>,
    /// `accept(listenComm, recvComm)`.
    pub accept: Option<unsafe extern "C" fn(Ptr, *mut Ptr) -> NcclResult>,
    /// `regMr(comm, data, int size, type, mhandle)`.
    pub reg_mr: RegMrIntFn,
    /// `regMrDmaBuf(comm, data, size_t size, type, offset, fd, mhandle)`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr(comm, mhandle)`.
    pub dereg_mr: DeregMrFn,
    /// `isend(sendComm, data, int size, tag, mhandle, request)`.
    pub isend: Option<unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, Ptr, *mut Ptr) -> NcclResult>,
    /// `irecv(recvComm, n, data, int* sizes, tags, mhandles, request)`.
    pub irecv: Option<
        unsafe extern "C" fn(
            Ptr,
            c_int,
            *mut Ptr,
            *mut c_int,
            *mut c_int,
            *mut Ptr,
            *mut Ptr,
        ) -> NcclResult,
    >,
    /// `iflush(recvComm, n, data, int* sizes, mhandles, request)`.
    pub iflush: IflushFn,
    /// `test(request, done, sizes)`.
    pub test: TestFn,
    /// `closeSend`.
    pub close_send: Fn0,
    /// `closeRecv`.
    pub close_recv: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
}
const _: () = {
    assert!(size_of::<NcclNetV6>() == 136);
    assert!(offset_of!(NcclNetV6, init) == 8);
    assert!(offset_of!(NcclNetV6, reg_mr) == 56);
    assert!(offset_of!(NcclNetV6, isend) == 80);
    assert!(offset_of!(NcclNetV6, test) == 104);
    assert!(offset_of!(NcclNetV6, close_listen) == 128);
};

/// `ncclNet_v7_t` and `ncclNet_v8_t` share this shape; they differ in the properties struct and in
/// `regMr`'s size type, so the table is generic over both.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetV7<Props, RegMr> {
    /// Plugin name.
    pub name: *const c_char,
    /// `init(logger)`.
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger) -> NcclResult>,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties` (v7 or v8 struct).
    pub get_properties: PropsFn<Props>,
    /// `listen(dev, handle, listenComm)`.
    pub listen: ListenFn,
    /// `connect(dev, handle, sendComm, sendDevComm)`.
    pub connect: Option<unsafe extern "C" fn(c_int, Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `accept(listenComm, recvComm, recvDevComm)`.
    pub accept: Option<unsafe extern "C" fn(Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `regMr` (int size in v7, size_t in v8).
    pub reg_mr: RegMr,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `isend(sendComm, data, int size, tag, mhandle, request)`.
    pub isend: Option<unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, Ptr, *mut Ptr) -> NcclResult>,
    /// `irecv(recvComm, n, data, int* sizes, tags, mhandles, request)`.
    pub irecv: Option<
        unsafe extern "C" fn(
            Ptr,
            c_int,
            *mut Ptr,
            *mut c_int,
            *mut c_int,
            *mut Ptr,
            *mut Ptr,
        ) -> NcclResult,
    >,
    /// `iflush`.
    pub iflush: IflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeSend`.
    pub close_send: Fn0,
    /// `closeRecv`.
    pub close_recv: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `getDeviceMr` (device offload only).
    pub get_device_mr: GetDeviceMrFn,
    /// `irecvConsumed` (device offload only).
    pub irecv_consumed: IrecvConsumedFn,
}
const _: () = {
    assert!(size_of::<NcclNetV7<NcclNetPropertiesV7, RegMrIntFn>>() == 152);
    assert!(size_of::<NcclNetV7<NcclNetPropertiesV8, RegMrFn>>() == 152);
    assert!(offset_of!(NcclNetV7<NcclNetPropertiesV8, RegMrFn>, reg_mr) == 56);
    assert!(offset_of!(NcclNetV7<NcclNetPropertiesV8, RegMrFn>, get_device_mr) == 136);
    assert!(offset_of!(NcclNetV7<NcclNetPropertiesV8, RegMrFn>, irecv_consumed) == 144);
};

/// `ncclNet_v9_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetV9 {
    /// Plugin name.
    pub name: *const c_char,
    /// `init(logger)`.
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger) -> NcclResult>,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties(dev, ncclNetProperties_v9_t*)`.
    pub get_properties: PropsFn<NcclNetPropertiesV9>,
    /// `listen`.
    pub listen: ListenFn,
    /// `connect(dev, handle, sendComm, sendDevComm)`.
    pub connect: Option<unsafe extern "C" fn(c_int, Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `accept`.
    pub accept: Option<unsafe extern "C" fn(Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `regMr(comm, data, size_t, type, mhandle)`.
    pub reg_mr: RegMrFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `isend(sendComm, data, size_t size, tag, mhandle, request)`.
    pub isend: Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, *mut Ptr) -> NcclResult>,
    /// `irecv(recvComm, n, data, size_t* sizes, tags, mhandles, request)`.
    pub irecv: Option<
        unsafe extern "C" fn(
            Ptr,
            c_int,
            *mut Ptr,
            *mut usize,
            *mut c_int,
            *mut Ptr,
            *mut Ptr,
        ) -> NcclResult,
    >,
    /// `iflush`.
    pub iflush: IflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeSend`.
    pub close_send: Fn0,
    /// `closeRecv`.
    pub close_recv: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `getDeviceMr`.
    pub get_device_mr: GetDeviceMrFn,
    /// `irecvConsumed`.
    pub irecv_consumed: IrecvConsumedFn,
    /// `makeVDevice(int* d, ncclNetVDeviceProps_v9_t*)`.
    pub make_vdevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV9) -> NcclResult>,
}
const _: () = {
    assert!(size_of::<NcclNetV9>() == 160);
    assert!(offset_of!(NcclNetV9, make_vdevice) == 152);
};

/// `ncclNet_v10_t`.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetV10 {
    /// Plugin name.
    pub name: *const c_char,
    /// `init(logger, profilerCallback)`.
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger, NcclProfilerCallback) -> NcclResult>,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties(dev, ncclNetProperties_v10_t*)` (same layout as v9).
    pub get_properties: PropsFn<NcclNetPropertiesV9>,
    /// `listen`.
    pub listen: ListenFn,
    /// `connect(dev, config, handle, sendComm, sendDevComm)`.
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut NcclNetCommConfig,
            Ptr,
            *mut Ptr,
            DevHandleOut,
        ) -> NcclResult,
    >,
    /// `accept`.
    pub accept: Option<unsafe extern "C" fn(Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `regMr`.
    pub reg_mr: RegMrFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `isend(sendComm, data, size_t, tag, mhandle, phandle, request)`.
    pub isend: IsendV10Fn,
    /// `irecv(recvComm, n, data, size_t* sizes, tags, mhandles, phandles, request)`.
    pub irecv: IrecvV10Fn,
    /// `iflush`.
    pub iflush: IflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeSend`.
    pub close_send: Fn0,
    /// `closeRecv`.
    pub close_recv: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `getDeviceMr`.
    pub get_device_mr: GetDeviceMrFn,
    /// `irecvConsumed`.
    pub irecv_consumed: IrecvConsumedFn,
    /// `makeVDevice`.
    pub make_vdevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV9) -> NcclResult>,
}
const _: () = assert!(size_of::<NcclNetV10>() == 160);

type IsendV10Fn =
    Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, Ptr, *mut Ptr) -> NcclResult>;
type IrecvV10Fn = Option<
    unsafe extern "C" fn(
        Ptr,
        c_int,
        *mut Ptr,
        *mut usize,
        *mut c_int,
        *mut Ptr,
        *mut Ptr,
        *mut Ptr,
    ) -> NcclResult,
>;

/// `ncclNet_v11_t` and `ncclNet_v12_t`: identical function lists over different property types.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetV11<Props, VProps> {
    /// Plugin name.
    pub name: *const c_char,
    /// `init(ctx, commId, config, logger, profilerCallback)`.
    pub init: Option<
        unsafe extern "C" fn(
            *mut Ptr,
            u64,
            *mut NcclNetCommConfig,
            NcclDebugLogger,
            NcclProfilerCallback,
        ) -> NcclResult,
    >,
    /// `devices`.
    pub devices: DevicesFn,
    /// `getProperties`.
    pub get_properties: PropsFn<Props>,
    /// `listen(ctx, dev, handle, listenComm)`.
    pub listen: ListenCtxFn,
    /// `connect(ctx, dev, handle, sendComm, sendDevComm)`.
    pub connect:
        Option<unsafe extern "C" fn(Ptr, c_int, Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `accept`.
    pub accept: Option<unsafe extern "C" fn(Ptr, *mut Ptr, DevHandleOut) -> NcclResult>,
    /// `regMr`.
    pub reg_mr: RegMrFn,
    /// `regMrDmaBuf`.
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    /// `deregMr`.
    pub dereg_mr: DeregMrFn,
    /// `isend`.
    pub isend: IsendV10Fn,
    /// `irecv`.
    pub irecv: IrecvV10Fn,
    /// `iflush`.
    pub iflush: IflushFn,
    /// `test`.
    pub test: TestFn,
    /// `closeSend`.
    pub close_send: Fn0,
    /// `closeRecv`.
    pub close_recv: Fn0,
    /// `closeListen`.
    pub close_listen: Fn0,
    /// `getDeviceMr`.
    pub get_device_mr: GetDeviceMrFn,
    /// `irecvConsumed`.
    pub irecv_consumed: IrecvConsumedFn,
    /// `makeVDevice`.
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut VProps) -> NcclResult>,
    /// `finalize(ctx)`.
    pub finalize: Fn0,
    /// `setNetAttr(ctx, attr)`.
    pub set_net_attr: Option<unsafe extern "C" fn(Ptr, *mut NcclNetAttr) -> NcclResult>,
}
const _: () = {
    assert!(size_of::<NcclNetV11<NcclNetPropertiesV11, NcclNetVDevicePropsV9>>() == 176);
    assert!(size_of::<NcclNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>>() == 176);
    assert!(
        offset_of!(NcclNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>, make_vdevice) == 152
    );
    assert!(offset_of!(NcclNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>, finalize) == 160);
    assert!(
        offset_of!(NcclNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>, set_net_attr) == 168
    );
};
