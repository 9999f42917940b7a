//! A software model of an mlx5 device, for tests and benches: it owns send/receive queues, CQs
//! and doorbell records laid out exactly as the hardware's, and executes what the direct path
//! ([`super::DirectQp`]) writes there against registered memory of the peer.
//!
//! - **Doorbells.** A [`ModelDoorbell`] records the 64-bit stores the posting code makes into the
//!   BlueFlame register. On `wc_flush` the model reads the send doorbell record, parses every new
//!   WQE from the ring and checks it (control segment index, QPN, opcode, `ds` against the
//!   segments present, reserved bytes, inline headers, zero byte counts), then checks the stores:
//!   a BlueFlame copy of exactly the single new WQE at the current half, or one 8-byte doorbell
//!   equal to the first 8 bytes of the last new WQE's control segment, halves alternating.
//! - **Execution** is step-driven like `rivet_core::sim`: [`Model::step`] executes the oldest
//!   queued WQE of any QP. RDMA WRITE, WRITE WITH IMMEDIATE (consuming the peer's oldest receive
//!   WQE, read from its receive doorbell record and checked) and RDMA READ run against memory the
//!   model allocated and registered ([`Model::alloc_registered`]); keys and bounds are checked
//!   first, so no unchecked address is ever dereferenced.
//! - **CQEs** are written with the hardware layout: owner bit flipped on every pass, `wqe_counter`,
//!   byte count, immediate, QPNs, and error CQEs with syndromes. A CQE is written only when the
//!   consumer index in the CQ doorbell record leaves room, otherwise the model panics (overrun).
//! - **Errors**: a bad lkey → `LOCAL_PROT_ERR`, a bad rkey or range → `REMOTE_ACCESS_ERR` (the
//!   responder QP fails too), no receive posted → `RNR_RETRY_EXC_ERR`, a vanished or failed peer →
//!   `TRANSPORT_RETRY_EXC_ERR`. A failed QP flushes every outstanding send WQE (signaled or not)
//!   and every posted receive with `WR_FLUSH_ERR` CQEs, and flushes later posts at once.
//!
//! The model **panics** on anything the plugin writes that the hardware would reject or
//! misread. It is single-threaded (`Rc<RefCell<..>>`).
//!
//! Unsafe: the model hands out and reads raw queue memory shared with a [`super::DirectQp`], and
//! copies between registered buffers by address after checking them against its allocations.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::rc::Rc;

use super::cqe::{self, CQE64_LEN, Cqe, syndrome};
use super::direct::{DirectError, DirectQp, MAX_SQ_BBS, QueueLayout};
use super::doorbell::DoorbellRegister;
use super::dv::{MLX5_CQ_SET_CI, MLX5_RCV_DBR, MLX5_SND_DBR};
use super::wqe::{
    self, CtrlSeg, DS_UNIT, INLINE_SEG, INVALID_LKEY, MAX_DS, SEND_WQE_BB, decode_data_seg,
    decode_raddr_seg, fm_ce_se, inline_ds, wqe_bbs,
};
use crate::sys::access;

/// Vendor syndrome the model reports in error CQEs (any non-zero byte would do).
pub const MODEL_VENDOR_SYNDROME: u8 = 0x42;

/// A protection domain of the model: memory regions and QPs belong to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelPd(usize);

/// A registered region of model memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelMr {
    /// First byte (a real address in this process).
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// `ibv_access_flags`.
    pub access: u32,
}

/// Geometry of a model QP, as `mlx5dv_init_obj` would report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelQpConfig {
    /// Send queue basic blocks (power of two).
    pub sq_wqe_cnt: u32,
    /// Receive WQEs (power of two).
    pub rq_wqe_cnt: u32,
    /// Receive stride (power of two ≥ 16).
    pub rq_stride: u32,
    /// CQEs (power of two).
    pub cqe_cnt: u32,
    /// CQE size (64 or 128).
    pub cqe_size: u32,
    /// BlueFlame half size (0: doorbells only).
    pub bf_size: u32,
}

impl Default for ModelQpConfig {
    /// What a ConnectX gives `ibv_create_qp(max_send_wr 512, max_inline 220, max_recv_wr 256)`
    /// with a 768-entry CQ.
    fn default() -> Self {
        Self {
            sq_wqe_cnt: 4096,
            rq_wqe_cnt: 256,
            rq_stride: 16,
            cqe_cnt: 1024,
            cqe_size: 64,
            bf_size: 256,
        }
    }
}

/// Counters of what the model saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Doorbells rung with a BlueFlame copy.
    pub bf_copies: u64,
    /// Doorbells rung with an 8-byte store.
    pub doorbells: u64,
    /// WQEs parsed.
    pub wqes: u64,
    /// WQEs executed.
    pub executed: u64,
    /// CQEs written.
    pub cqes: u64,
    /// Receive WQEs consumed.
    pub recvs: u64,
}

/// The model. Cheap to clone: clones share the device.
#[derive(Clone, Debug, Default)]
pub struct Model {
    inner: Rc<RefCell<Inner>>,
}

/// One QP of the model (with its CQ), as a handle.
#[derive(Clone, Debug)]
pub struct ModelQp {
    model: Model,
    id: usize,
    layout: QueueLayout,
    bf_size: u32,
}

