//! Multi-QP connections over real queue pairs: `rivet-core`'s `MultiSend`/`MultiRecv` drive
//! four sender and four receiver endpoints on the first discovered port, connected back to back
//! in this process (a loopback connection on one device), with `NCCL_IB_QPS_PER_CONNECTION=4`'s
//! shape, round-robin and split. Every byte, the guard bytes past each message and every size
//! are checked; each queue pair has its own GRH flow label. Needs an RDMA device: `#[ignore]`d, run inside the Soft-RoCE VM by the VM lane.
//! (The plugin's own connections still use one queue pair: the handshake does not carry a list
//! of queue pairs yet.)

use crate::backend::DataEndpoint;
use crate::backend::conn_endpoint::ConnEndpoint;
use crate::backend::endpoint::Role;
use crate::backend::endpoint::region::Region;
use crate::backend::port_device::PortDevice;
use crate::config::QpSettings;
use crate::devices;
use rivet_core::data::multi::{MultiRecv, MultiSend, QpPolicy, flow_label};
use rivet_core::data::{Completed, RecvBuf, RecvConn, RequestId, SendBuf, SendConn};
use rivet_core::sim::suite::pattern;
use rivet_verbs_ffi::sys::access;
use std::time::{Duration, Instant};

const QPS: usize = 4;
const GUARD: usize = 64;
const POISON: u8 = 0xA5;
const STALL: Duration = Duration::from_secs(20);

struct Rig {
    send: MultiSend,
    recv: MultiRecv,
    send_nics: Vec<DataEndpoint>,
    recv_nics: Vec<DataEndpoint>,
    src: Region,
    dst: Region,
}

