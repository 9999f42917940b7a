//! `iflush`: making a receive into GPU memory visible before NCCL's kernel reads it.
//!
//! A receive comm on a port that flushes (GPU memory advertised, `NCCL_GDR_FLUSH_DISABLE` unset;
//! or the test switch `RIVET_TEST_FLUSH_HOST_MEMORY=1`) owns a loopback queue pair
//! ([`crate::backend::flush`]). `iflush` asks the core ([`rivet_core::flush`]) what to read, posts
//! the 1-byte READ and returns a request; `test` of that request polls the loopback queue pair.
//! Everything else (`iflush` on a port that does not flush, or after a receive of 0 bytes) returns
//! a NULL request, which NCCL reads as "done", as NCCL's IB transport does.

use super::mr;
use crate::backend::flush::FlushQp;
use crate::error::{NetError, NetResult};
use crate::handle::Ptr;
use rivet_core::flush::{FlushError, FlushId, FlushPlan, FlushQueue, MAX_FLUSHES};
use rivet_core::nic::WcStatus;

/// A receive comm's flush state.
#[derive(Debug)]
pub(crate) struct GpuFlush {
    qp: FlushQp,
    queue: FlushQueue,
}

/// The buffers of one receive as `iflush` names them.
#[derive(Debug)]
pub(crate) struct FlushArgs {
    /// Number of buffers (1..=8).
    pub(crate) n: usize,
    /// Buffer addresses.
    pub(crate) data: [Ptr; 8],
    /// Bytes received per buffer (what `test` reported).
    pub(crate) sizes: [u64; 8],
    /// Memory handles from `regMr`.
    pub(crate) mhandles: [Ptr; 8],
}

impl GpuFlush {
    /// Wrap a connected loopback queue pair.
    pub(crate) fn new(qp: FlushQp) -> Self {
        Self {
            qp,
            queue: FlushQueue::new(),
        }
    }

    /// Start the flush of a receive: `None` when there is nothing to flush, else the id `test`
    /// will be called with.
    pub(crate) fn start(&mut self, args: &FlushArgs) -> NetResult<Option<FlushId>> {
        let plan = self
            .queue
            .start(&args.sizes[..args.n])
            .map_err(|e| self.error("iflush", &e))?;
        let FlushPlan::Read { id, buffer } = plan else {
            return Ok(None);
        };
        let addr = args.data[buffer] as u64;
        let rkey =
            match mr::lookup("iflush", args.mhandles[buffer]).and_then(|mr| mr.rkey_for(addr, 1)) {
                Ok(rkey) => rkey,
                Err(e) => {
                    self.queue.abandon(id);
                    return Err(e);
                }
            };
        if let Err(errno) = self.qp.post_read(id.wr_id(), addr, rkey) {
            self.queue.abandon(id);
            return Err(NetError::system(format!(
                "iflush: posting the flush read on loopback QP {} failed (errno {errno})",
                self.qp.qp_num()
            )));
        }
        Ok(Some(id))
    }

    /// Whether flush `id` is done.
    pub(crate) fn test(&mut self, id: FlushId) -> NetResult<bool> {
        let mut polled = [(0u64, WcStatus::SUCCESS); MAX_FLUSHES];
        let n = self.qp.poll(&mut polled).map_err(|code| {
            NetError::system(format!(
                "test: polling the flush queue pair {} failed ({code})",
                self.qp.qp_num()
            ))
        })?;
        for &(wr_id, status) in &polled[..n] {
            self.queue
                .handle_completion(wr_id, status)
                .map_err(|e| self.error("test", &e))?;
        }
        self.queue.test(id).map_err(|e| self.error("test", &e))
    }

    fn error(&self, call: &str, err: &FlushError) -> NetError {
        let message = format!("{call}: loopback flush QP {}: {err}", self.qp.qp_num());
        match err {
            FlushError::UnknownId(_) | FlushError::TooMany | FlushError::TooManyBuffers(_) => {
                NetError::misuse(message)
            }
            FlushError::ReadFailed(_) | FlushError::UnexpectedCompletion(_) => {
                NetError::system(message)
            }
        }
    }
}
