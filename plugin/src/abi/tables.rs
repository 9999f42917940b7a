//! The exported function tables `ncclNetPlugin_v6` … `ncclNetPlugin_v12`: one static per
//! version, each naming the per-version shims it points at. Their C layouts are in
//! [`crate::sys::tables`]. The seven statics are written out, not generated: each reads as the C
//! table it fills, field by field, which is what a reviewer compares against NCCL's headers.
//!
//! Unsafe: `#[no_mangle]` statics are the ABI NCCL looks up with `dlsym`, and the tables hold raw
//! pointers, so they need a manual `Sync` (they are immutable and point at `'static` data).

#![allow(unsafe_code)]

use super::shims as s;
use crate::sys::*;

/// An exported table: immutable, pointing only at `'static` code and strings.
#[repr(transparent)]
#[derive(Debug)]
pub struct Exported<T>(pub T);

// SAFETY: every exported table is a constant holding function pointers and a pointer to a static
// C string; nothing in it is ever written, so sharing it between threads is sound.
unsafe impl<T> Sync for Exported<T> {}

/// The name NCCL matches `NCCL_NET` against (case-insensitively).
pub const PLUGIN_NAME: &core::ffi::CStr = c"Rivet";

/// `ncclNetPlugin_v6`, for NCCL 2.13 – 2.18.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v6: Exported<NcclNetV6> = Exported(NcclNetV6 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(s::init_v6),
    devices: Some(s::devices),
    get_properties: Some(s::get_properties::<NcclNetPropertiesV6>),
    listen: Some(s::listen_v6),
    connect: Some(s::connect_v6),
    accept: Some(s::accept_v6),
    reg_mr: Some(s::reg_mr_int),
    reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
    dereg_mr: Some(s::dereg_mr),
    isend: Some(s::isend_int),
    irecv: Some(s::irecv_int),
    iflush: Some(s::iflush),
    test: Some(s::test),
    close_send: Some(s::close_send),
    close_recv: Some(s::close_recv),
    close_listen: Some(s::close_listen),
});

/// `ncclNetPlugin_v7`, for NCCL 2.19.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v7: Exported<NcclNetV7<NcclNetPropertiesV7, RegMrIntFn>> =
    Exported(NcclNetV7 {
        name: PLUGIN_NAME.as_ptr(),
        init: Some(s::init_v6),
        devices: Some(s::devices),
        get_properties: Some(s::get_properties::<NcclNetPropertiesV7>),
        listen: Some(s::listen_v6),
        connect: Some(s::connect_v7),
        accept: Some(s::accept_v7),
        reg_mr: Some(s::reg_mr_int),
        reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
        dereg_mr: Some(s::dereg_mr),
        isend: Some(s::isend_int),
        irecv: Some(s::irecv_int),
        iflush: Some(s::iflush),
        test: Some(s::test),
        close_send: Some(s::close_send),
        close_recv: Some(s::close_recv),
        close_listen: Some(s::close_listen),
        get_device_mr: None,
        irecv_consumed: None,
    });

/// `ncclNetPlugin_v8`, for NCCL 2.20 – 2.23.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: Exported<NcclNetV7<NcclNetPropertiesV8, RegMrFn>> =
    Exported(NcclNetV7 {
        name: PLUGIN_NAME.as_ptr(),
        init: Some(s::init_v6),
        devices: Some(s::devices),
        get_properties: Some(s::get_properties::<NcclNetPropertiesV8>),
        listen: Some(s::listen_v6),
        connect: Some(s::connect_v7),
        accept: Some(s::accept_v7),
        reg_mr: Some(s::reg_mr),
        reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
        dereg_mr: Some(s::dereg_mr),
        isend: Some(s::isend_int),
        irecv: Some(s::irecv_int),
        iflush: Some(s::iflush),
        test: Some(s::test),
        close_send: Some(s::close_send),
        close_recv: Some(s::close_recv),
        close_listen: Some(s::close_listen),
        get_device_mr: None,
        irecv_consumed: None,
    });

