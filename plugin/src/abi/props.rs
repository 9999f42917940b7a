//! Per-version device properties: [`DeviceProps`] translated into each ABI version's struct,
//! and the limits every version advertises.

use crate::devices::DeviceProps;
use crate::sys::*;
use core::ffi::c_int;

/// Largest message Rivet moves in one request: NCCL's `MAX_NET_SIZE` (1 GiB), which also fits the
/// `int` sizes of the v6–v8 ABIs and `test`'s `int* sizes` in every version.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// Most buffers one grouped receive may carry (`maxRecvs`).
pub const MAX_RECVS: c_int = 8;

/// A versioned `ncclNetProperties_vN_t` that can be filled from [`DeviceProps`].
pub trait VersionedProps {
    /// Build the versioned struct.
    fn from_props(p: &DeviceProps) -> Self;
}

impl VersionedProps for NcclNetPropertiesV6 {
    fn from_props(p: &DeviceProps) -> Self {
        Self {
            name: p.name.cast_mut(),
            pci_path: p.pci_path.cast_mut(),
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed_mbps,
            port: p.port,
            latency: 0.0,
            max_comms: p.max_comms,
            max_recvs: MAX_RECVS,
        }
    }
}

impl VersionedProps for NcclNetPropertiesV7 {
    fn from_props(p: &DeviceProps) -> Self {
        let v6 = NcclNetPropertiesV6::from_props(p);
        Self {
            name: v6.name,
            pci_path: v6.pci_path,
            guid: v6.guid,
            ptr_support: v6.ptr_support,
            speed: v6.speed,
            port: v6.port,
            latency: v6.latency,
            max_comms: v6.max_comms,
            max_recvs: v6.max_recvs,
            net_device_type: NCCL_NET_DEVICE_HOST,
            net_device_version: 0,
        }
    }
}

impl VersionedProps for NcclNetPropertiesV8 {
    fn from_props(p: &DeviceProps) -> Self {
        let v7 = NcclNetPropertiesV7::from_props(p);
        Self {
            name: v7.name,
            pci_path: v7.pci_path,
            guid: v7.guid,
            ptr_support: v7.ptr_support,
            // Registrations live in a per-device cache and serve every comm of that device.
            reg_is_global: p.reg_is_global,
            speed: v7.speed,
            port: v7.port,
            latency: v7.latency,
            max_comms: v7.max_comms,
            max_recvs: v7.max_recvs,
            net_device_type: v7.net_device_type,
            net_device_version: v7.net_device_version,
        }
    }
}

fn members_v9(p: &DeviceProps) -> NcclNetVDevicePropsV9 {
    let mut v = NcclNetVDevicePropsV9::default();
    let n = p.member_count.clamp(0, 4);
    v.ndevs = n;
    v.devs.copy_from_slice(&p.members[..4]);
    v
}

impl VersionedProps for NcclNetPropertiesV9 {
    fn from_props(p: &DeviceProps) -> Self {
        let v8 = NcclNetPropertiesV8::from_props(p);
        Self {
            name: v8.name,
            pci_path: v8.pci_path,
            guid: v8.guid,
            ptr_support: v8.ptr_support,
            reg_is_global: v8.reg_is_global,
            force_flush: 0,
            speed: v8.speed,
            port: v8.port,
            latency: v8.latency,
            max_comms: v8.max_comms,
            max_recvs: v8.max_recvs,
            net_device_type: v8.net_device_type,
            net_device_version: v8.net_device_version,
            v_props: members_v9(p),
            max_p2p_bytes: MAX_MESSAGE_BYTES,
            max_coll_bytes: MAX_MESSAGE_BYTES,
        }
    }
}

impl VersionedProps for NcclNetPropertiesV11 {
    fn from_props(p: &DeviceProps) -> Self {
        let v9 = NcclNetPropertiesV9::from_props(p);
        Self {
            name: v9.name,
            pci_path: v9.pci_path,
            guid: v9.guid,
            ptr_support: v9.ptr_support,
            reg_is_global: v9.reg_is_global,
            force_flush: v9.force_flush,
            speed: v9.speed,
            port: v9.port,
            latency: v9.latency,
            max_comms: v9.max_comms,
            max_recvs: v9.max_recvs,
            net_device_type: v9.net_device_type,
            net_device_version: v9.net_device_version,
            v_props: v9.v_props,
            max_p2p_bytes: v9.max_p2p_bytes,
            max_coll_bytes: v9.max_coll_bytes,
            max_multi_request_size: 1,
        }
    }
}

impl VersionedProps for NcclNetPropertiesV12 {
    fn from_props(p: &DeviceProps) -> Self {
        let v11 = NcclNetPropertiesV11::from_props(p);
        let mut v_props = NcclNetVDevicePropsV12 {
            ndevs: p.member_count.clamp(0, 8),
            devs: p.members,
        };
        if v_props.ndevs == 0 {
            v_props.devs = [0; 8];
        }
        Self {
            name: v11.name,
            pci_path: v11.pci_path,
            guid: v11.guid,
            ptr_support: v11.ptr_support,
            reg_is_global: v11.reg_is_global,
            force_flush: v11.force_flush,
            speed: v11.speed,
            port: v11.port,
            latency: v11.latency,
            max_comms: v11.max_comms,
            max_recvs: v11.max_recvs,
            net_device_type: v11.net_device_type,
            net_device_version: v11.net_device_version,
            v_props,
            max_p2p_bytes: v11.max_p2p_bytes,
            max_coll_bytes: v11.max_coll_bytes,
            max_multi_request_size: v11.max_multi_request_size,
            rail_id: p.rail_id,
            plane_id: p.plane_id,
        }
    }
}

/// A `makeVDevice` request of one ABI version: `ncclNetVDeviceProps_v9_t` (4 members) or
/// `_v12_t` (8).
pub(crate) trait VDeviceRequest {
    /// The listed member devices; `None` when `ndevs` is outside 1..=the version's maximum.
    fn members(&self) -> Option<&[c_int]>;
}

macro_rules! vdevice_request {
    ($ty:ty) => {
        impl VDeviceRequest for $ty {
            fn members(&self) -> Option<&[c_int]> {
                let n = usize::try_from(self.ndevs).ok()?;
                self.devs.get(..n).filter(|m| !m.is_empty())
            }
        }
    };
}

vdevice_request!(NcclNetVDevicePropsV9);
vdevice_request!(NcclNetVDevicePropsV12);