/// The doorbell register of a model QP: records stores and hands them to the model on flush.
#[derive(Debug)]
pub struct ModelDoorbell {
    model: Model,
    qp: usize,
    bf_size: u32,
    stores: [(usize, u64); 64],
    n: usize,
    started: bool,
}

#[derive(Debug, Default)]
struct Inner {
    allocs: Vec<Alloc>,
    pds: Vec<Vec<ModelMr>>,
    next_key: u32,
    qps: Vec<QpModel>,
    /// (QP, first basic block) of every queued send WQE, in doorbell order.
    order: VecDeque<(usize, u16)>,
    stats: ModelStats,
    /// Place each write in two steps, second half first.
    split_placement: bool,
    /// A malformed WQE completes in error instead of panicking.
    malformed_completes_in_error: bool,
    scratch: Vec<u8>,
    parsed_pis: Vec<u16>,
}

#[derive(Debug)]
struct Alloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Ready,
    Error,
}

#[derive(Debug)]
struct QpModel {
    /// A DirectQp was built on it.
    taken: bool,
    pd: usize,
    peer: Option<usize>,
    state: QpState,
    vanished: bool,
    layout: QueueLayout,
    bf_size: u32,
    /// Send producer index the model has parsed up to.
    sq_parsed: u16,
    /// WQEs parsed and not executed: first basic block each.
    pending: VecDeque<u16>,
    /// Producer index the device has executed up to.
    sq_executed: u16,
    bf_offset: usize,
    /// Receive WQEs consumed (16-bit counter as the hardware keeps it).
    rq_consumed: u32,
    /// CQEs written.
    cq_pi: u32,
    /// Split placement: the WQE whose second half is already placed.
    tail_placed: Option<u16>,
    /// A malformed WQE (first basic block, syndrome) that completes in error when it runs.
    malformed: Option<(u16, u8)>,
}

/// What is wrong with a WQE.
#[derive(Debug)]
struct Malformed {
    text: String,
    syndrome: u8,
}

/// How far a transfer got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transfer {
    /// Complete.
    Done,
    /// Split placement: only the second half is in place yet.
    TailPlaced,
}

/// A parsed send WQE.
#[derive(Clone, Copy, Debug)]
struct Parsed {
    opcode: u8,
    signaled: bool,
    imm: [u8; 4],
    raddr: u64,
    rkey: u32,
    data: ParsedData,
    bbs: u16,
}

#[derive(Clone, Copy, Debug)]
enum ParsedData {
    None,
    /// Inline bytes: length (the bytes start 4 bytes into unit 2).
    Inline(usize),
    Gather {
        addr: u64,
        len: u32,
        lkey: u32,
    },
}

impl Parsed {
    fn len(&self) -> u32 {
        match self.data {
            ParsedData::None => 0,
            ParsedData::Inline(len) => len as u32,
            ParsedData::Gather { len, .. } => len,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for a in &self.allocs {
            // SAFETY: allocated in `alloc` with this layout, freed once.
            unsafe { dealloc(a.ptr.as_ptr(), a.layout) };
        }
    }
}

impl Inner {
    fn alloc(&mut self, len: usize, align: usize) -> NonNull<u8> {
        let layout = Layout::from_size_align(len.max(1), align).expect("model: allocation layout");
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("model: out of memory");
        self.allocs.push(Alloc { ptr, layout });
        ptr
    }

    /// Whether `addr..addr+len` lies inside one allocation.
    fn inside_alloc(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.allocs.iter().any(|a| {
            let start = a.ptr.as_ptr() as u64;
            addr >= start && end <= start + a.layout.size() as u64
        })
    }

    fn find_mr(&self, pd: usize, key: u32, remote: bool, addr: u64, len: u64, need: u32) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.pds[pd].iter().any(|mr| {
            let k = if remote { mr.rkey } else { mr.lkey };
            k == key && addr >= mr.addr && end <= mr.addr + mr.len && mr.access & need == need
        })
    }

    fn sq_unit(&self, qp: usize, unit: u32) -> [u8; 16] {
        let l = &self.qps[qp].layout;
        let units = l.sq_wqe_cnt * (SEND_WQE_BB / DS_UNIT) as u32;
        let at = (unit & (units - 1)) as usize * DS_UNIT;
        // SAFETY: inside the send queue this model allocated.
        unsafe { l.sq_buf.add(at).cast::<[u8; 16]>().read_unaligned() }
    }

    fn dbrec(ptr: NonNull<u32>, index: usize) -> u32 {
        // SAFETY: doorbell records are 8-byte allocations of this model.
        u32::from_be(unsafe { ptr.add(index).read_volatile() })
    }

    /// Parse and check the WQE at `pi`; panics on any deviation.
    fn parse(&self, qp: usize, pi: u16) -> Parsed {
        self.try_parse(qp, pi)
            .unwrap_or_else(|m| panic!("{}", m.text))
    }