/// `ncclNetPlugin_v9`, for NCCL 2.24 – 2.25.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v9: Exported<NcclNetV9> = Exported(NcclNetV9 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(s::init_v6),
    devices: Some(s::devices),
    get_properties: Some(s::get_properties::<NcclNetPropertiesV9>),
    listen: Some(s::listen_v6),
    connect: Some(s::connect_v7),
    accept: Some(s::accept_v7),
    reg_mr: Some(s::reg_mr),
    reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
    dereg_mr: Some(s::dereg_mr),
    isend: Some(s::isend_v9),
    irecv: Some(s::irecv_v9),
    iflush: Some(s::iflush),
    test: Some(s::test),
    close_send: Some(s::close_send),
    close_recv: Some(s::close_recv),
    close_listen: Some(s::close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    // NIC fusion (`net::make_vdevice`): NCCL 2.24+ then runs every connection on the devices
    // it makes, one-port ones included.
    make_vdevice: Some(s::make_vdevice::<NcclNetVDevicePropsV9>),
});

/// `ncclNetPlugin_v10`, for NCCL 2.26 – 2.27.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v10: Exported<NcclNetV10> = Exported(NcclNetV10 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(s::init_v10),
    devices: Some(s::devices),
    get_properties: Some(s::get_properties::<NcclNetPropertiesV9>),
    listen: Some(s::listen_v6),
    connect: Some(s::connect_v10),
    accept: Some(s::accept_v7),
    reg_mr: Some(s::reg_mr),
    reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
    dereg_mr: Some(s::dereg_mr),
    isend: Some(s::isend_v10),
    irecv: Some(s::irecv_v10),
    iflush: Some(s::iflush),
    test: Some(s::test),
    close_send: Some(s::close_send),
    close_recv: Some(s::close_recv),
    close_listen: Some(s::close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    // NIC fusion (`net::make_vdevice`): NCCL 2.24+ then runs every connection on the devices
    // it makes, one-port ones included.
    make_vdevice: Some(s::make_vdevice::<NcclNetVDevicePropsV9>),
});

/// `ncclNetPlugin_v11`, for NCCL 2.28 – 2.29.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v11: Exported<NcclNetV11<NcclNetPropertiesV11, NcclNetVDevicePropsV9>> =
    Exported(NcclNetV11 {
        name: PLUGIN_NAME.as_ptr(),
        init: Some(s::init_v11),
        devices: Some(s::devices),
        get_properties: Some(s::get_properties::<NcclNetPropertiesV11>),
        listen: Some(s::listen_v11),
        connect: Some(s::connect_v11),
        accept: Some(s::accept_v7),
        reg_mr: Some(s::reg_mr),
        reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
        dereg_mr: Some(s::dereg_mr),
        isend: Some(s::isend_v10),
        irecv: Some(s::irecv_v10),
        iflush: Some(s::iflush),
        test: Some(s::test),
        close_send: Some(s::close_send),
        close_recv: Some(s::close_recv),
        close_listen: Some(s::close_listen),
        get_device_mr: None,
        irecv_consumed: None,
        // NIC fusion, as in v9 and v10.
        make_vdevice: Some(s::make_vdevice::<NcclNetVDevicePropsV9>),
        finalize: Some(s::finalize),
        set_net_attr: Some(s::set_net_attr),
    });

/// `ncclNetPlugin_v12`, for NCCL 2.30.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: Exported<NcclNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>> =
    Exported(NcclNetV11 {
        name: PLUGIN_NAME.as_ptr(),
        init: Some(s::init_v11),
        devices: Some(s::devices),
        get_properties: Some(s::get_properties::<NcclNetPropertiesV12>),
        listen: Some(s::listen_v11),
        connect: Some(s::connect_v11),
        accept: Some(s::accept_v7),
        reg_mr: Some(s::reg_mr),
        reg_mr_dma_buf: Some(s::reg_mr_dma_buf),
        dereg_mr: Some(s::dereg_mr),
        isend: Some(s::isend_v10),
        irecv: Some(s::irecv_v10),
        iflush: Some(s::iflush),
        test: Some(s::test),
        close_send: Some(s::close_send),
        close_recv: Some(s::close_recv),
        close_listen: Some(s::close_listen),
        get_device_mr: None,
        irecv_consumed: None,
        // NIC fusion, as in v9 and v10; the v12 request lists up to 8 ports.
        make_vdevice: Some(s::make_vdevice::<NcclNetVDevicePropsV12>),
        finalize: Some(s::finalize),
        set_net_attr: Some(s::set_net_attr),
    });
