//! Forming a CollNet group: `connect(handles[], nranks, rank, listenComm)` connects this rank to
//! every other member (one p2p send comm each, through Rivet's own `connect`) and accepts one
//! p2p receive comm from each on its listen comm. The first message on every connection is a
//! hello ([`rivet_core::collnet::hello`]) naming the sender's rank and the group, so the
//! acceptor learns which rank each connection comes from; a connection that sends anything
//! else, or names another group, is dropped with a WARN line.
//!
//! The whole setup is bounded by `RIVET_HANDSHAKE_TIMEOUT_MS` (the deadline of a p2p
//! handshake): a member that never connects, or never says hello, fails the group with an error
//! naming it; a member that refuses (it died) fails it at once. On failure every connection made
//! so far is closed.
//!
//! Unsafe (opted in): writing the own hello into, and reading received hellos out of, the
//! group's scratch memory (shared with the NIC).

#![allow(unsafe_code)]

use super::scratch::Scratch;
use crate::clock;
use crate::comm::{self, RecvArgs};
use crate::error::{NetError, NetResult};
use crate::handle::Ptr;
use crate::log::{INIT_NET, info, warn};
use crate::net;
use core::ffi::c_int;
use rivet_core::collnet::hello::{HELLO_LEN, Hello};
use rivet_core::collnet::layout::group_id;
use rivet_core::data::Completed;
use rivet_core::wire::HANDLE_LEN;

/// Connections from strangers (not members, or duplicates) accepted and dropped per setup,
/// beyond which further ones are dropped without waiting for a hello.
const MAX_STRANGERS: usize = 16;

/// Bytes of the hello area: one send buffer plus a receive buffer per possible connection.
pub(crate) fn hello_area(nranks: u32) -> usize {
    (1 + nranks as usize + MAX_STRANGERS) * HELLO_LEN
}

/// An accepted connection that has not said who it is yet.
#[derive(Debug)]
struct Incoming {
    comm: Ptr,
    request: Option<Ptr>,
    /// Its hello buffer (index into the receive part of the hello area).
    buffer: usize,
}

/// Everything opened so far; closed on drop unless handed over.
#[derive(Debug, Default)]
struct Opened {
    sends: Vec<Option<Ptr>>,
    recvs: Vec<Option<Ptr>>,
    incoming: Vec<Incoming>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        for comm in self.sends.iter().flatten() {
            let _ = comm::close_send(*comm);
        }
        for comm in self.recvs.iter().flatten() {
            let _ = comm::close_recv(*comm);
        }
        for incoming in &self.incoming {
            let _ = comm::close_recv(incoming.comm);
        }
    }
}

/// Where this setup is.
struct Setup<'a> {
    nranks: u32,
    rank: u32,
    group: u64,
    dev: c_int,
    scratch: &'a Scratch,
    /// Offset of the hello area in `scratch`.
    hello_at: usize,
    mh: Ptr,
    handles: Vec<[u8; 128]>,
    hello_sends: Vec<Option<Ptr>>,
    hello_sent: Vec<bool>,
    strangers: usize,
    opened: Opened,
}

