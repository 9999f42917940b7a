//! The exported RMA tables `ncclRmaPlugin_v13` … `ncclRmaPlugin_v16`: one static per version,
//! written out field by field like the C table it fills (layouts in [`crate::sys::rma`]).
//! `devices` is the net table's, so all tables report the same devices; `getProperties` reports
//! them as GIN proxy devices. NCCL 2.30.7 loads v14, then v13; RCCL and NCCL's development tree
//! load v16 down to v13.
//!
//! Unsafe: `#[no_mangle]` statics are the ABI NCCL looks up with `dlsym`.

#![allow(unsafe_code)]

use super::rma_shims as r;
use super::shims as s;
use super::tables::{Exported, PLUGIN_NAME};
use crate::sys::*;

/// `ncclRmaPlugin_v13`, the GIN v13 layout (NCCL 2.30.7 loads it after v14).
#[unsafe(no_mangle)]
pub static ncclRmaPlugin_v13: Exported<NcclRmaV13> = Exported(NcclRmaV13 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(r::init),
    devices: Some(s::devices),
    get_properties: Some(r::get_properties),
    listen: Some(r::listen),
    connect: Some(r::connect),
    create_context: Some(r::create_context_v13),
    reg_mr_sym: Some(r::reg_mr_sym_v13),
    reg_mr_sym_dma_buf: Some(r::reg_mr_sym_dma_buf_v13),
    dereg_mr_sym: Some(r::dereg_mr_sym),
    destroy_context: Some(r::destroy_context),
    close_coll: Some(r::close_coll),
    close_listen: Some(r::close_listen),
    iput: Some(r::iput),
    iput_signal: Some(r::iput_signal_v13),
    iget: Some(r::iget),
    iflush: Some(r::iflush),
    test: Some(r::test),
    progress: Some(r::progress),
    query_last_error: Some(r::query_last_error),
    finalize: Some(r::finalize),
});

/// `ncclRmaPlugin_v14` (NCCL 2.30.7's first choice).
#[unsafe(no_mangle)]
pub static ncclRmaPlugin_v14: Exported<NcclRmaV14> = Exported(NcclRmaV14 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(r::init),
    devices: Some(s::devices),
    get_properties: Some(r::get_properties),
    listen: Some(r::listen),
    connect: Some(r::connect),
    create_context: Some(r::create_context),
    reg_mr_sym: Some(r::reg_mr_sym),
    reg_mr_sym_dma_buf: Some(r::reg_mr_sym_dma_buf),
    dereg_mr_sym: Some(r::dereg_mr_sym),
    destroy_context: Some(r::destroy_context),
    close_coll: Some(r::close_coll),
    close_listen: Some(r::close_listen),
    iput: Some(r::iput),
    iput_signal: Some(r::iput_signal),
    iget: Some(r::iget),
    iflush: Some(r::iflush),
    test: Some(r::test),
    progress: Some(r::progress),
    query_last_error: Some(r::query_last_error),
    finalize: Some(r::finalize),
});

/// `ncclRmaPlugin_v15`: `optFlags` on the operations.
#[unsafe(no_mangle)]
pub static ncclRmaPlugin_v15: Exported<NcclRmaV15> = Exported(NcclRmaV15 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(r::init),
    devices: Some(s::devices),
    get_properties: Some(r::get_properties),
    listen: Some(r::listen),
    connect: Some(r::connect),
    create_context: Some(r::create_context),
    reg_mr_sym: Some(r::reg_mr_sym),
    reg_mr_sym_dma_buf: Some(r::reg_mr_sym_dma_buf),
    dereg_mr_sym: Some(r::dereg_mr_sym),
    destroy_context: Some(r::destroy_context),
    close_coll: Some(r::close_coll),
    close_listen: Some(r::close_listen),
    iput: Some(r::iput_opt),
    iput_signal: Some(r::iput_signal_opt),
    iget: Some(r::iget_opt),
    iflush: Some(r::iflush),
    test: Some(r::test),
    progress: Some(r::progress),
    query_last_error: Some(r::query_last_error),
    finalize: Some(r::finalize),
});

/// `ncclRmaPlugin_v16`: `getRmaProperties`.
#[unsafe(no_mangle)]
pub static ncclRmaPlugin_v16: Exported<NcclRmaV16> = Exported(NcclRmaV16 {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(r::init),
    devices: Some(s::devices),
    get_rma_properties: Some(r::get_rma_properties),
    get_properties: Some(r::get_properties),
    listen: Some(r::listen),
    connect: Some(r::connect),
    create_context: Some(r::create_context),
    reg_mr_sym: Some(r::reg_mr_sym),
    reg_mr_sym_dma_buf: Some(r::reg_mr_sym_dma_buf),
    dereg_mr_sym: Some(r::dereg_mr_sym),
    destroy_context: Some(r::destroy_context),
    close_coll: Some(r::close_coll),
    close_listen: Some(r::close_listen),
    iput: Some(r::iput_opt),
    iput_signal: Some(r::iput_signal_opt),
    iget: Some(r::iget_opt),
    iflush: Some(r::iflush),
    test: Some(r::test),
    progress: Some(r::progress),
    query_last_error: Some(r::query_last_error),
    finalize: Some(r::finalize),
});
