//! An RMA group's control channel: the p2p connections the group formed at `connect` (one send
//! comm to, one receive comm from, every other rank), used by the collective calls to exchange
//! a few bytes with every rank — queue pair descriptions at `createContext`, window addresses
//! and keys at `regMrSym`.
//!
//! Every collective call makes one [`Control::exchange`]: a message to each other rank and one
//! from each, matched by a sequence number both ends count the same way (NCCL makes the
//! collective calls in the same order on every rank). A message out of order, of another kind,
//! or that does not arrive within the deadline fails the call with an error naming the rank.
//!
//! Unsafe (opted in): composing and reading messages in the group's scratch memory, which the
//! NIC shares (each range is used by one transfer at a time: the exchange waits for all of its
//! transfers before it returns).

#![allow(unsafe_code)]

use crate::clock;
use crate::collnet::scratch::Scratch;
use crate::comm::{self, RecvArgs};
use crate::error::{NetError, NetResult};
use crate::handle::Ptr;
use core::ffi::c_int;
use rivet_core::data::Completed;
use std::time::Duration;

/// Bytes of one message slot (header and payload).
pub(crate) const SLOT: usize = 1024;
/// Bytes of a message's header: magic, sequence number, kind, payload length.
const HEADER: usize = 16;
/// Payload bytes a message carries at most.
pub(crate) const MAX_PAYLOAD: usize = SLOT - HEADER;
/// "RMAC", first word of every control message.
const MAGIC: u32 = 0x524d_4143;
/// The tag of control messages on the group's connections.
const TAG: c_int = 0x524d;
/// How long an exchange waits for the slowest rank: NCCL's collective calls may arrive seconds
/// apart on different ranks, but never minutes.
const DEADLINE_S: u64 = 120;

/// What an exchange is for (checked on receipt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Kind {
    /// `createContext`: the lanes' queue pair descriptions.
    Lanes = 1,
    /// `createContext`: every lane is connected (a barrier before the first operation).
    Ready = 2,
    /// `regMrSym`: a window's address, length and key.
    Window = 3,
}

/// Bytes of the scratch area a group of `nranks` needs: a send and a receive slot per rank.
pub(crate) fn area(nranks: u32) -> usize {
    2 * nranks as usize * SLOT
}

/// The group's connections and the scratch memory their messages pass through.
#[derive(Debug)]
pub(crate) struct Control {
    pub(crate) nranks: u32,
    pub(crate) rank: u32,
    /// Send comms by rank (NULL for the own rank).
    pub(crate) sends: Vec<Ptr>,
    /// Receive comms by rank (NULL for the own rank).
    pub(crate) recvs: Vec<Ptr>,
    pub(crate) scratch: Scratch,
    /// Registration of `scratch`.
    pub(crate) mh: Ptr,
    /// Exchanges made so far.
    seq: u32,
}

// SAFETY: the comm and registration handles are opaque values of the handle tables, never
// dereferenced here; the scratch memory is `Send`.
unsafe impl Send for Control {}

impl Control {
    /// A control channel over connections already formed.
    pub(crate) fn new(
        nranks: u32,
        rank: u32,
        sends: Vec<Ptr>,
        recvs: Vec<Ptr>,
        scratch: Scratch,
        mh: Ptr,
    ) -> Self {
        Self {
            nranks,
            rank,
            sends,
            recvs,
            scratch,
            mh,
            seq: 0,
        }
    }

    fn send_slot(&self, peer: u32) -> usize {
        peer as usize * SLOT
    }

    fn recv_slot(&self, peer: u32) -> usize {
        (self.nranks + peer) as usize * SLOT
    }

