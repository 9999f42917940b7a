//! [`Mlx5Endpoint`]: one connection's RC queue pair on the mlx5 direct data path, with the same
//! API as the libibverbs [`Endpoint`](crate::backend::endpoint::Endpoint): `new` (an error on
//! anything but an mlx5 device, or when any setup step fails, so the caller falls back to
//! verbs), `local_info`, `connect`, `qp_num`, `port`, and [`Nic`].
//!
//! The unit tests build the same endpoint on the software mlx5 model (`super::pair`'s
//! `OnModel` attachment).
//!
//! Unsafe: taking the queues over from libmlx5 (`mlx5dv_init_obj`) hands their raw memory to the
//! direct path, which must outlive neither the QP nor the CQ.

#![allow(unsafe_code)]

use std::sync::Arc;

use rivet_core::nic::{Completion, Nic, NicError, SendWr};
use rivet_core::wire::EndpointInfo;
use rivet_verbs_ffi::mlx5::setup::{DirectQueuePair, device_supported};
use rivet_verbs_ffi::mlx5::{BlueFlame, DirectQp, DoorbellRegister};
use rivet_verbs_ffi::sys::access;
use rivet_verbs_ffi::{CompletionQueue, QpCaps, RcTransitions, VerbsError};

use super::nic::{ControlRegions, DirectNic};
use crate::backend::device::OpenPort;
use crate::backend::endpoint::Role;
use crate::backend::endpoint::region::Region;
use crate::backend::port_device::{PortDevice, VerbsDevice};
use crate::backend::qp_params;
use crate::config::QpSettings;

/// Inline sizes tried when creating the QP, largest first. 220 is the most an RDMA WRITE WQE
/// carries inline in one 256-byte BlueFlame burst (reference §2.11).
const INLINE_CHOICES: [u32; 3] = [220, 64, 0];
/// Largest inline payload used, whatever the provider grants.
const MAX_INLINE: usize = 220;

/// What keeps an endpoint's queues alive, and which doorbell and regions it uses.
pub(crate) trait Attachment {
    /// The doorbell register.
    type Doorbell: DoorbellRegister;
    /// The control regions.
    type Regions: ControlRegions;
}

/// A real mlx5 device (a port of device `D`): the verbs objects behind the direct path.
#[derive(Debug)]
pub(crate) struct Device<D: PortDevice = VerbsDevice> {
    // Field order is drop order: the QP goes before its CQ.
    qp: DirectQueuePair,
    cq: Arc<CompletionQueue>,
    port: Arc<OpenPort<D>>,
    psn: u32,
}

impl<D: PortDevice> Attachment for Device<D> {
    type Doorbell = BlueFlame;
    type Regions = HostRegions;
}

/// Registered host memory regions.
#[derive(Debug)]
pub(crate) struct HostRegions {
    inbound: Region,
    staging: Region,
}

impl ControlRegions for HostRegions {
    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        self.inbound.read_volatile(offset, out);
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) -> bool {
        self.staging.write(offset, bytes)
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        self.inbound.deliver(offset, len, dst);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) -> bool {
        self.inbound.write(offset, bytes)
    }

    fn staging(&self) -> (u64, u32, usize) {
        (self.staging.addr(), self.staging.lkey(), self.staging.len())
    }
}

/// A connection's queue pair, CQ and control regions on the mlx5 direct path.
#[derive(Debug)]
pub(crate) struct Mlx5Endpoint<A: Attachment = Device> {
    // Field order is drop order: the device QP is destroyed before the regions it may address
    // are deregistered (the direct path itself owns no resources).
    pub(super) attachment: A,
    pub(super) nic: DirectNic<A::Doorbell, A::Regions>,
}

