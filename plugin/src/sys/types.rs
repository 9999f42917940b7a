//! C types of NCCL's net plugin ABI, v6 … v12, written by hand from the documented x86-64 layouts.
//!
//! Every struct has const asserts on its size, alignment and field offsets, so a wrong field order or
//! type fails the build. The numbers are the ones NCCL's own headers produce (see
//! `shared/reference/nccl-net-api.md` §1.1–1.3); the C loader test checks them again from C.

use core::ffi::{c_char, c_int, c_ulong, c_void};
use core::mem::{align_of, offset_of, size_of};

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclSystemError`: network or hardware failure.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`: NCCL misused the API, or a bug in the plugin.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`: user or configuration error.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`: the peer or the fabric failed.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;

/// `ncclDebugLogLevel` values the plugin uses.
pub const NCCL_LOG_WARN: c_int = 2;
/// INFO level.
pub const NCCL_LOG_INFO: c_int = 3;
/// Subsystem flag `NCCL_INIT`.
pub const NCCL_INIT: c_ulong = 0x1;
/// Subsystem flag `NCCL_NET`.
pub const NCCL_NET: c_ulong = 0x10;
/// Subsystem flag `NCCL_ALL`.
pub const NCCL_ALL: c_ulong = !0;

/// `ncclDebugLogger_t`: `void (*)(level, flags, file, line, fmt, ...)`. C-variadic.
pub type NcclDebugLogger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t` (v10+): Rivet emits IB QP events through it (`crate::profiler`).
pub type NcclProfilerCallback = Option<
    unsafe extern "C" fn(
        e_handle: *mut *mut c_void,
        kind: c_int,
        p_handle: *mut c_void,
        plugin_id: i64,
        ext_data: *mut c_void,
    ) -> NcclResult,
>;

/// `NCCL_PTR_HOST`.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const NCCL_PTR_DMABUF: c_int = 0x4;

/// `NCCL_NET_OPTIONAL_RECV_COMPLETION`: NCCL presets `*request` to this before `irecv` (v9+).
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;

/// `NCCL_NET_HANDLE_MAXSIZE`.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;

/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;

/// `NCCL_NET_ID_UNDEF`, for v12 `railId`/`planeId`.
pub const NCCL_NET_ID_UNDEF: i16 = -1;

/// `ncclNetDeviceType` `NCCL_NET_DEVICE_HOST`.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;

/// `ncclNetDeviceHandle_v7_t` … `_v12_t`. A host plugin never fills one.
#[repr(C)]
#[derive(Debug)]
pub struct NcclNetDeviceHandle {
    /// `ncclNetDeviceType netDeviceType`.
    pub net_device_type: c_int,
    /// `int netDeviceVersion`.
    pub net_device_version: c_int,
    /// `void* handle`.
    pub handle: *mut c_void,
    /// `size_t size`.
    pub size: usize,
    /// `int needsProxyProgress`.
    pub needs_proxy_progress: c_int,
}
const _: () = {
    assert!(size_of::<NcclNetDeviceHandle>() == 32);
    assert!(align_of::<NcclNetDeviceHandle>() == 8);
    assert!(offset_of!(NcclNetDeviceHandle, handle) == 8);
    assert!(offset_of!(NcclNetDeviceHandle, size) == 16);
    assert!(offset_of!(NcclNetDeviceHandle, needs_proxy_progress) == 24);
};

/// `ncclNetVDeviceProps_v9_t` … `_v11_t`: up to 4 member devices.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcclNetVDevicePropsV9 {
    /// Number of member devices.
    pub ndevs: c_int,
    /// Member device indices.
    pub devs: [c_int; 4],
}
const _: () = {
    assert!(size_of::<NcclNetVDevicePropsV9>() == 20);
    assert!(align_of::<NcclNetVDevicePropsV9>() == 4);
    assert!(offset_of!(NcclNetVDevicePropsV9, devs) == 4);
};

/// `ncclNetVDeviceProps_v12_t`: up to 8 member devices.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcclNetVDevicePropsV12 {
    /// Number of member devices.
    pub ndevs: c_int,
    /// Member device indices.
    pub devs: [c_int; 8],
}
const _: () = {
    assert!(size_of::<NcclNetVDevicePropsV12>() == 36);
    assert!(align_of::<NcclNetVDevicePropsV12>() == 4);
    assert!(offset_of!(NcclNetVDevicePropsV12, devs) == 4);
};

/// `ncclNetCommConfig_v10_t` … `_v12_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetCommConfig {
    /// `int trafficClass`; [`NCCL_NET_TRAFFIC_CLASS_UNDEF`] when unset.
    pub traffic_class: c_int,
}
const _: () = assert!(size_of::<NcclNetCommConfig>() == 4);