impl Setup<'_> {
    fn others(&self) -> impl Iterator<Item = u32> + use<> {
        let (n, r) = (self.nranks, self.rank);
        (0..n).filter(move |&q| q != r)
    }

    fn hello_buffer(&self, index: usize) -> usize {
        self.hello_at + (1 + index) * HELLO_LEN
    }

    /// Connect to every member and send it the hello.
    fn progress_sends(&mut self, ctx: Option<&net::NetContext>) -> NetResult<()> {
        for q in self.others() {
            let i = q as usize;
            if self.opened.sends[i].is_none() {
                let comm =
                    comm::connect(ctx, self.dev, None, &mut self.handles[i]).map_err(|e| {
                        NetError::new(
                            e.class(),
                            format!("cannot connect to rank {q} of the group: {e}"),
                        )
                    })?;
                self.opened.sends[i] = comm;
            }
            let Some(comm) = self.opened.sends[i] else {
                continue;
            };
            if self.hello_sends[i].is_none() && !self.hello_sent[i] {
                let addr = self.scratch.addr(self.hello_at);
                let request = comm::internal::isend(comm, addr as Ptr, HELLO_LEN, 0, self.mh)?;
                self.hello_sends[i] = (!request.is_null()).then_some(request);
            }
            if let Some(request) = self.hello_sends[i] {
                if comm::internal::test(request)? != Completed::Pending {
                    self.hello_sends[i] = None;
                    self.hello_sent[i] = true;
                }
            }
        }
        Ok(())
    }

    /// Accept connections and read their hellos.
    fn progress_recvs(&mut self, listen: Ptr) -> NetResult<()> {
        while let Some(comm) = comm::accept(listen)? {
            let in_use: Vec<usize> = self.opened.incoming.iter().map(|c| c.buffer).collect();
            let free = (0..self.nranks as usize + MAX_STRANGERS).find(|b| !in_use.contains(b));
            match free {
                Some(buffer) if self.strangers < MAX_STRANGERS => {
                    self.opened.incoming.push(Incoming {
                        comm,
                        request: None,
                        buffer,
                    });
                }
                _ => {
                    warn!(
                        "CollNet connect: too many connections that are not members; dropping one"
                    );
                    let _ = comm::close_recv(comm);
                }
            }
        }
        let mut index = 0;
        while index < self.opened.incoming.len() {
            match self.hello_of(index) {
                Ok(None) => index += 1,
                Ok(Some(hello)) => {
                    let incoming = self.opened.incoming.remove(index);
                    self.identify(incoming, hello);
                }
                Err(e) => {
                    let incoming = self.opened.incoming.remove(index);
                    warn!("CollNet connect: dropping a connection that sent no valid hello: {e}");
                    self.strangers += 1;
                    let _ = comm::close_recv(incoming.comm);
                }
            }
        }
        Ok(())
    }

    /// The hello on incoming connection `index`, once it arrived.
    fn hello_of(&mut self, index: usize) -> NetResult<Option<Hello>> {
        let buffer = self.hello_buffer(self.opened.incoming[index].buffer);
        let incoming = &mut self.opened.incoming[index];
        let Some(request) = incoming.request else {
            let mut args = RecvArgs {
                n: 1,
                data: [core::ptr::null_mut(); 8],
                sizes: [0; 8],
                tags: [0; 8],
                mhandles: [core::ptr::null_mut(); 8],
            };
            args.data[0] = self.scratch.addr(buffer) as Ptr;
            args.sizes[0] = HELLO_LEN;
            args.mhandles[0] = self.mh;
            let request = comm::internal::irecv(incoming.comm, &args)?;
            incoming.request = (!request.is_null()).then_some(request);
            return Ok(None);
        };
        let Completed::Done { sizes, .. } = comm::internal::test(request)? else {
            return Ok(None);
        };
        let len = (sizes[0] as usize).min(HELLO_LEN);
        // SAFETY: the receive into this hello buffer completed and nothing else uses it.
        let bytes = unsafe { self.scratch.bytes(buffer, len) };
        Hello::decode(bytes)
            .map(Some)
            .map_err(|e| NetError::remote(e.to_string()))
    }

    /// Place a connection that said hello, or drop it.
    fn identify(&mut self, incoming: Incoming, hello: Hello) {
        let recvs = &self.opened.recvs;
        match hello.admit(self.group, self.nranks, self.rank, |r| {
            recvs.get(r as usize).is_some_and(Option::is_some)
        }) {
            Ok(rank) => self.opened.recvs[rank as usize] = Some(incoming.comm),
            Err(why) => {
                warn!("CollNet connect: dropping a connection: {why}");
                self.strangers += 1;
                let _ = comm::close_recv(incoming.comm);
            }
        }
    }

    fn complete(&self) -> bool {
        self.others()
            .all(|q| self.hello_sent[q as usize] && self.opened.recvs[q as usize].is_some())
    }

    /// The members still missing, for the timeout's message.
    fn missing(&self) -> String {
        let list = |pred: &dyn Fn(u32) -> bool| {
            let v: Vec<String> = self
                .others()
                .filter(|&q| pred(q))
                .map(|q| q.to_string())
                .collect();
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        format!(
            "not connected to rank(s) {}; no hello from rank(s) {}",
            list(&|q| !self.hello_sent[q as usize]),
            list(&|q| self.opened.recvs[q as usize].is_none())
        )
    }
}

/// The group's connections, by rank.
pub(crate) struct Connections {
    /// Send comms.
    pub(crate) sends: Vec<Ptr>,
    /// Receive comms.
    pub(crate) recvs: Vec<Ptr>,
}

/// Connect rank `rank` to every member of the group the `handles` describe.
#[allow(clippy::too_many_arguments)] // the group's description and its scratch
pub(crate) fn establish(
    ctx: Ptr,
    dev: c_int,
    listen: Ptr,
    handles: Vec<[u8; 128]>,
    rank: u32,
    scratch: &Scratch,
    hello_at: usize,
    mh: Ptr,
) -> NetResult<Connections> {
    let nranks = handles.len() as u32;
    let group = group_id(handles.iter().map(|h| &h[..HANDLE_LEN]));
    let ctx = net::context(ctx)?;
    let config = net::config()?;
    let hello = Hello {
        nranks,
        rank,
        group,
    }
    .encode();
    // SAFETY: the hello area is not in use by any transfer yet.
    unsafe { scratch.bytes_mut(hello_at, HELLO_LEN) }.copy_from_slice(&hello);
    let n = nranks as usize;
    let mut setup = Setup {
        nranks,
        rank,
        group,
        dev,
        scratch,
        hello_at,
        mh,
        handles,
        hello_sends: vec![None; n],
        hello_sent: vec![false; n],
        strangers: 0,
        opened: Opened {
            sends: vec![None; n],
            recvs: vec![None; n],
            incoming: Vec::new(),
        },
    };
    let start = clock::now();
    let deadline = start + config.handshake_timeout;
    loop {
        setup.progress_sends(ctx)?;
        setup.progress_recvs(listen)?;
        if setup.complete() {
            break;
        }
        if clock::now() >= deadline {
            return Err(NetError::remote(format!(
                "CollNet connect: rank {rank} of {nranks}: the group did not form within {} \
                 (RIVET_HANDSHAKE_TIMEOUT_MS): {}",
                config.handshake_timeout,
                setup.missing()
            )));
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    info!(
        INIT_NET,
        "CollNet group {group:#x}: rank {rank} of {nranks} connected to every member in {}",
        clock::now().saturating_duration_since(start)
    );
    let opened = &mut setup.opened;
    let sends = opened
        .sends
        .iter_mut()
        .map(|c| c.take().unwrap_or(core::ptr::null_mut()))
        .collect();
    let recvs = opened
        .recvs
        .iter_mut()
        .map(|c| c.take().unwrap_or(core::ptr::null_mut()))
        .collect();
    Ok(Connections { sends, recvs })
}