impl Rig {
    fn new(policy: QpPolicy, len: usize) -> Self {
        let ports = devices::discover().expect("an RDMA device (run inside the VM)");
        let port = ports
            .first()
            .expect("a port")
            .open()
            .expect("open the port");
        let settings = QpSettings {
            timeout: 14,
            retry_cnt: 7,
            traffic_class: 0,
            service_level: 0,
            flow_label: 0,
        };
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        let (mut send_nics, mut recv_nics) = (Vec::new(), Vec::new());
        for _ in 0..policy.qps() {
            let s =
                <DataEndpoint as ConnEndpoint>::new(&port, Role::Sender).expect("sender endpoint");
            let r = <DataEndpoint as ConnEndpoint>::new(&port, Role::Receiver)
                .expect("receiver endpoint");
            let (s_info, r_info) = (s.local_info(&settings), r.local_info(&settings));
            // Each queue pair its own flow label (UDP source port on RoCE v2), both directions.
            let label = |local: u32, remote: u32| QpSettings {
                flow_label: flow_label(local, remote),
                ..settings
            };
            r.connect(&s_info, &label(r_info.qpn, s_info.qpn))
                .expect("receiver RTR/RTS");
            s.connect(&r_info, &label(s_info.qpn, r_info.qpn))
                .expect("sender RTR/RTS");
            sends.push(SendConn::new(r_info.inbound));
            recvs.push(RecvConn::new(s_info.inbound));
            send_nics.push(s);
            recv_nics.push(r);
        }
        let src =
            Region::new(&port.device.verbs().pd, len, access::LOCAL_WRITE).expect("source buffer");
        let dst = Region::new(
            &port.device.verbs().pd,
            len,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
        .expect("destination buffer");
        Self {
            send: MultiSend::new(sends, policy),
            recv: MultiRecv::new(recvs, policy),
            send_nics,
            recv_nics,
            src,
            dst,
        }
    }

    fn recv_buf(&self, offset: usize, len: usize) -> RecvBuf {
        RecvBuf {
            addr: self.dst.addr() + offset as u64,
            len: len as u64,
            rkey: self.dst.rkey(),
            host: false,
        }
    }

    fn send_buf(&self, offset: usize, len: usize) -> SendBuf {
        SendBuf {
            addr: self.src.addr() + offset as u64,
            len: len as u64,
            lkey: self.src.lkey(),
        }
    }

    fn irecv(&mut self, bufs: &[RecvBuf], tags: &[u32]) -> RequestId {
        let start = Instant::now();
        loop {
            if let Some(id) = self.recv.irecv(&mut self.recv_nics, bufs, tags).unwrap() {
                return id;
            }
            assert!(start.elapsed() < STALL, "irecv refused for {STALL:?}");
        }
    }

    fn isend(&mut self, buf: SendBuf, tag: u32) -> RequestId {
        let start = Instant::now();
        loop {
            if let Some(id) = self.send.isend(&mut self.send_nics, buf, tag).unwrap() {
                return id;
            }
            assert!(start.elapsed() < STALL, "isend refused for {STALL:?}");
        }
    }

    fn wait_recv(&mut self, id: RequestId) -> (usize, [u64; 8]) {
        let start = Instant::now();
        loop {
            if let Completed::Done { n, sizes } = self.recv.test(&mut self.recv_nics, id).unwrap() {
                return (usize::from(n), sizes.map(u64::from));
            }
            assert!(start.elapsed() < STALL, "receive pending for {STALL:?}");
        }
    }

    fn wait_send(&mut self, id: RequestId) -> u64 {
        let start = Instant::now();
        loop {
            if let Completed::Done { sizes, .. } = self.send.test(&mut self.send_nics, id).unwrap()
            {
                return u64::from(sizes[0]);
            }
            assert!(start.elapsed() < STALL, "send pending for {STALL:?}");
        }
    }

    /// Fill `len` bytes of message `msg` at `offset` of the source and poison the destination
    /// range (message plus guard).
    fn prepare(&mut self, msg: u64, offset: usize, len: usize, cap: usize) {
        assert!(self.src.write(offset, &pattern(msg, len)));
        assert!(self.dst.write(offset, &vec![POISON; cap + GUARD]));
    }

    fn check(&self, msg: u64, offset: usize, len: usize, cap: usize) {
        let mut got = vec![0; cap + GUARD];
        self.dst.read_volatile(offset, &mut got);
        assert!(
            got[..len] == pattern(msg, len)[..],
            "message {msg}: bytes differ"
        );
        assert!(
            got[len..].iter().all(|&b| b == POISON),
            "message {msg}: bytes written past its {len} bytes"
        );
    }
}

fn run(split: bool) {
    let policy = QpPolicy::new(QPS as i64, i64::from(split), false, 0).unwrap();
    const MAX: usize = 4 << 20;
    let mut rig = Rig::new(policy, MAX + GUARD);
    // Every size class: empty, below, at and above one 128-byte part, uneven splits, large.
    let sizes = [
        0usize,
        1,
        127,
        128,
        129,
        511,
        512,
        4095,
        65536 + 17,
        1 << 20,
        MAX,
    ];
    for (msg, &len) in sizes.iter().enumerate() {
        let msg = msg as u64;
        rig.prepare(msg, 0, len, len);
        let rid = rig.irecv(&[rig.recv_buf(0, len)], &[7]);
        let sid = rig.isend(rig.send_buf(0, len), 7);
        assert_eq!(rig.wait_send(sid), len as u64);
        let (n, got) = rig.wait_recv(rid);
        assert_eq!((n, got[0]), (1, len as u64), "message {msg}");
        rig.check(msg, 0, len, len);
    }
    // A grouped receive of three buffers, sent in another order than posted, smaller than posted.
    let lanes = [(0usize, 3000usize, 1u32), (8192, 700, 2), (16384, 5000, 3)];
    for &(offset, len, tag) in &lanes {
        rig.prepare(100 + u64::from(tag), offset, len, len + 100);
    }
    let bufs: Vec<RecvBuf> = lanes
        .iter()
        .map(|&(offset, len, _)| rig.recv_buf(offset, len + 100))
        .collect();
    let rid = rig.irecv(&bufs, &[1, 2, 3]);
    let sids: Vec<RequestId> = [2usize, 0, 1]
        .iter()
        .map(|&i| {
            let (offset, len, tag) = lanes[i];
            rig.isend(rig.send_buf(offset, len), tag)
        })
        .collect();
    for sid in sids {
        rig.wait_send(sid);
    }
    let (n, got) = rig.wait_recv(rid);
    assert_eq!(n, 3);
    for (i, &(offset, len, tag)) in lanes.iter().enumerate() {
        assert_eq!(got[i], len as u64);
        rig.check(100 + u64::from(tag), offset, len, len + 100);
    }
    // A stream with 8 in flight, long enough to wrap every queue pair's 256 slots.
    let (slot, count) = (1024usize, 1200u64);
    let mut msg = 1000u64;
    while msg < 1000 + count {
        let batch: Vec<u64> = (msg..msg + 8).collect();
        let mut ids = Vec::new();
        for (i, &m) in batch.iter().enumerate() {
            let len = (m as usize * 37) % slot;
            rig.prepare(m, i * (slot + GUARD), len, len);
            let rid = rig.irecv(&[rig.recv_buf(i * (slot + GUARD), len)], &[9]);
            ids.push((m, i, len, rid));
        }
        let sids: Vec<RequestId> = ids
            .iter()
            .map(|&(_, i, len, _)| rig.isend(rig.send_buf(i * (slot + GUARD), len), 9))
            .collect();
        for sid in sids {
            rig.wait_send(sid);
        }
        for (m, i, len, rid) in ids {
            assert_eq!(rig.wait_recv(rid).1[0], len as u64);
            rig.check(m, i * (slot + GUARD), len, len);
        }
        msg += 8;
    }
    assert_eq!(rig.send.drain(&mut rig.send_nics).unwrap(), 0);
    assert_eq!(rig.recv.drain(&mut rig.recv_nics).unwrap(), 0);
}

#[test]
#[ignore = "needs an RDMA device; run inside the Soft-RoCE VM by the VM lane"]
fn multi_qp_round_robin_on_the_device() {
    run(false);
}

#[test]
#[ignore = "needs an RDMA device; run inside the Soft-RoCE VM by the VM lane"]
fn multi_qp_split_on_the_device() {
    run(true);
}