/// `ncclNetCommAttr` inside [`NcclNetAttr`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetCommAttr {
    /// `maxConcurrentPeers`.
    pub max_concurrent_peers: i32,
    /// `minConcurrentPeers`.
    pub min_concurrent_peers: i32,
    /// `maxFlowsPerPeer`.
    pub max_flows_per_peer: i32,
    /// `minFlowsPerPeer`.
    pub min_flows_per_peer: i32,
}

/// `ncclNetAttr_v11_t` / `_v12_t`: hints passed to `setNetAttr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetAttr {
    /// Hints for send comms.
    pub send_comm_attr: NcclNetCommAttr,
    /// Hints for receive comms.
    pub recv_comm_attr: NcclNetCommAttr,
    /// Bitmask of collective operations.
    pub op: u32,
    /// Algorithm.
    pub algo: u32,
    /// Protocol.
    pub proto: u32,
}
const _: () = {
    assert!(size_of::<NcclNetAttr>() == 44);
    assert!(offset_of!(NcclNetAttr, recv_comm_attr) == 16);
    assert!(offset_of!(NcclNetAttr, op) == 32);
    assert!(offset_of!(NcclNetAttr, algo) == 36);
    assert!(offset_of!(NcclNetAttr, proto) == 40);
};

/// `ncclNetProperties_v6_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV6 {
    /// Device name (static storage owned by the plugin).
    pub name: *mut c_char,
    /// PCI path (static storage owned by the plugin).
    pub pci_path: *mut c_char,
    /// Unique identifier of the NIC chip.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Port speed in Mb/s.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// Latency in µs.
    pub latency: f32,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// Maximum number of grouped receives.
    pub max_recvs: c_int,
}
const _: () = {
    assert!(size_of::<NcclNetPropertiesV6>() == 48);
    assert!(align_of::<NcclNetPropertiesV6>() == 8);
    assert!(offset_of!(NcclNetPropertiesV6, pci_path) == 8);
    assert!(offset_of!(NcclNetPropertiesV6, guid) == 16);
    assert!(offset_of!(NcclNetPropertiesV6, ptr_support) == 24);
    assert!(offset_of!(NcclNetPropertiesV6, speed) == 28);
    assert!(offset_of!(NcclNetPropertiesV6, port) == 32);
    assert!(offset_of!(NcclNetPropertiesV6, latency) == 36);
    assert!(offset_of!(NcclNetPropertiesV6, max_comms) == 40);
    assert!(offset_of!(NcclNetPropertiesV6, max_recvs) == 44);
};

/// `ncclNetProperties_v7_t`: v6 plus the device-offload type and version.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV7 {
    /// See [`NcclNetPropertiesV6::name`].
    pub name: *mut c_char,
    /// PCI path.
    pub pci_path: *mut c_char,
    /// NIC guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Mb/s.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// µs.
    pub latency: f32,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// Maximum grouped receives.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
}
const _: () = {
    assert!(size_of::<NcclNetPropertiesV7>() == 56);
    assert!(offset_of!(NcclNetPropertiesV7, max_recvs) == 44);
    assert!(offset_of!(NcclNetPropertiesV7, net_device_type) == 48);
    assert!(offset_of!(NcclNetPropertiesV7, net_device_version) == 52);
};

/// `ncclNetProperties_v8_t`: v7 with `regIsGlobal` after `ptrSupport`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV8 {
    /// Device name.
    pub name: *mut c_char,
    /// PCI path.
    pub pci_path: *mut c_char,
    /// NIC guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Whether a registration is valid for every comm of the device.
    pub reg_is_global: c_int,
    /// Mb/s.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// µs.
    pub latency: f32,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// Maximum grouped receives.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
}
const _: () = {
    assert!(size_of::<NcclNetPropertiesV8>() == 64);
    assert!(offset_of!(NcclNetPropertiesV8, reg_is_global) == 28);
    assert!(offset_of!(NcclNetPropertiesV8, speed) == 32);
    assert!(offset_of!(NcclNetPropertiesV8, port) == 36);
    assert!(offset_of!(NcclNetPropertiesV8, latency) == 40);
    assert!(offset_of!(NcclNetPropertiesV8, max_comms) == 44);
    assert!(offset_of!(NcclNetPropertiesV8, max_recvs) == 48);
    assert!(offset_of!(NcclNetPropertiesV8, net_device_type) == 52);
    assert!(offset_of!(NcclNetPropertiesV8, net_device_version) == 56);
};