    /// Parse and check the WQE at `pi`: the WQE, or what is wrong with it and the syndrome a
    /// device would report for it.
    fn try_parse(&self, qp: usize, pi: u16) -> Result<Parsed, Malformed> {
        let q = &self.qps[qp];
        let first = u32::from(pi) * 4;
        let (ctrl, reserved) = CtrlSeg::decode(&self.sq_unit(qp, first));
        macro_rules! ensure {
            ($cond:expr, $synd:expr, $($fmt:tt)+) => {
                if !$cond {
                    return Err(Malformed {
                        text: format!("model: QP {:#x} WQE at pi {pi}: {}", q.layout.qpn, format!($($fmt)+)),
                        syndrome: $synd,
                    });
                }
            };
        }
        const QP_OP: u8 = syndrome::LOCAL_QP_OP_ERR;
        const LENGTH: u8 = syndrome::LOCAL_LENGTH_ERR;
        ensure!(
            ctrl.wqe_index == pi,
            QP_OP,
            "control segment carries index {}",
            ctrl.wqe_index
        );
        ensure!(
            ctrl.qpn == q.layout.qpn,
            QP_OP,
            "wrong QPN in control segment ({:#x})",
            ctrl.qpn
        );
        ensure!(ctrl.opmod == 0, QP_OP, "opmod {}", ctrl.opmod);
        ensure!(reserved == [0; 3], QP_OP, "signature/stream bytes not zero");
        ensure!(
            ctrl.fm_ce_se & !fm_ce_se::CQ_UPDATE == 0,
            QP_OP,
            "fm_ce_se {:#x} sets bits the plugin never needs",
            ctrl.fm_ce_se
        );
        let ds = usize::from(ctrl.ds);
        ensure!((2..=MAX_DS).contains(&ds), LENGTH, "ds {ds}");
        if ctrl.opcode != wqe::opcode::RDMA_WRITE_IMM {
            ensure!(
                ctrl.imm == [0; 4],
                QP_OP,
                "immediate on a non-immediate opcode"
            );
        }
        let (raddr, rkey, rsvd) = decode_raddr_seg(&self.sq_unit(qp, first + 1));
        ensure!(
            rsvd == 0,
            QP_OP,
            "reserved word of the remote-address segment"
        );
        let data = if ds == 2 {
            ParsedData::None
        } else {
            let seg = self.sq_unit(qp, first + 2);
            let word = wqe::be32(&seg, 0);
            if word & INLINE_SEG != 0 {
                let len = (word & !INLINE_SEG) as usize;
                ensure!(len > 0, LENGTH, "empty inline segment");
                ensure!(
                    ds == 2 + inline_ds(len),
                    LENGTH,
                    "ds {ds} does not match a {len}-byte inline segment"
                );
                ParsedData::Inline(len)
            } else {
                ensure!(ds == 3, LENGTH, "ds {ds} for one data segment");
                let (len, lkey, addr) = decode_data_seg(&seg);
                ensure!(
                    len != 0,
                    LENGTH,
                    "data segment byte_count 0 means 2 GiB to the hardware"
                );
                ParsedData::Gather { addr, len, lkey }
            }
        };
        match ctrl.opcode {
            wqe::opcode::RDMA_WRITE | wqe::opcode::RDMA_WRITE_IMM => {}
            // A zero-length READ carries no data segment (a byte count of 0 would mean 2 GiB).
            wqe::opcode::RDMA_READ => {
                ensure!(
                    !matches!(data, ParsedData::Inline(_)),
                    QP_OP,
                    "inline RDMA READ"
                )
            }
            other => ensure!(
                false,
                QP_OP,
                "opcode {other:#x} is not one the plugin posts"
            ),
        }
        Ok(Parsed {
            opcode: ctrl.opcode,
            signaled: ctrl.fm_ce_se & fm_ce_se::CQ_UPDATE != 0,
            imm: ctrl.imm,
            raddr,
            rkey,
            data,
            bbs: wqe_bbs(ds) as u16,
        })
    }

    /// Opcode byte and basic blocks of the WQE at `pi`, even when it is malformed (then one BB).
    fn summary(&self, qp: usize, pi: u16) -> Parsed {
        self.try_parse(qp, pi).unwrap_or_else(|_| {
            let (ctrl, _) = CtrlSeg::decode(&self.sq_unit(qp, u32::from(pi) * 4));
            Parsed {
                opcode: ctrl.opcode,
                signaled: true,
                imm: [0; 4],
                raddr: 0,
                rkey: 0,
                data: ParsedData::None,
                bbs: 1,
            }
        })
    }

