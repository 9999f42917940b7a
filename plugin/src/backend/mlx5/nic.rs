//! [`DirectNic`]: rivet-core's [`Nic`] on the mlx5 direct data path. It only translates: core
//! work requests into [`DirectWr`]s, [`DirectCompletion`]s into core completions, with the same
//! mapping the libibverbs backend applies to `ibv_wc`, so the core cannot tell the two apart.
//!
//! This file depends on nothing but rivet-core and rivet-verbs-ffi: `benches/mlx5_model.rs`
//! includes it with `#[path]` to measure exactly this code.

use rivet_core::data::classify;
use rivet_core::nic::WcStatus;
use rivet_core::nic::{
    Completion, Nic, NicError, Payload, Queue, RawCompletion, RawOp, SendOp, SendWr,
};
use rivet_verbs_ffi::mlx5::{
    CompletedOp, DirectCompletion, DirectError, DirectOp, DirectQp, DirectWr, DoorbellRegister,
    WorkQueue, WqeData,
};

/// The two control regions of a connection, wherever they live (registered host memory on a
/// device, model memory on the model).
pub(crate) trait ControlRegions {
    /// Copy inbound bytes at `offset` out (volatile loads, then an acquire fence).
    fn read_inbound(&self, offset: usize, out: &mut [u8]);
    /// Copy `bytes` into staging at `offset`; false when out of range.
    fn write_staging(&mut self, offset: usize, bytes: &[u8]) -> bool;
    /// The staging region: address, local key, length.
    fn staging(&self) -> (u64, u32, usize);
    /// Copy `len` inbound bytes at `offset` into the host receive buffer at `dst`
    /// ([`Nic::deliver_inbound`]).
    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64);
    /// Copy `bytes` into the inbound region at `offset` ([`Nic::write_inbound`]); false when out
    /// of range.
    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) -> bool;
}

/// A connection's direct queue pair and control regions.
#[derive(Debug)]
pub(crate) struct DirectNic<D: DoorbellRegister, R: ControlRegions> {
    pub(crate) qp: DirectQp<D>,
    pub(crate) regions: R,
}

/// A core work request as a direct one (staged payloads resolved against `regions`).
fn translate<'a>(
    regions: &impl ControlRegions,
    wr: &SendWr<'a>,
) -> Result<DirectWr<'a>, DirectError> {
    let data = match wr.payload {
        Payload::Empty => WqeData::None,
        Payload::Inline(bytes) => WqeData::Inline(bytes),
        Payload::Local(sge) => WqeData::Gather {
            addr: sge.addr,
            len: sge.len,
            lkey: sge.lkey,
        },
        Payload::Staged { offset, len } => {
            let (addr, lkey, staging_len) = regions.staging();
            if u64::from(offset) + u64::from(len) > staging_len as u64 {
                return Err(DirectError::Malformed {
                    what: "staged range outside the staging region",
                });
            }
            WqeData::Gather {
                addr: addr + u64::from(offset),
                len,
                lkey,
            }
        }
    };
    let op = match wr.op {
        SendOp::Write => DirectOp::Write,
        SendOp::WriteImm(imm) => DirectOp::WriteImm(imm),
    };
    Ok(DirectWr {
        wr_id: wr.wr_id,
        op,
        data,
        remote_addr: wr.remote_addr,
        rkey: wr.rkey,
        signaled: wr.signaled,
    })
}

/// A direct completion in the terms the core classifies ([`classify`]).
fn completion(c: &DirectCompletion) -> Completion {
    let op = match c.op {
        CompletedOp::RecvWriteImm => RawOp::RecvWriteImm {
            imm: c.imm.unwrap_or(0),
        },
        CompletedOp::RecvSend => RawOp::RecvOther,
        _ => RawOp::Send,
    };
    classify(&RawCompletion {
        wr_id: c.wr_id,
        status: WcStatus(c.status),
        vendor_err: c.vendor_err,
        op,
        byte_len: c.byte_len,
        queue: Some(if c.queue == WorkQueue::Recv {
            Queue::Recv
        } else {
            Queue::Send
        }),
    })
}

impl<D: DoorbellRegister, R: ControlRegions> Nic for DirectNic<D, R> {
    fn max_inline(&self) -> usize {
        self.qp.max_inline()
    }

    /// In line, down to the WQE stores: what the caller fixes (one request, the payload's kind,
    /// an inline length) then folds, and the request stays in registers.
    #[inline(always)]
    fn post_send(&mut self, chain: &[SendWr<'_>]) -> Result<(), NicError> {
        let Self { qp, regions } = self;
        let regions = &*regions;
        qp.post_send_with(chain.len(), |i| translate(regions, &chain[i]))
            .map_err(|e| NicError::Post { errno: e.errno() })
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<(), NicError> {
        self.qp
            .post_recv(wr_id)
            .map_err(|e| NicError::Post { errno: e.errno() })
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, NicError> {
        self.poll_take(out, |_| false).map(|(got, _)| got)
    }

    /// The first completion (the only one, in the common case) is converted and offered to
    /// `take` as the CQE is decoded, in registers; the rest, or all of them after a refusal, are
    /// stored to `out`. The CQEs are taken one by one here (not through a sink closure), so
    /// `take` is called in line and its captures need no address.
    #[inline(always)]
    fn poll_take(
        &mut self,
        out: &mut [Completion],
        mut take: impl FnMut(&Completion) -> bool,
    ) -> Result<(usize, usize), NicError> {
        let start = self.qp.poll_start();
        let (mut got, mut stored) = (0, 0);
        let result = loop {
            if got == out.len() {
                break Ok(());
            }
            match self.qp.poll_next() {
                Ok(Some(c)) => {
                    let c = completion(&c);
                    got += 1;
                    if got == 1 && take(&c) {
                        continue;
                    }
                    if let Some(slot) = out.get_mut(stored) {
                        *slot = c;
                    }
                    stored += 1;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(NicError::Poll { code: e.errno() }),
            }
        };
        self.qp.poll_end(start);
        result.map(|()| (got, stored))
    }

    fn read_inbound(&self, offset: usize, out: &mut [u8]) {
        self.regions.read_inbound(offset, out);
    }

    fn write_staging(&mut self, offset: usize, bytes: &[u8]) {
        // The core only stages inside the region it sized; a refusal would surface as a protocol
        // error when the peer validates what arrives (as in the verbs backend).
        let _ = self.regions.write_staging(offset, bytes);
    }

    fn deliver_inbound(&mut self, offset: usize, len: usize, dst: u64) {
        self.regions.deliver_inbound(offset, len, dst);
    }

    fn write_inbound(&mut self, offset: usize, bytes: &[u8]) {
        let _ = self.regions.write_inbound(offset, bytes);
    }
}