/// `ncclNetProperties_v9_t` and `_v10_t` (identical).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV9 {
    /// Device name.
    pub name: *mut c_char,
    /// PCI path.
    pub pci_path: *mut c_char,
    /// NIC guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Registration valid for every comm.
    pub reg_is_global: c_int,
    /// Whether NCCL must always flush GPU receives.
    pub force_flush: c_int,
    /// Mb/s.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// µs.
    pub latency: f32,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// Maximum grouped receives.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// Physical members of this (virtual) device.
    pub v_props: NcclNetVDevicePropsV9,
    /// Largest point-to-point message.
    pub max_p2p_bytes: usize,
    /// Largest collective message.
    pub max_coll_bytes: usize,
}
const _: () = {
    assert!(size_of::<NcclNetPropertiesV9>() == 104);
    assert!(offset_of!(NcclNetPropertiesV9, force_flush) == 32);
    assert!(offset_of!(NcclNetPropertiesV9, speed) == 36);
    assert!(offset_of!(NcclNetPropertiesV9, max_recvs) == 52);
    assert!(offset_of!(NcclNetPropertiesV9, net_device_version) == 60);
    assert!(offset_of!(NcclNetPropertiesV9, v_props) == 64);
    assert!(offset_of!(NcclNetPropertiesV9, max_p2p_bytes) == 88);
    assert!(offset_of!(NcclNetPropertiesV9, max_coll_bytes) == 96);
};

/// `ncclNetProperties_v11_t`: v10 plus `maxMultiRequestSize`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV11 {
    /// Device name.
    pub name: *mut c_char,
    /// PCI path.
    pub pci_path: *mut c_char,
    /// NIC guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Registration valid for every comm.
    pub reg_is_global: c_int,
    /// Force GPU flushes.
    pub force_flush: c_int,
    /// Mb/s.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// µs.
    pub latency: f32,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// Maximum grouped receives.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// Physical members.
    pub v_props: NcclNetVDevicePropsV9,
    /// Largest point-to-point message.
    pub max_p2p_bytes: usize,
    /// Largest collective message.
    pub max_coll_bytes: usize,
    /// Requests NCCL may merge into one (`NCCL_NET_MULTI_REQUEST`).
    pub max_multi_request_size: c_int,
}
const _: () = {
    assert!(size_of::<NcclNetPropertiesV11>() == 112);
    assert!(offset_of!(NcclNetPropertiesV11, v_props) == 64);
    assert!(offset_of!(NcclNetPropertiesV11, max_p2p_bytes) == 88);
    assert!(offset_of!(NcclNetPropertiesV11, max_coll_bytes) == 96);
    assert!(offset_of!(NcclNetPropertiesV11, max_multi_request_size) == 104);
};

/// `ncclNetProperties_v12_t`: 8-member vProps, rail and plane ids.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV12 {
    /// Device name.
    pub name: *mut c_char,
    /// PCI path.
    pub pci_path: *mut c_char,
    /// NIC guid.
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: c_int,
    /// Registration valid for every comm.
    pub reg_is_global: c_int,
    /// Force GPU flushes.
    pub force_flush: c_int,
    /// Mb/s.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// µs.
    pub latency: f32,
    /// Maximum number of comms.
    pub max_comms: c_int,
    /// Maximum grouped receives.
    pub max_recvs: c_int,
    /// `ncclNetDeviceType`.
    pub net_device_type: c_int,
    /// `netDeviceVersion`.
    pub net_device_version: c_int,
    /// Physical members.
    pub v_props: NcclNetVDevicePropsV12,
    /// Largest point-to-point message.
    pub max_p2p_bytes: usize,
    /// Largest collective message.
    pub max_coll_bytes: usize,
    /// Requests NCCL may merge into one.
    pub max_multi_request_size: c_int,
    /// Rail id, or [`NCCL_NET_ID_UNDEF`].
    pub rail_id: i16,
    /// Plane id, or [`NCCL_NET_ID_UNDEF`].
    pub plane_id: i16,
}
const _: () = {
    assert!(size_of::<NcclNetPropertiesV12>() == 128);
    assert!(align_of::<NcclNetPropertiesV12>() == 8);
    assert!(offset_of!(NcclNetPropertiesV12, v_props) == 64);
    assert!(offset_of!(NcclNetPropertiesV12, max_p2p_bytes) == 104);
    assert!(offset_of!(NcclNetPropertiesV12, max_coll_bytes) == 112);
    assert!(offset_of!(NcclNetPropertiesV12, max_multi_request_size) == 120);
    assert!(offset_of!(NcclNetPropertiesV12, rail_id) == 124);
    assert!(offset_of!(NcclNetPropertiesV12, plane_id) == 126);
};