    /// Bytes of the WQE at `pi`, as the BlueFlame copy must carry them.
    fn wqe_words(&self, qp: usize, pi: u16, words: usize) -> impl Iterator<Item = u64> + '_ {
        (0..words).map(move |w| {
            let unit = self.sq_unit(qp, u32::from(pi) * 4 + (w / 2) as u32);
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&unit[(w % 2) * 8..(w % 2) * 8 + 8]);
            u64::from_ne_bytes(raw)
        })
    }

    fn doorbell(&mut self, qp: usize, stores: &[(usize, u64)]) {
        let layout = self.qps[qp].layout;
        let new_pi = Self::dbrec(layout.qp_dbrec, MLX5_SND_DBR);
        assert!(
            new_pi <= 0xffff,
            "model: send doorbell record {new_pi:#x} wider than 16 bits"
        );
        let new_pi = new_pi as u16;
        let start = self.qps[qp].sq_parsed;
        assert_ne!(
            new_pi, start,
            "model: doorbell rung but the send doorbell record did not advance"
        );
        let mut pi = start;
        let mut wqes = std::mem::take(&mut self.parsed_pis);
        wqes.clear();
        let mut last = None;
        while pi != new_pi {
            let parsed = match self.try_parse(qp, pi) {
                Ok(parsed) => parsed,
                Err(m) if self.malformed_completes_in_error => {
                    // The device stops at a malformed WQE: it completes in error when its turn
                    // comes and the QP fails; what follows it is never looked at.
                    self.qps[qp].malformed = Some((pi, m.syndrome));
                    wqes.push(pi);
                    last = None;
                    break;
                }
                Err(m) => panic!("{}", m.text),
            };
            let end = pi.wrapping_add(parsed.bbs);
            assert!(
                end.wrapping_sub(start) <= new_pi.wrapping_sub(start),
                "model: WQE at pi {pi} ends past the doorbell record ({new_pi})"
            );
            wqes.push(pi);
            last = Some((pi, parsed));
            pi = end;
        }
        let in_flight = new_pi.wrapping_sub(self.qps[qp].sq_executed);
        assert!(
            u32::from(in_flight) <= layout.sq_wqe_cnt,
            "model: send queue overrun: {in_flight} basic blocks not yet executed in a ring of {}",
            layout.sq_wqe_cnt
        );
        // The stores.
        let q = &self.qps[qp];
        let off = q.bf_offset;
        assert!(!stores.is_empty(), "model: doorbell flush without a store");
        let Some((last_pi, last)) = last else {
            // A malformed WQE: the stores are not checked against it.
            let q = &mut self.qps[qp];
            q.bf_offset ^= q.bf_size as usize;
            q.sq_parsed = new_pi;
            for &pi in &wqes {
                self.qps[qp].pending.push_back(pi);
                self.order.push_back((qp, pi));
            }
            self.parsed_pis = wqes;
            return;
        };
        if stores.len() == 1 {
            assert_eq!(
                stores[0].0, off,
                "model: doorbell at offset {} but the current half is {off}",
                stores[0].0
            );
            let expected = self.wqe_words(qp, last_pi, 1).next().unwrap_or(0);
            assert_eq!(
                stores[0].1, expected,
                "model: doorbell value is not the last WQE's control segment"
            );
            self.stats.doorbells += 1;
        } else {
            assert!(
                q.bf_size > 0,
                "model: BlueFlame copy on a register without BlueFlame"
            );
            assert_eq!(
                wqes.len(),
                1,
                "model: BlueFlame copy of a {}-WQE batch",
                wqes.len()
            );
            let words = usize::from(last.bbs) * SEND_WQE_BB / 8;
            assert!(
                words * 8 <= q.bf_size as usize,
                "model: BlueFlame copy larger than a half"
            );
            assert_eq!(
                stores.len(),
                words,
                "model: BlueFlame copy of {} words for a {}-BB WQE",
                stores.len(),
                last.bbs
            );
            for (i, ((offset, value), expected)) in stores
                .iter()
                .zip(self.wqe_words(qp, last_pi, words))
                .enumerate()
            {
                assert_eq!(
                    *offset,
                    off + 8 * i,
                    "model: BlueFlame store {i} out of order"
                );
                assert_eq!(
                    *value, expected,
                    "model: BlueFlame word {i} differs from the WQE in the ring"
                );
            }
            self.stats.bf_copies += 1;
        }
        let q = &mut self.qps[qp];
        q.bf_offset ^= q.bf_size as usize;
        q.sq_parsed = new_pi;
        self.stats.wqes += wqes.len() as u64;
        for &pi in &wqes {
            self.qps[qp].pending.push_back(pi);
            if self.qps[qp].state == QpState::Error {
                self.flush_sq(qp);
            } else {
                self.order.push_back((qp, pi));
            }
        }
        self.parsed_pis = wqes;
    }

    /// A failed QP flushes receives as soon as they are posted.
    fn flush_failed_receives(&mut self) {
        for qp in 0..self.qps.len() {
            if self.qps[qp].state == QpState::Error && self.rq_available(qp) > 0 {
                self.fail(qp);
            }
        }
    }

    fn write_cqe(&mut self, qp: usize, mut cqe: Cqe) {
        let layout = self.qps[qp].layout;
        let ci = Self::dbrec(layout.cq_dbrec, MLX5_CQ_SET_CI);
        let pi = self.qps[qp].cq_pi;
        let used = (pi & 0x00ff_ffff).wrapping_sub(ci) & 0x00ff_ffff;
        assert!(
            used < layout.cqe_cnt,
            "model: CQ overrun: consumer index {ci} in the doorbell record, producer {pi}, ring {}",
            layout.cqe_cnt
        );
        cqe.owner = pi & layout.cqe_cnt != 0;
        let bytes = cqe.encode();
        let slot = (pi & (layout.cqe_cnt - 1)) as usize * layout.cqe_size as usize
            + (layout.cqe_size as usize - CQE64_LEN);
        // SAFETY: inside the CQ buffer the model allocated. The body goes first, `op_own` last
        // (as the hardware makes a CQE visible).
        unsafe {
            let dst = layout.cq_buf.add(slot);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_ptr(), CQE64_LEN - 1);
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            dst.add(cqe::offset::OP_OWN)
                .write_volatile(bytes[cqe::offset::OP_OWN]);
        }
        self.qps[qp].cq_pi = pi.wrapping_add(1);
        self.stats.cqes += 1;
    }

    fn req_cqe(&mut self, qp: usize, pi: u16, p: &Parsed, synd: Option<u8>) {
        let qpn = self.qps[qp].layout.qpn;
        let cqe = match synd {
            None => Cqe {
                opcode: cqe::opcode::REQ,
                byte_cnt: p.len(),
                wqe_opcode: p.opcode,
                qpn,
                wqe_counter: pi,
                ..Cqe::default()
            },
            Some(s) => Cqe {
                opcode: cqe::opcode::REQ_ERR,
                syndrome: s,
                vendor_err: MODEL_VENDOR_SYNDROME,
                wqe_opcode: p.opcode,
                qpn,
                wqe_counter: pi,
                ..Cqe::default()
            },
        };
        self.write_cqe(qp, cqe);
    }

    /// Receive WQEs posted and not consumed, from the receive doorbell record.
    fn rq_available(&self, qp: usize) -> u32 {
        let q = &self.qps[qp];
        let head = Self::dbrec(q.layout.qp_dbrec, MLX5_RCV_DBR);
        assert!(
            head <= 0xffff,
            "model: receive doorbell record {head:#x} wider than 16 bits"
        );
        let avail = head.wrapping_sub(q.rq_consumed) & 0xffff;
        assert!(
            avail <= q.layout.rq_wqe_cnt,
            "model: receive queue overrun: {avail} posted in a ring of {}",
            q.layout.rq_wqe_cnt
        );
        avail
    }

    /// Check the receive WQE about to be consumed: a scatter list of data segments ending at the
    /// stride or at an `MLX5_INVALID_LKEY` terminator.
    fn check_rq_wqe(&self, qp: usize) {
        let q = &self.qps[qp];
        let l = &q.layout;
        let index = q.rq_consumed & (l.rq_wqe_cnt - 1);
        for seg in 0..(l.rq_stride as usize / DS_UNIT) {
            let at = index as usize * l.rq_stride as usize + seg * DS_UNIT;
            // SAFETY: inside the receive queue the model allocated.
            let bytes = unsafe { l.rq_buf.add(at).cast::<[u8; 16]>().read_unaligned() };
            let (len, lkey, _) = decode_data_seg(&bytes);
            if lkey == INVALID_LKEY {
                assert_eq!(
                    bytes,
                    wqe::RECV_TERMINATOR,
                    "model: malformed receive terminator"
                );
                return;
            }
            assert!(len != 0, "model: receive scatter entry with byte_count 0");
        }
    }

    fn consume_recv(&mut self, qp: usize, cqe: Cqe) {
        self.check_rq_wqe(qp);
        let counter = self.qps[qp].rq_consumed;
        self.qps[qp].rq_consumed = counter.wrapping_add(1) & 0xffff;
        self.stats.recvs += 1;
        let qpn = self.qps[qp].layout.qpn;
        self.write_cqe(
            qp,
            Cqe {
                qpn,
                wqe_counter: counter as u16,
                ..cqe
            },
        );
    }

    /// Move `qp` to error: flush every queued send WQE and every posted receive.
    fn fail(&mut self, qp: usize) {
        self.qps[qp].state = QpState::Error;
        self.flush_sq(qp);
        while self.rq_available(qp) > 0 {
            self.consume_recv(
                qp,
                Cqe {
                    opcode: cqe::opcode::RESP_ERR,
                    syndrome: syndrome::WR_FLUSH_ERR,
                    vendor_err: MODEL_VENDOR_SYNDROME,
                    ..Cqe::default()
                },
            );
        }
    }

    fn flush_sq(&mut self, qp: usize) {
        while let Some(pi) = self.qps[qp].pending.pop_front() {
            let p = self.summary(qp, pi);
            self.req_cqe(qp, pi, &p, Some(syndrome::WR_FLUSH_ERR));
            self.qps[qp].sq_executed = pi.wrapping_add(p.bbs);
        }
    }

    /// Execute the WQE at `pi` of `qp`.
    fn execute(&mut self, qp: usize, pi: u16) {
        if self.qps[qp].pending.front() != Some(&pi) {
            return; // flushed meanwhile
        }
        if let Some((bad, synd)) = self.qps[qp].malformed {
            if bad == pi {
                let p = self.summary(qp, pi);
                self.retire(qp, pi, &p);
                self.req_cqe(qp, pi, &p, Some(synd));
                self.fail(qp);
                return;
            }
        }
        let p = self.parse(qp, pi);
        if self.qps[qp].vanished {
            self.retire(qp, pi, &p);
            return; // nothing leaves a vanished endpoint
        }
        let result = self.transfer(qp, pi, &p);
        if result == Ok(Transfer::TailPlaced) {
            // The rest lands on the next step of this QP, before anything else of it.
            self.order.push_front((qp, pi));
            return;
        }
        self.retire(qp, pi, &p);
        match result {
            Ok(_) => {
                if p.signaled {
                    self.req_cqe(qp, pi, &p, None);
                }
            }
            Err((synd, peer_fails)) => {
                self.req_cqe(qp, pi, &p, Some(synd));
                self.fail(qp);
                if let (true, Some(peer)) = (peer_fails, self.qps[qp].peer) {
                    self.fail(peer);
                }
            }
        }
    }

    /// The WQE at the head of `qp`'s queue has run.
    fn retire(&mut self, qp: usize, pi: u16, p: &Parsed) {
        self.qps[qp].pending.pop_front();
        self.qps[qp].sq_executed = pi.wrapping_add(p.bbs);
        self.stats.executed += 1;
    }

    /// Move the bytes; `Err((syndrome, responder fails too))`.
    fn transfer(&mut self, qp: usize, pi: u16, p: &Parsed) -> Result<Transfer, (u8, bool)> {
        let peer = self.qps[qp].peer.expect("model: WQE on an unconnected QP");
        if self.qps[peer].vanished || self.qps[peer].state == QpState::Error {
            return Err((syndrome::TRANSPORT_RETRY_EXC_ERR, false));
        }
        let (pd, peer_pd) = (self.qps[qp].pd, self.qps[peer].pd);
        let len = p.len();
        if p.opcode == wqe::opcode::RDMA_READ {
            let ParsedData::Gather { addr, lkey, .. } = p.data else {
                return Ok(Transfer::Done); // zero-length READ: no key is checked, nothing moves
            };
            if !self.find_mr(pd, lkey, false, addr, u64::from(len), access::LOCAL_WRITE) {
                return Err((syndrome::LOCAL_PROT_ERR, false));
            }
            if !self.find_mr(
                peer_pd,
                p.rkey,
                true,
                p.raddr,
                u64::from(len),
                access::REMOTE_READ,
            ) {
                return Err((syndrome::REMOTE_ACCESS_ERR, true));
            }
            // SAFETY: both ranges lie inside registered model allocations (checked above);
            // `copy` tolerates overlap.
            unsafe { std::ptr::copy(p.raddr as *const u8, addr as *mut u8, len as usize) };
            return Ok(Transfer::Done);
        }
        // Gather the payload.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        match p.data {
            ParsedData::None => {}
            ParsedData::Inline(n) => {
                let first = u32::from(pi) * 4 + 2;
                let mut taken = 0;
                let mut unit = 0;
                while taken < n {
                    let bytes = self.sq_unit(qp, first + unit);
                    let from = if unit == 0 { 4 } else { 0 };
                    let take = (16 - from).min(n - taken);
                    scratch.extend_from_slice(&bytes[from..from + take]);
                    taken += take;
                    unit += 1;
                }
            }
            ParsedData::Gather { addr, len, lkey } => {
                if !self.find_mr(pd, lkey, false, addr, u64::from(len), 0) {
                    self.scratch = scratch;
                    return Err((syndrome::LOCAL_PROT_ERR, false));
                }
                // SAFETY: inside a registered model allocation (checked above).
                scratch.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(addr as *const u8, len as usize)
                });
            }
        }
        // A zero-length write checks no key (IBA: the R_Key of a zero-length transfer is not validated).
        if len > 0
            && !self.find_mr(
                peer_pd,
                p.rkey,
                true,
                p.raddr,
                u64::from(len),
                access::REMOTE_WRITE,
            )
        {
            self.scratch = scratch;
            return Err((syndrome::REMOTE_ACCESS_ERR, true));
        }
        if p.opcode == wqe::opcode::RDMA_WRITE_IMM && self.rq_available(peer) == 0 {
            self.scratch = scratch;
            return Err((syndrome::RNR_RETRY_EXC_ERR, false));
        }
        if self.split_placement && len >= 2 && self.qps[qp].tail_placed != Some(pi) {
            let half = len as usize / 2;
            // SAFETY: the destination range lies inside a registered model allocation (checked
            // above for the whole write).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    scratch.as_ptr().add(half),
                    (p.raddr as *mut u8).add(half),
                    len as usize - half,
                )
            };
            self.scratch = scratch;
            self.qps[qp].tail_placed = Some(pi);
            return Ok(Transfer::TailPlaced);
        }
        if len > 0 {
            // SAFETY: the destination lies inside a registered model allocation (checked above);
            // the scratch buffer is separate memory.
            unsafe {
                std::ptr::copy_nonoverlapping(scratch.as_ptr(), p.raddr as *mut u8, len as usize)
            };
        }
        self.scratch = scratch;
        if p.opcode == wqe::opcode::RDMA_WRITE_IMM {
            let src_qp = self.qps[qp].layout.qpn;
            self.consume_recv(
                peer,
                Cqe {
                    opcode: cqe::opcode::RESP_WR_IMM,
                    imm: p.imm,
                    byte_cnt: len,
                    src_qp,
                    ..Cqe::default()
                },
            );
        }
        Ok(Transfer::Done)
    }
}