impl<D: PortDevice> Mlx5Endpoint<Device<D>> {
    /// Create the queue pair (at INIT) on the direct path, and register the control regions for
    /// `role`. Fails with [`VerbsError::Unsupported`] on a device libmlx5 does not drive, and with
    /// the failing call's error on any other setup problem.
    pub(crate) fn new(port: &Arc<OpenPort<D>>, role: Role) -> Result<Self, VerbsError> {
        use rivet_core::data::{CQ_DEPTH, SEND_QUEUE_DEPTH};
        let verbs = port.device.verbs();
        if !device_supported(&verbs.context)? {
            return Err(VerbsError::Unsupported {
                what: "mlx5 direct path (not an mlx5 device)",
            });
        }
        let (inbound_len, staging_len, recv_depth) = role.regions();
        let regions = HostRegions {
            inbound: Region::new(
                &verbs.pd,
                inbound_len,
                access::LOCAL_WRITE | access::REMOTE_WRITE,
            )?,
            staging: Region::new(&verbs.pd, staging_len, access::LOCAL_WRITE)?,
        };
        let cq = CompletionQueue::new(&verbs.context, CQ_DEPTH as u32)?;
        let mut last_err = None;
        let mut created = None;
        for inline in INLINE_CHOICES {
            let caps = QpCaps {
                max_send_wr: SEND_QUEUE_DEPTH as u32,
                max_recv_wr: recv_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            };
            match DirectQueuePair::new(&verbs.pd, &cq, caps) {
                Ok(qp) => {
                    created = Some(qp);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let qp = created.ok_or(last_err.unwrap_or(VerbsError::InvalidArgument {
            what: "no QP configuration accepted",
        }))?;
        qp.modify_to_init(
            port.info.port,
            0,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )?;
        // SAFETY: the QP and CQ were just created and nothing was posted on them; the DirectQp
        // built below is the only one and is dropped with `self`, whose `attachment` keeps both
        // alive (and no verbs post/poll is ever made on them again).
        let (layout, bf) = unsafe { qp.take_over() }?;
        let max_inline = (qp.caps().max_inline_data as usize).min(MAX_INLINE);
        // SAFETY: as above; the layout is what mlx5dv_init_obj reported for these live objects.
        let direct = unsafe { DirectQp::new(layout, bf, max_inline) }.map_err(|_| {
            VerbsError::InvalidArgument {
                what: "mlx5 queue layout unusable by the direct path",
            }
        })?;
        Ok(Self {
            attachment: Device {
                qp,
                cq,
                port: Arc::clone(port),
                psn: qp_params::random_psn(),
            },
            nic: DirectNic {
                qp: direct,
                regions,
            },
        })
    }

    /// What the peer needs to reach this endpoint.
    pub(crate) fn local_info(&self, settings: &QpSettings) -> EndpointInfo {
        qp_params::endpoint_info(
            &self.attachment.port.info,
            self.qp_num(),
            self.attachment.psn,
            &self.nic.regions.inbound,
            settings,
        )
    }

    /// Move the queue pair to RTR and RTS towards `remote` (verbs calls; the data path never
    /// makes one).
    pub(crate) fn connect(
        &self,
        remote: &EndpointInfo,
        settings: &QpSettings,
    ) -> Result<(), VerbsError> {
        self.attachment.qp.modify_to_rtr(&qp_params::rtr(
            &self.attachment.port.info,
            remote,
            settings,
        ))?;
        self.attachment
            .qp
            .modify_to_rts(&qp_params::rts(settings, self.attachment.psn))
    }

    /// The port this endpoint lives on.
    pub(crate) fn port(&self) -> &Arc<OpenPort<D>> {
        &self.attachment.port
    }

    /// The QP number (for log lines).
    pub(crate) fn qp_num(&self) -> u32 {
        self.attachment.qp.qp_num()
    }

    /// The CQ's address, as `CQ_ERR` events name it.
    pub(crate) fn cq_addr(&self) -> usize {
        self.attachment.cq.as_ptr() as usize
    }
}

impl<A: Attachment> Nic for Mlx5Endpoint<A> {
    fn max_inline(&self) -> usize {
        self.nic.max_inline()
    }

    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        self.nic.post_send(chain)
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        self.nic.post_recv(wr_id)
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        self.nic.poll(out)
    }

    #[inline(always)]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        self.nic.poll_take(out, take)
    }

    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        self.nic.read_inbound(offset, out);
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        self.nic.write_staging(offset, bytes);
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        self.nic.deliver_inbound(offset, len, dst);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        self.nic.write_inbound(offset, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn device_endpoint_can_move_between_threads() {
        assert_send::<Mlx5Endpoint<Device>>();
    }

    #[test]
    fn device_endpoint_is_refused_without_an_mlx5_device() {
        // No mlx5 hardware on the build machines: discovery finds no port, or the device is not
        // mlx5; either way `new` is never reached with one. What can be checked here is that
        // the support probe answers (or errs) without crashing.
        if let Ok(list) = rivet_verbs_ffi::DeviceList::new() {
            for device in list.iter() {
                if let Ok(context) = device.open() {
                    let supported = device_supported(&context);
                    assert!(
                        !matches!(supported, Ok(true)) || device.name().starts_with("mlx5"),
                        "{} claims mlx5 support",
                        device.name()
                    );
                }
            }
        }
    }
}