    /// Send `outgoing(peer)` to every other rank and return what each rank sent this one (the
    /// own entry is `outgoing(rank)`), for the call named `call`.
    pub(crate) fn exchange(
        &mut self,
        call: &str,
        kind: Kind,
        outgoing: &dyn Fn(u32) -> Vec<u8>,
    ) -> NetResult<Vec<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let n = self.nranks;
        let others: Vec<u32> = (0..n).filter(|&q| q != self.rank).collect();
        let mut incoming = vec![Vec::new(); n as usize];
        incoming[self.rank as usize] = outgoing(self.rank);
        // Each message's length (header included), by rank, as written into its send slot.
        let mut msg_len = vec![0usize; n as usize];
        for &q in &others {
            let payload = outgoing(q);
            if payload.len() > MAX_PAYLOAD {
                return Err(NetError::misuse(format!(
                    "{call}: a control message of {} bytes (at most {MAX_PAYLOAD})",
                    payload.len()
                )));
            }
            let mut msg = Vec::with_capacity(HEADER + payload.len());
            for word in [MAGIC, seq, kind as u32, payload.len() as u32] {
                msg.extend_from_slice(&word.to_le_bytes());
            }
            msg.extend_from_slice(&payload);
            // SAFETY: the send slot of `q` is used by no transfer (the previous exchange waited
            // for all of its sends).
            unsafe { self.scratch.bytes_mut(self.send_slot(q), msg.len()) }.copy_from_slice(&msg);
            msg_len[q as usize] = msg.len();
        }
        // Receives first, so every peer's message has a buffer when it comes.
        let mut recv_req: Vec<Option<Ptr>> = vec![None; n as usize];
        let mut send_req: Vec<Option<Ptr>> = vec![None; n as usize];
        let mut recv_done = vec![false; n as usize];
        let mut send_done = vec![false; n as usize];
        let deadline = clock::now() + rivet_core::time::Duration::from_secs(DEADLINE_S);
        loop {
            let mut all = true;
            for &q in &others {
                let i = q as usize;
                if !recv_done[i] {
                    all = false;
                    if recv_req[i].is_none() {
                        let mut args = RecvArgs {
                            n: 1,
                            data: [core::ptr::null_mut(); 8],
                            sizes: [0; 8],
                            tags: [0; 8],
                            mhandles: [core::ptr::null_mut(); 8],
                        };
                        args.data[0] = self.scratch.addr(self.recv_slot(q)) as Ptr;
                        args.sizes[0] = SLOT;
                        args.tags[0] = TAG;
                        args.mhandles[0] = self.mh;
                        let r = comm::internal::irecv(self.recvs[i], &args)
                            .map_err(|e| peer_error(call, q, &e))?;
                        recv_req[i] = (!r.is_null()).then_some(r);
                    }
                    if let Some(r) = recv_req[i]
                        && comm::internal::test(r).map_err(|e| peer_error(call, q, &e))?
                            != Completed::Pending
                    {
                        recv_req[i] = None;
                        recv_done[i] = true;
                        incoming[i] = self.read(call, q, seq, kind)?;
                    }
                }
                if !send_done[i] {
                    all = false;
                    if send_req[i].is_none() {
                        let len = msg_len[i];
                        let addr = self.scratch.addr(self.send_slot(q)) as Ptr;
                        let r = comm::internal::isend(self.sends[i], addr, len, TAG, self.mh)
                            .map_err(|e| peer_error(call, q, &e))?;
                        send_req[i] = (!r.is_null()).then_some(r);
                    }
                    if let Some(r) = send_req[i]
                        && comm::internal::test(r).map_err(|e| peer_error(call, q, &e))?
                            != Completed::Pending
                    {
                        send_req[i] = None;
                        send_done[i] = true;
                    }
                }
            }
            if all {
                return Ok(incoming);
            }
            if clock::now() >= deadline {
                let missing: Vec<String> = others
                    .iter()
                    .filter(|&&q| !recv_done[q as usize] || !send_done[q as usize])
                    .map(u32::to_string)
                    .collect();
                return Err(NetError::remote(format!(
                    "{call}: rank(s) {} did not take part within {} s (a collective call: every \
                     rank must make it)",
                    missing.join(", "),
                    DEADLINE_S
                )));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Check and copy out the message received from `peer`.
    fn read(&self, call: &str, peer: u32, seq: u32, kind: Kind) -> NetResult<Vec<u8>> {
        // SAFETY: the receive of this slot completed; no transfer writes it until the next
        // exchange posts a receive.
        let bytes = unsafe { self.scratch.bytes(self.recv_slot(peer), SLOT) };
        let word =
            |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]));
        let len = word(3) as usize;
        if word(0) != MAGIC || word(1) != seq || word(2) != kind as u32 || len > MAX_PAYLOAD {
            return Err(NetError::remote(format!(
                "{call}: rank {peer} sent control message {} of kind {} where message {seq} of \
                 kind {} was due (the ranks made RMA's collective calls in different orders)",
                word(1),
                word(2),
                kind as u32
            )));
        }
        Ok(bytes[HEADER..HEADER + len].to_vec())
    }
}

fn peer_error(call: &str, peer: u32, e: &NetError) -> NetError {
    NetError::new(
        e.class(),
        format!("{call}: control connection to rank {peer}: {e}"),
    )
}