impl Model {
    /// A model with no memory and no QPs.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new protection domain.
    pub fn pd(&self) -> ModelPd {
        let mut inner = self.inner.borrow_mut();
        inner.pds.push(Vec::new());
        ModelPd(inner.pds.len() - 1)
    }

    /// Allocate `len` zeroed bytes (64-byte aligned) and register them in `pd` with `access`.
    pub fn alloc_registered(&self, pd: ModelPd, len: usize, access: u32) -> ModelMr {
        let mut inner = self.inner.borrow_mut();
        let addr = inner.alloc(len, 64).as_ptr() as u64;
        inner.next_key += 1;
        let key = inner.next_key;
        // Local and remote keys differ, so one cannot stand in for the other.
        let mr = ModelMr {
            addr,
            len: len as u64,
            lkey: key << 8 | 0x11,
            rkey: key << 8 | 0x22,
            access,
        };
        inner.pds[pd.0].push(mr);
        mr
    }

    /// Deregister the region named by `key` (local or remote): both keys stop working.
    pub fn deregister(&self, pd: ModelPd, key: u32) {
        self.inner.borrow_mut().pds[pd.0].retain(|mr| mr.lkey != key && mr.rkey != key);
    }

    /// Copy `bytes` into model memory at `addr` (panics outside an allocation).
    pub fn write(&self, addr: u64, bytes: &[u8]) {
        let inner = self.inner.borrow();
        assert!(
            inner.inside_alloc(addr, bytes.len() as u64),
            "model: write outside any allocation"
        );
        // SAFETY: inside one model allocation (checked).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    }

    /// Read `len` bytes of model memory at `addr` (panics outside an allocation).
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let inner = self.inner.borrow();
        assert!(
            inner.inside_alloc(addr, len as u64),
            "model: read outside any allocation"
        );
        // SAFETY: inside one model allocation (checked).
        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
    }

