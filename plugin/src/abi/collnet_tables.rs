//! The exported CollNet tables `ncclCollNetPlugin_v6` … `ncclCollNetPlugin_v12`: one static per
//! version, written out field by field like the C table it fills (layouts in
//! [`crate::sys::collnet`]). `init`, `devices` and `finalize` are the net table's, so both
//! tables report the same devices; `getProperties` is the net table's with host memory only
//! (the reductions run on the host CPU). `makeVDevice` is
//! NULL, as in the net table: NCCL then uses the physical devices.
//!
//! Unsafe: `#[no_mangle]` statics are the ABI NCCL looks up with `dlsym`.

#![allow(unsafe_code)]

use super::collnet_shims as c;
use super::shims as s;
use super::tables::{Exported, PLUGIN_NAME};
use crate::sys::*;

/// `ncclCollNetPlugin_v6`, for NCCL 2.13 – 2.18.
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v6: Exported<NcclCollNetV6<NcclNetPropertiesV6>> =
    Exported(NcclCollNetV6 {
        name: PLUGIN_NAME.as_ptr(),
        init: Some(c::init_v6),
        devices: Some(s::devices),
        get_properties: Some(c::get_properties::<NcclNetPropertiesV6>),
        listen: Some(c::listen_v6),
        connect: Some(c::connect),
        reduce_support: Some(c::reduce_support_v6),
        reg_mr: Some(c::reg_mr_int),
        reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
        dereg_mr: Some(c::dereg_mr),
        iallreduce: Some(c::iallreduce_int),
        iflush: Some(c::iflush),
        test: Some(c::test),
        close_coll: Some(c::close_coll),
        close_listen: Some(c::close_listen),
    });

/// `ncclCollNetPlugin_v7`, for NCCL 2.19.
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v7: Exported<NcclCollNetV6<NcclNetPropertiesV7>> =
    Exported(NcclCollNetV6 {
        name: PLUGIN_NAME.as_ptr(),
        init: Some(c::init_v6),
        devices: Some(s::devices),
        get_properties: Some(c::get_properties::<NcclNetPropertiesV7>),
        listen: Some(c::listen_v6),
        connect: Some(c::connect),
        reduce_support: Some(c::reduce_support_v6),
        reg_mr: Some(c::reg_mr_int),
        reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
        dereg_mr: Some(c::dereg_mr),
        iallreduce: Some(c::iallreduce_int),
        iflush: Some(c::iflush),
        test: Some(c::test),
        close_coll: Some(c::close_coll),
        close_listen: Some(c::close_listen),
    });

/// `ncclCollNetPlugin_v8`, for NCCL 2.20 – 2.23.
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v8: Exported<NcclCollNetV8> = Exported(NcclCollNetV8 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_v6),
    devices: Some(s::devices),
    get_properties: Some(c::get_properties::<NcclNetPropertiesV8>),
    listen: Some(c::listen_v6),
    connect: Some(c::connect),
    reduce_support: Some(c::reduce_support_v6),
    reg_mr: Some(c::reg_mr),
    reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
    dereg_mr: Some(c::dereg_mr),
    iallreduce: Some(c::iallreduce_int),
    iallgather: Some(c::iallgather::<NcclNetSgeV8>),
    ireducescatter: Some(c::ireducescatter::<NcclNetSgeV8>),
    iflush: Some(c::iflush),
    test: Some(c::test),
    close_coll: Some(c::close_coll),
    close_listen: Some(c::close_listen),
});

/// `ncclCollNetPlugin_v9`, for NCCL 2.24 – 2.25.
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v9: Exported<NcclCollNetV9> = Exported(NcclCollNetV9 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_v6),
    devices: Some(s::devices),
    get_properties: Some(c::get_properties::<NcclNetPropertiesV9>),
    listen: Some(c::listen_v6),
    connect: Some(c::connect),
    reduce_support: Some(c::reduce_support_v9),
    reg_mr: Some(c::reg_mr),
    reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
    dereg_mr: Some(c::dereg_mr),
    iallreduce: Some(c::iallreduce),
    iallgather: Some(c::iallgather::<NcclNetSgeV9>),
    ireducescatter: Some(c::ireducescatter::<NcclNetSgeV9>),
    iflush: Some(c::iflush),
    test: Some(c::test),
    close_coll: Some(c::close_coll),
    close_listen: Some(c::close_listen),
    // NULL as in the net table: NCCL uses the physical devices.
    make_vdevice: None,
});

/// `ncclCollNetPlugin_v10`, for NCCL 2.26 – 2.27 (the v9 layout; v10 properties are v9's).
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v10: Exported<NcclCollNetV9> = Exported(NcclCollNetV9 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_v6),
    devices: Some(s::devices),
    get_properties: Some(c::get_properties::<NcclNetPropertiesV9>),
    listen: Some(c::listen_v6),
    connect: Some(c::connect),
    reduce_support: Some(c::reduce_support_v9),
    reg_mr: Some(c::reg_mr),
    reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
    dereg_mr: Some(c::dereg_mr),
    iallreduce: Some(c::iallreduce),
    iallgather: Some(c::iallgather::<NcclNetSgeV9>),
    ireducescatter: Some(c::ireducescatter::<NcclNetSgeV9>),
    iflush: Some(c::iflush),
    test: Some(c::test),
    close_coll: Some(c::close_coll),
    close_listen: Some(c::close_listen),
    make_vdevice: None,
});

/// `ncclCollNetPlugin_v11`, for NCCL 2.28 – 2.29.
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v11: Exported<
    NcclCollNetV11<NcclNetPropertiesV11, NcclNetVDevicePropsV9>,
> = Exported(NcclCollNetV11 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_v11),
    devices: Some(s::devices),
    get_properties: Some(c::get_properties::<NcclNetPropertiesV11>),
    listen: Some(c::listen_v11),
    connect: Some(c::connect),
    reduce_support: Some(c::reduce_support_v9),
    reg_mr: Some(c::reg_mr),
    reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
    dereg_mr: Some(c::dereg_mr),
    iallreduce: Some(c::iallreduce),
    iallgather: Some(c::iallgather::<NcclNetSgeV9>),
    ireducescatter: Some(c::ireducescatter::<NcclNetSgeV9>),
    iflush: Some(c::iflush),
    test: Some(c::test),
    close_coll: Some(c::close_coll),
    close_listen: Some(c::close_listen),
    make_vdevice: None,
    finalize: Some(s::finalize),
});

/// `ncclCollNetPlugin_v12`, for NCCL 2.30.
#[unsafe(no_mangle)]
pub static ncclCollNetPlugin_v12: Exported<
    NcclCollNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>,
> = Exported(NcclCollNetV11 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_v11),
    devices: Some(s::devices),
    get_properties: Some(c::get_properties::<NcclNetPropertiesV12>),
    listen: Some(c::listen_v11),
    connect: Some(c::connect),
    reduce_support: Some(c::reduce_support_v9),
    reg_mr: Some(c::reg_mr),
    reg_mr_dma_buf: Some(c::reg_mr_dma_buf),
    dereg_mr: Some(c::dereg_mr),
    iallreduce: Some(c::iallreduce),
    iallgather: Some(c::iallgather::<NcclNetSgeV9>),
    ireducescatter: Some(c::ireducescatter::<NcclNetSgeV9>),
    iflush: Some(c::iflush),
    test: Some(c::test),
    close_coll: Some(c::close_coll),
    close_listen: Some(c::close_listen),
    make_vdevice: None,
    finalize: Some(s::finalize),
});