    /// Read into `out` with volatile loads (what a NIC-written control region needs).
    pub fn read_into(&self, addr: u64, out: &mut [u8]) {
        let inner = self.inner.borrow();
        assert!(
            inner.inside_alloc(addr, out.len() as u64),
            "model: read outside any allocation"
        );
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: inside one model allocation (checked).
            *b = unsafe { (addr as *const u8).add(i).read_volatile() };
        }
    }

    /// Create a QP and its CQ in `pd`, with every CQE initialised as the provider does
    /// (`op_own = 0xF0`: invalid, owner 0).
    pub fn create_qp(&self, pd: ModelPd, config: ModelQpConfig) -> ModelQp {
        assert!(config.sq_wqe_cnt.is_power_of_two() && config.sq_wqe_cnt <= MAX_SQ_BBS);
        let mut inner = self.inner.borrow_mut();
        let sq = inner.alloc(config.sq_wqe_cnt as usize * SEND_WQE_BB, 4096);
        let rq = inner.alloc((config.rq_wqe_cnt * config.rq_stride) as usize, 4096);
        let cq = inner.alloc((config.cqe_cnt * config.cqe_size) as usize, 4096);
        let qp_dbrec = inner.alloc(8, 8).cast::<u32>();
        let cq_dbrec = inner.alloc(8, 8).cast::<u32>();
        for i in 0..config.cqe_cnt as usize {
            // SAFETY: inside the CQ buffer just allocated.
            unsafe {
                cq.add(i * config.cqe_size as usize + config.cqe_size as usize - 1)
                    .write(0xF0)
            };
        }
        let id = inner.qps.len();
        let layout = QueueLayout {
            qpn: 0x100 + id as u32 * 3,
            sq_buf: sq,
            sq_wqe_cnt: config.sq_wqe_cnt,
            rq_buf: rq,
            rq_wqe_cnt: config.rq_wqe_cnt,
            rq_stride: config.rq_stride,
            qp_dbrec,
            cq_buf: cq,
            cqe_cnt: config.cqe_cnt,
            cqe_size: config.cqe_size,
            cq_dbrec,
        };
        layout.check().expect("model: QP configuration");
        inner.qps.push(QpModel {
            taken: false,
            pd: pd.0,
            peer: None,
            state: QpState::Ready,
            vanished: false,
            layout,
            bf_size: config.bf_size,
            sq_parsed: 0,
            pending: VecDeque::new(),
            sq_executed: 0,
            bf_offset: 0,
            rq_consumed: 0,
            cq_pi: 0,
            tail_placed: None,
            malformed: None,
        });
        ModelQp {
            model: self.clone(),
            id,
            layout,
            bf_size: config.bf_size,
        }
    }

    /// Connect two QPs (RC: each is the other's only peer).
    pub fn connect(&self, a: &ModelQp, b: &ModelQp) {
        let mut inner = self.inner.borrow_mut();
        inner.qps[a.id].peer = Some(b.id);
        inner.qps[b.id].peer = Some(a.id);
    }

    /// Execute the oldest queued send WQE; false when there was none.
    pub fn step(&self) -> bool {
        let mut inner = self.inner.borrow_mut();
        inner.flush_failed_receives();
        let Some((qp, pi)) = inner.order.pop_front() else {
            return false;
        };
        inner.execute(qp, pi);
        true
    }

    /// Execute everything queued.
    pub fn run_until_idle(&self) {
        while self.step() {}
    }

    /// Place every RDMA write of two or more bytes in two steps: the second half of the payload
    /// first, then (on the next step) all of it and its completions. RDMA orders no bytes within
    /// one write; this makes a reader polling the target see a torn write (as
    /// `rivet_core::sim::Fabric::set_split_placement`).
    pub fn set_split_placement(&self, on: bool) {
        self.inner.borrow_mut().split_placement = on;
    }

    /// By default a malformed WQE makes the model panic (the plugin wrote something a device would
    /// reject). With `on`, it completes in error instead, as a device reports it: a requester error
    /// CQE with `LOCAL_QP_OP_ERR` (structure) or `LOCAL_LENGTH_ERR` (sizes), then the QP fails.
    pub fn set_malformed_wqe_completes_in_error(&self, on: bool) {
        self.inner.borrow_mut().malformed_completes_in_error = on;
    }

    /// Send WQEs queued for execution.
    pub fn queued(&self) -> usize {
        self.inner.borrow().order.len()
    }

    /// Put `qp` into the error state: everything outstanding is flushed.
    pub fn fault_qp_error(&self, qp: &ModelQp) {
        self.inner.borrow_mut().fail(qp.id);
    }

    /// Make `qp`'s endpoint disappear: its peer's requests fail with `RETRY_EXC_ERR`, and nothing
    /// it posts is delivered.
    pub fn vanish(&self, qp: &ModelQp) {
        self.inner.borrow_mut().qps[qp.id].vanished = true;
    }

    /// Counters.
    pub fn stats(&self) -> ModelStats {
        self.inner.borrow().stats
    }
}

impl ModelQp {
    /// The queue layout to build a [`super::DirectQp`] on.
    pub fn layout(&self) -> QueueLayout {
        self.layout
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.layout.qpn
    }

    /// The model it belongs to.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// `len` bytes of the send queue ring from byte `offset` (wrapping), for inspection.
    pub fn sq_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        let size = self.layout.sq_wqe_cnt as usize * SEND_WQE_BB;
        (0..len)
            // SAFETY: the index is reduced modulo the ring size, inside the model's allocation.
            .map(|i| unsafe { self.layout.sq_buf.add((offset + i) % size).read() })
            .collect()
    }

    /// Overwrite send queue bytes from `offset` (wrapping): lets tests corrupt a WQE to see the
    /// model refuse it.
    pub fn poke_sq(&self, offset: usize, bytes: &[u8]) {
        let size = self.layout.sq_wqe_cnt as usize * SEND_WQE_BB;
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: the index is reduced modulo the ring size, inside the model's allocation.
            unsafe { self.layout.sq_buf.add((offset + i) % size).write(*b) };
        }
    }

    /// The CQ consumer index the device sees (the CQ doorbell record).
    pub fn cq_doorbell_record(&self) -> u32 {
        Inner::dbrec(self.layout.cq_dbrec, MLX5_CQ_SET_CI)
    }

    /// The QP doorbell record: (receive counter, send counter).
    pub fn qp_doorbell_record(&self) -> (u32, u32) {
        (
            Inner::dbrec(self.layout.qp_dbrec, MLX5_RCV_DBR),
            Inner::dbrec(self.layout.qp_dbrec, MLX5_SND_DBR),
        )
    }

    /// The raw 64 bytes of CQE slot `index`.
    pub fn cqe_bytes(&self, index: u32) -> [u8; CQE64_LEN] {
        let l = &self.layout;
        let slot = (index & (l.cqe_cnt - 1)) as usize * l.cqe_size as usize
            + (l.cqe_size as usize - CQE64_LEN);
        // SAFETY: inside the CQ buffer the model allocated.
        unsafe { l.cq_buf.add(slot).cast::<[u8; CQE64_LEN]>().read() }
    }

    /// The direct data path on this QP, ringing the model's doorbell register.
    ///
    /// Panics when called twice for one QP (the queues have one owner).
    pub fn direct_qp(&self, max_inline: usize) -> Result<DirectQp<ModelDoorbell>, DirectError> {
        self.direct_qp_with(max_inline, |d| d)
    }

    /// Like [`Self::direct_qp`], with the doorbell register wrapped by `wrap` (tests use this to
    /// tamper with what reaches the model).
    pub fn direct_qp_with<D: DoorbellRegister>(
        &self,
        max_inline: usize,
        wrap: impl FnOnce(ModelDoorbell) -> D,
    ) -> Result<DirectQp<D>, DirectError> {
        {
            let mut inner = self.model.inner.borrow_mut();
            let q = &mut inner.qps[self.id];
            assert!(!q.taken, "model: a second DirectQp for one QP");
            q.taken = true;
        }
        let doorbell = wrap(self.doorbell());
        // SAFETY: the queues and doorbell records are model allocations that live as long as any
        // `Model` clone, and the doorbell register holds one; this is the QP's only DirectQp
        // (checked above); the CQ was initialised to 0xF0 and nothing was posted yet.
        unsafe { DirectQp::new(self.layout, doorbell, max_inline) }
    }

    /// This QP's doorbell register.
    fn doorbell(&self) -> ModelDoorbell {
        ModelDoorbell {
            model: self.model.clone(),
            qp: self.id,
            bf_size: self.bf_size,
            stores: [(0, 0); 64],
            n: 0,
            started: false,
        }
    }
}

impl DoorbellRegister for ModelDoorbell {
    fn bf_size(&self) -> u32 {
        self.bf_size
    }

    fn wc_start(&mut self) {
        assert!(
            !self.started && self.n == 0,
            "model: wc_start twice without a flush"
        );
        self.started = true;
    }

    fn store64(&mut self, offset: usize, value: u64) {
        assert!(
            self.started,
            "model: MMIO store before wc_start (the doorbell-record barrier)"
        );
        let window = (2 * self.bf_size as usize).max(8);
        assert!(
            offset % 8 == 0 && offset + 8 <= window,
            "model: store at {offset} outside the register"
        );
        assert!(
            self.n < self.stores.len(),
            "model: more than 64 stores in one doorbell"
        );
        self.stores[self.n] = (offset, value);
        self.n += 1;
    }

    unsafe fn store_bb(&mut self, offset: usize, src: NonNull<u64>) {
        for word in 0..8 {
            // SAFETY: `word < 8`: inside the 64 bytes the caller promised.
            let value = unsafe { src.add(word).read_unaligned() };
            self.store64(offset + 8 * word, value);
        }
    }

    fn wc_flush(&mut self) {
        assert!(self.started, "model: flush without wc_start");
        let n = std::mem::take(&mut self.n);
        self.started = false;
        self.model
            .inner
            .borrow_mut()
            .doorbell(self.qp, &self.stores[..n]);
    }
}
