//! In-process tests of the exported C entry points: Rust calls the function pointers of
//! `ncclNetPlugin_v6` … `ncclNetPlugin_v12` the way NCCL does, against one simulated port
//! (`backend::sim`: `rivet_core::sim`'s fabric behind the plugin's own handles, handshake, core
//! state machines and shims). Covered: a transfer through every table, grouped receives matched
//! by tag, NULL, bogus and stale handles, sizes over the limits, and `init`/`finalize` cycles.
//!
//! The plugin's state is process-wide (its `init`, its handle tables), so the tests here run one
//! at a time (`serial`). The handshake's sockets listen on loopback.
//!
//! Unsafe (opted in): the tests call the exported `unsafe extern "C"` functions, with the
//! arguments NCCL would pass (or, on purpose, arguments it must survive).

#![allow(unsafe_code)]

use super::props::MAX_MESSAGE_BYTES;
use super::tables::{
    ncclNetPlugin_v6, ncclNetPlugin_v7, ncclNetPlugin_v8, ncclNetPlugin_v9, ncclNetPlugin_v10,
    ncclNetPlugin_v11, ncclNetPlugin_v12,
};
use crate::backend::sim;
use crate::sys::*;
use core::ffi::{CStr, c_int, c_void};
use core::ptr::null_mut;
use std::mem::MaybeUninit;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

type Ptr = *mut c_void;

/// One test at a time: the plugin's state is process-wide.
pub(super) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    sim::install();
    guard
}

/// How long any one wait (handshake, transfer) may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// `isend(comm, data, size, tag, mhandle, &request)`.
type IsendFn = dyn Fn(Ptr, Ptr, usize, c_int, Ptr, *mut Ptr) -> NcclResult;
/// `irecv(comm, n, data, sizes, tags, mhandles, &request)`.
type IrecvFn =
    dyn Fn(Ptr, c_int, *mut Ptr, *mut usize, *mut c_int, *mut Ptr, *mut Ptr) -> NcclResult;

/// A version's entry points with one Rust signature (`size_t` sizes; the `int` versions
/// convert), so one test body drives every table.
struct Api {
    version: u32,
    /// `init`; returns the v11+ context (NULL before v11).
    init: Box<dyn Fn() -> (NcclResult, Ptr)>,
    finalize: Box<dyn Fn(Ptr) -> NcclResult>,
    devices: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    /// The device name `getProperties` reports.
    name_of: Box<dyn Fn(c_int) -> (NcclResult, String)>,
    listen: Box<dyn Fn(Ptr, c_int, Ptr, *mut Ptr) -> NcclResult>,
    connect: Box<dyn Fn(Ptr, c_int, Ptr, *mut Ptr) -> NcclResult>,
    accept: Box<dyn Fn(Ptr, *mut Ptr) -> NcclResult>,
    reg_mr: Box<dyn Fn(Ptr, Ptr, usize, *mut Ptr) -> NcclResult>,
    dereg_mr: unsafe extern "C" fn(Ptr, Ptr) -> NcclResult,
    isend: Box<IsendFn>,
    irecv: Box<IrecvFn>,
    test: unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> NcclResult,
    close_send: unsafe extern "C" fn(Ptr) -> NcclResult,
    close_recv: unsafe extern "C" fn(Ptr) -> NcclResult,
    close_listen: unsafe extern "C" fn(Ptr) -> NcclResult,
}

/// `size` as the `int` of the v6 – v8 entries (sizes over `INT_MAX` become -1, which they refuse).
fn int_size(size: usize) -> c_int {
    c_int::try_from(size).unwrap_or(-1)
}

/// The name in a property struct the plugin filled.
fn name_in(rc: NcclResult, name: *mut core::ffi::c_char) -> (NcclResult, String) {
    if rc != NCCL_SUCCESS || name.is_null() {
        return (rc, String::new());
    }
    // SAFETY: a successful getProperties points `name` at a NUL-terminated string the plugin
    // keeps for the life of its port.
    (
        rc,
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The entry points both table shapes before v9 share (`int` sizes), less `connect`/`accept`.
macro_rules! int_sized_api {
    ($t:expr, $version:expr, $props:ty, connect: $connect:expr, accept: $accept:expr, reg_mr: $reg:expr) => {{
        let t = &$t.0;
        let (init, props, listen) = (
            t.init.unwrap(),
            t.get_properties.unwrap(),
            t.listen.unwrap(),
        );
        let (isend, irecv) = (t.isend.unwrap(), t.irecv.unwrap());
        Api {
            version: $version,
            // SAFETY: (this and every closure below) the table's own entries, called with the arguments
            // NCCL passes; pointers are the test's live locals or deliberately bad handles,
            // which the handle layer checks without dereferencing.
            init: Box::new(move || (unsafe { init(None) }, null_mut())),
            finalize: Box::new(|_| NCCL_SUCCESS),
            devices: t.devices.unwrap(),
            name_of: Box::new(move |dev| {
                let mut p = MaybeUninit::<$props>::zeroed();
                // SAFETY: as above; `p` is valid for a write of the version's struct.
                let rc = unsafe { props(dev, p.as_mut_ptr()) };
                // SAFETY: zeroed is a valid bit pattern for this C struct of integers and
                // pointers; the plugin overwrote it on success.
                name_in(rc, unsafe { p.assume_init() }.name)
            }),
            // SAFETY: as above.
            listen: Box::new(move |_, dev, h, out| unsafe { listen(dev, h, out) }),
            connect: Box::new($connect),
            accept: Box::new($accept),
            reg_mr: Box::new($reg),
            dereg_mr: t.dereg_mr.unwrap(),
            // SAFETY: as above.
            isend: Box::new(move |c, d, s, tag, mh, req| unsafe {
                isend(c, d, int_size(s), tag, mh, req)
            }),
            irecv: Box::new(move |c, n, d, sizes, tags, mhs, req| {
                let mut ints = [0 as c_int; 16];
                if !sizes.is_null() {
                    for (i, int) in ints.iter_mut().enumerate().take(n.clamp(0, 16) as usize) {
                        // SAFETY: the caller's `sizes` holds `n` elements.
                        *int = int_size(unsafe { *sizes.add(i) });
                    }
                }
                let sizes = if sizes.is_null() {
                    null_mut()
                } else {
                    ints.as_mut_ptr()
                };
                // SAFETY: as above.
                unsafe { irecv(c, n, d, sizes, tags, mhs, req) }
            }),
            test: t.test.unwrap(),
            close_send: t.close_send.unwrap(),
            close_recv: t.close_recv.unwrap(),
            close_listen: t.close_listen.unwrap(),
        }
    }};
}

fn api_v6() -> Api {
    let t = &ncclNetPlugin_v6.0;
    let (connect, accept, reg) = (t.connect.unwrap(), t.accept.unwrap(), t.reg_mr.unwrap());
    int_sized_api!(ncclNetPlugin_v6, 6, NcclNetPropertiesV6,
        // SAFETY: as in `int_sized_api`.
        connect: move |_, dev, h, out| unsafe { connect(dev, h, out) },
        // SAFETY: as in `int_sized_api`.
        accept: move |l, out| unsafe { accept(l, out) },
        // SAFETY: as in `int_sized_api`.
        reg_mr: move |c, d, s, out| unsafe { reg(c, d, int_size(s), NCCL_PTR_HOST, out) })
}

/// v7 and v8: v6's entries plus the device-handle out-pointers; v8's `regMr` takes a `size_t`.
macro_rules! device_handle_api {
    ($t:expr, $version:expr, $props:ty, reg_size: $reg_size:expr) => {{
        let t = &$t.0;
        let (connect, accept, reg) = (t.connect.unwrap(), t.accept.unwrap(), t.reg_mr.unwrap());
        let reg_size = $reg_size;
        int_sized_api!($t, $version, $props,
            // SAFETY: as in `int_sized_api`.
            connect: move |_, dev, h, out| unsafe { connect(dev, h, out, &mut null_mut()) },
            // SAFETY: as in `int_sized_api`.
            accept: move |l, out| unsafe { accept(l, out, &mut null_mut()) },
            // SAFETY: as in `int_sized_api`.
            reg_mr: move |c, d, s, out| unsafe { reg(c, d, reg_size(s), NCCL_PTR_HOST, out) })
    }};
}

fn api_v7() -> Api {
    device_handle_api!(ncclNetPlugin_v7, 7, NcclNetPropertiesV7, reg_size: int_size)
}

fn api_v8() -> Api {
    device_handle_api!(ncclNetPlugin_v8, 8, NcclNetPropertiesV8, reg_size: |s: usize| s)
}

/// v9 and v10 (`size_t` sizes, no context); `init` and `connect` differ and are passed in.
macro_rules! sized_api {
    ($t:expr, $version:expr, init: $init:expr, connect: $connect:expr, isend: $isend:expr, irecv: $irecv:expr) => {{
        let t = &$t.0;
        let (props, listen, accept, reg) = (
            t.get_properties.unwrap(),
            t.listen.unwrap(),
            t.accept.unwrap(),
            t.reg_mr.unwrap(),
        );
        Api {
            version: $version,
            init: Box::new($init),
            finalize: Box::new(|_| NCCL_SUCCESS),
            devices: t.devices.unwrap(),
            name_of: Box::new(move |dev| {
                let mut p = MaybeUninit::<NcclNetPropertiesV9>::zeroed();
                // SAFETY: as in `int_sized_api`.
                let rc = unsafe { props(dev, p.as_mut_ptr()) };
                // SAFETY: as in `int_sized_api`.
                name_in(rc, unsafe { p.assume_init() }.name)
            }),
            // SAFETY: as in `int_sized_api`.
            listen: Box::new(move |_, dev, h, out| unsafe { listen(dev, h, out) }),
            connect: Box::new($connect),
            // SAFETY: as in `int_sized_api`.
            accept: Box::new(move |l, out| unsafe { accept(l, out, &mut null_mut()) }),
            // SAFETY: as in `int_sized_api`.
            reg_mr: Box::new(move |c, d, s, out| unsafe { reg(c, d, s, NCCL_PTR_HOST, out) }),
            dereg_mr: t.dereg_mr.unwrap(),
            isend: Box::new($isend),
            irecv: Box::new($irecv),
            test: t.test.unwrap(),
            close_send: t.close_send.unwrap(),
            close_recv: t.close_recv.unwrap(),
            close_listen: t.close_listen.unwrap(),
        }
    }};
}

fn api_v9() -> Api {
    let t = &ncclNetPlugin_v9.0;
    let (init, connect, isend, irecv) = (
        t.init.unwrap(),
        t.connect.unwrap(),
        t.isend.unwrap(),
        t.irecv.unwrap(),
    );
    sized_api!(ncclNetPlugin_v9, 9,
        // SAFETY: as in `int_sized_api`.
        init: move || (unsafe { init(None) }, null_mut()),
        // SAFETY: as in `int_sized_api`.
        connect: move |_, dev, h, out| unsafe { connect(dev, h, out, &mut null_mut()) },
        // SAFETY: as in `int_sized_api`.
        isend: move |c, d, s, tag, mh, req| unsafe { isend(c, d, s, tag, mh, req) },
        // SAFETY: as in `int_sized_api`.
        irecv: move |c, n, d, s, tags, mhs, req| unsafe { irecv(c, n, d, s, tags, mhs, req) })
}

fn api_v10() -> Api {
    let t = &ncclNetPlugin_v10.0;
    let (init, connect, isend, irecv) = (
        t.init.unwrap(),
        t.connect.unwrap(),
        t.isend.unwrap(),
        t.irecv.unwrap(),
    );
    sized_api!(ncclNetPlugin_v10, 10,
    // SAFETY: as in `int_sized_api`.
    init: move || (unsafe { init(None, None) }, null_mut()),
    // SAFETY: as in `int_sized_api`; a NULL config means "no traffic class".
    connect: move |_, dev, h, out| unsafe { connect(dev, null_mut(), h, out, &mut null_mut()) },
    // SAFETY: as in `int_sized_api`; no profiler, so no phandle.
    isend: move |c, d, s, tag, mh, req| unsafe { isend(c, d, s, tag, mh, null_mut(), req) },
    // SAFETY: as in `int_sized_api`.
    irecv: move |c, n, d, s, tags, mhs, req| unsafe {
        irecv(c, n, d, s, tags, mhs, null_mut(), req)
    })
}

/// v11 and v12: a context from `init`, passed to `listen`/`connect`, ended by `finalize`.
macro_rules! ctx_api {
    ($t:expr, $version:expr, $props:ty) => {{
        let t = &$t.0;
        let (init, finalize, props, listen, connect, accept, reg, isend, irecv) = (
            t.init.unwrap(),
            t.finalize.unwrap(),
            t.get_properties.unwrap(),
            t.listen.unwrap(),
            t.connect.unwrap(),
            t.accept.unwrap(),
            t.reg_mr.unwrap(),
            t.isend.unwrap(),
            t.irecv.unwrap(),
        );
        Api {
            version: $version,
            init: Box::new(move || {
                let mut ctx = null_mut();
                // SAFETY: as in `int_sized_api`; NULL config, logger and profiler are allowed.
                let rc = unsafe { init(&mut ctx, 0x5157, null_mut(), None, None) };
                (rc, ctx)
            }),
            // SAFETY: as in `int_sized_api`.
            finalize: Box::new(move |ctx| unsafe { finalize(ctx) }),
            devices: t.devices.unwrap(),
            name_of: Box::new(move |dev| {
                let mut p = MaybeUninit::<$props>::zeroed();
                // SAFETY: as in `int_sized_api`.
                let rc = unsafe { props(dev, p.as_mut_ptr()) };
                // SAFETY: as in `int_sized_api`.
                name_in(rc, unsafe { p.assume_init() }.name)
            }),
            // SAFETY: as in `int_sized_api`.
            listen: Box::new(move |ctx, dev, h, out| unsafe { listen(ctx, dev, h, out) }),
            // SAFETY: as in `int_sized_api`.
            connect: Box::new(move |ctx, dev, h, out| unsafe {
                connect(ctx, dev, h, out, &mut null_mut())
            }),
            // SAFETY: as in `int_sized_api`.
            accept: Box::new(move |l, out| unsafe { accept(l, out, &mut null_mut()) }),
            // SAFETY: as in `int_sized_api`.
            reg_mr: Box::new(move |c, d, s, out| unsafe { reg(c, d, s, NCCL_PTR_HOST, out) }),
            dereg_mr: t.dereg_mr.unwrap(),
            // SAFETY: as in `int_sized_api`.
            isend: Box::new(move |c, d, s, tag, mh, req| unsafe {
                isend(c, d, s, tag, mh, null_mut(), req)
            }),
            // SAFETY: as in `int_sized_api`.
            irecv: Box::new(move |c, n, d, s, tags, mhs, req| unsafe {
                irecv(c, n, d, s, tags, mhs, null_mut(), req)
            }),
            test: t.test.unwrap(),
            close_send: t.close_send.unwrap(),
            close_recv: t.close_recv.unwrap(),
            close_listen: t.close_listen.unwrap(),
        }
    }};
}

fn api_v11() -> Api {
    ctx_api!(ncclNetPlugin_v11, 11, NcclNetPropertiesV11)
}

fn api_v12() -> Api {
    ctx_api!(ncclNetPlugin_v12, 12, NcclNetPropertiesV12)
}

fn every_api() -> Vec<Api> {
    vec![
        api_v6(),
        api_v7(),
        api_v8(),
        api_v9(),
        api_v10(),
        api_v11(),
        api_v12(),
    ]
}

impl Api {
    /// `devices`, checked to succeed.
    fn device_count(&self) -> c_int {
        let mut n = -1;
        // SAFETY: `n` is a live `int`.
        assert_eq!(unsafe { (self.devices)(&mut n) }, NCCL_SUCCESS);
        n
    }

    /// `test`, returning (rc, done, sizes).
    fn test(&self, req: Ptr) -> (NcclResult, bool, [c_int; 8]) {
        let (mut done, mut sizes) = (0, [-1 as c_int; 8]);
        // SAFETY: `done` and `sizes` are live; `req` is checked by the handle layer.
        let rc = unsafe { (self.test)(req, &mut done, sizes.as_mut_ptr()) };
        (rc, done != 0, sizes)
    }

    /// Call `test` until the request is done; its per-buffer sizes.
    fn wait(&self, req: Ptr) -> [c_int; 8] {
        let start = Instant::now();
        loop {
            let (rc, done, sizes) = self.test(req);
            assert_eq!(rc, NCCL_SUCCESS, "v{}: test failed", self.version);
            if done {
                return sizes;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "v{}: request never completed",
                self.version
            );
        }
    }

    /// `regMr` of `buf`, checked to succeed.
    fn register(&self, comm: Ptr, buf: &mut [u8]) -> Ptr {
        let mut mh = null_mut();
        let rc = (self.reg_mr)(comm, buf.as_mut_ptr().cast(), buf.len(), &mut mh);
        assert_eq!(rc, NCCL_SUCCESS, "v{}: regMr", self.version);
        assert!(!mh.is_null());
        mh
    }

    /// `isend` of `buf` (all of it), checked to be accepted; the request.
    fn send(&self, comm: Ptr, buf: &mut [u8], tag: c_int, mh: Ptr) -> Ptr {
        let start = Instant::now();
        loop {
            let mut req = null_mut();
            let rc = (self.isend)(comm, buf.as_mut_ptr().cast(), buf.len(), tag, mh, &mut req);
            assert_eq!(rc, NCCL_SUCCESS, "v{}: isend", self.version);
            if !req.is_null() {
                return req;
            }
            // NULL: not now (no clear-to-send yet); NCCL calls again.
            assert!(
                start.elapsed() < PATIENCE,
                "v{}: isend never accepted",
                self.version
            );
        }
    }

    /// `irecv` into `bufs` with `tags`, checked to be accepted; the request.
    fn recv(&self, comm: Ptr, bufs: &mut [&mut [u8]], tags: &[c_int], mhs: &[Ptr]) -> Ptr {
        let n = bufs.len();
        let mut data: Vec<Ptr> = bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        let (mut tags, mut mhs) = (tags.to_vec(), mhs.to_vec());
        let start = Instant::now();
        loop {
            let mut req = null_mut();
            let rc = (self.irecv)(
                comm,
                n as c_int,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            );
            assert_eq!(rc, NCCL_SUCCESS, "v{}: irecv", self.version);
            if !req.is_null() {
                return req;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "v{}: irecv never accepted",
                self.version
            );
        }
    }
}

/// A connected pair on device 0: (listen comm, send comm, receive comm).
fn connect_pair(api: &Api, ctx: Ptr) -> (Ptr, Ptr, Ptr) {
    connect_pair_on(api, ctx, 0)
}

/// A connected pair on device `dev`.
fn connect_pair_on(api: &Api, ctx: Ptr, dev: c_int) -> (Ptr, Ptr, Ptr) {
    let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let mut listen = null_mut();
    let rc = (api.listen)(ctx, dev, handle.as_mut_ptr().cast(), &mut listen);
    assert_eq!(rc, NCCL_SUCCESS, "v{}: listen", api.version);
    let listening = rivet_core::wire::ListenHandle::decode(&handle).expect("a Rivet listen handle");
    assert!(
        listening.addr.ip().is_loopback(),
        "the tests' sockets stay on loopback, not {}",
        listening.addr
    );
    let (mut send, mut recv): (Ptr, Ptr) = (null_mut(), null_mut());
    let start = Instant::now();
    // NCCL's pattern: both calls are non-blocking and repeated until each returns a comm.
    while send.is_null() || recv.is_null() {
        if send.is_null() {
            let rc = (api.connect)(ctx, dev, handle.as_mut_ptr().cast(), &mut send);
            assert_eq!(rc, NCCL_SUCCESS, "v{}: connect", api.version);
        }
        if recv.is_null() {
            let rc = (api.accept)(listen, &mut recv);
            assert_eq!(rc, NCCL_SUCCESS, "v{}: accept", api.version);
        }
        assert!(
            start.elapsed() < PATIENCE,
            "v{}: handshake never finished",
            api.version
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    (listen, send, recv)
}

/// `init` of the v12 table and a pair connected on its context: (table, context, pair).
fn v12_with_a_pair() -> (Api, Ptr, (Ptr, Ptr, Ptr)) {
    let api = api_v12();
    let (rc, ctx) = (api.init)();
    assert_eq!(rc, NCCL_SUCCESS, "init");
    let pair = connect_pair(&api, ctx);
    (api, ctx, pair)
}

/// Close the pair, then `finalize` its context, checking each succeeds.
fn close_pair_and_finalize(api: &Api, pair: (Ptr, Ptr, Ptr), ctx: Ptr) {
    close_pair(api, pair);
    assert_eq!((api.finalize)(ctx), NCCL_SUCCESS, "finalize");
}

/// Close what `connect_pair` opened, checking each close succeeds.
fn close_pair(api: &Api, (listen, send, recv): (Ptr, Ptr, Ptr)) {
    // SAFETY: live comms from `connect_pair`.
    unsafe {
        assert_eq!((api.close_send)(send), NCCL_SUCCESS);
        assert_eq!((api.close_recv)(recv), NCCL_SUCCESS);
        assert_eq!((api.close_listen)(listen), NCCL_SUCCESS);
    }
}

/// `len` bytes that differ from message to message.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

impl Api {
    /// One `len`-byte message from `send` to `recv` under `tag`, into a buffer 16 bytes longer:
    /// both sizes reported, every byte arrived, nothing written past it. Registers and
    /// deregisters its own buffers.
    fn transfer(&self, (send, recv): (Ptr, Ptr), seed: u8, len: usize, tag: c_int) {
        let v = self.version;
        let mut out = pattern(seed, len);
        let mut into = vec![0u8; len + 16];
        let (smh, rmh) = (
            self.register(send, &mut out),
            self.register(recv, &mut into),
        );
        let rreq = self.recv(recv, &mut [&mut into[..]], &[tag], &[rmh]);
        let sreq = self.send(send, &mut out, tag, smh);
        assert_eq!(self.wait(sreq)[0], len as c_int, "v{v}: send size");
        assert_eq!(self.wait(rreq)[0], len as c_int, "v{v}: received size");
        assert!(into[..len] == out[..], "v{v}: {len} bytes arrived changed");
        assert!(
            into[len..].iter().all(|&b| b == 0),
            "v{v}: wrote past the message"
        );
        // SAFETY: live comms and the handles just registered.
        unsafe {
            assert_eq!((self.dereg_mr)(send, smh), NCCL_SUCCESS);
            assert_eq!((self.dereg_mr)(recv, rmh), NCCL_SUCCESS);
        }
    }

    fn name_of(&self, dev: c_int) -> (NcclResult, String) {
        (self.name_of)(dev)
    }
}

#[test]
fn every_table_moves_bytes_between_two_comms() {
    let _serial = serial();
    for api in every_api() {
        let (rc, ctx) = (api.init)();
        assert_eq!(rc, NCCL_SUCCESS, "v{}: init", api.version);
        assert_eq!(api.device_count(), 1, "v{}", api.version);
        assert_eq!(api.name_of(0), (NCCL_SUCCESS, sim::PORT_NAME.to_owned()));
        let pair = connect_pair(&api, ctx);
        let (_, send, recv) = pair;
        // Inline-sized, single-write and multi-kilobyte messages.
        for (i, len) in [8usize, 4000, 300_000].into_iter().enumerate() {
            api.transfer((send, recv), api.version as u8 + i as u8, len, 5);
        }
        close_pair(&api, pair);
        assert_eq!(
            (api.finalize)(ctx),
            NCCL_SUCCESS,
            "v{}: finalize",
            api.version
        );
    }
}

/// NCCL may call `isend` before the peer posted its receive: with the eager path (data protocol 4,
/// the default) a host-memory send up to the threshold is taken at once, through the C entry
/// points, and lands byte-exact in the receive posted afterwards, in order; a larger one still
/// waits for its receive's entry (NULL request).
#[test]
fn sends_before_their_receives_go_eager_through_the_c_abi() {
    let _serial = serial();
    let (api, ctx, pair) = v12_with_a_pair();
    let (_, send, recv) = pair;
    let lens = [8usize, 4000, 8192];
    let mut outs: Vec<Vec<u8>> = (0..3).map(|i| pattern(60 + i as u8, lens[i])).collect();
    let smhs: Vec<Ptr> = outs.iter_mut().map(|b| api.register(send, b)).collect();
    let mut sreqs = Vec::new();
    for (i, out) in outs.iter_mut().enumerate() {
        let mut req = null_mut();
        let rc = (api.isend)(
            send,
            out.as_mut_ptr().cast(),
            out.len(),
            3,
            smhs[i],
            &mut req,
        );
        assert_eq!(rc, NCCL_SUCCESS, "isend {i}");
        assert!(
            !req.is_null(),
            "send {i} ({} B) goes eager, no receive posted",
            lens[i]
        );
        sreqs.push(req);
    }
    let mut big = pattern(70, 8193);
    let big_mh = api.register(send, &mut big);
    let mut req = null_mut();
    let rc = (api.isend)(
        send,
        big.as_mut_ptr().cast(),
        big.len(),
        3,
        big_mh,
        &mut req,
    );
    assert_eq!(rc, NCCL_SUCCESS, "isend above the threshold");
    assert!(
        req.is_null(),
        "above the threshold a send waits for its receive's entry"
    );
    let mut ins: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 9000]).collect();
    let rmhs: Vec<Ptr> = ins.iter_mut().map(|b| api.register(recv, b)).collect();
    let mut rreqs = Vec::new();
    for (i, buf) in ins.iter_mut().enumerate() {
        rreqs.push(api.recv(recv, &mut [&mut buf[..]], &[3], &[rmhs[i]]));
    }
    let big_req = api.send(send, &mut big, 3, big_mh);
    for (i, rreq) in rreqs.into_iter().enumerate() {
        let len = if i < 3 { lens[i] } else { big.len() };
        assert_eq!(api.wait(rreq)[0], len as c_int, "receive {i}");
    }
    for (i, req) in sreqs.into_iter().enumerate() {
        assert_eq!(api.wait(req)[0], lens[i] as c_int, "send {i}");
    }
    assert_eq!(api.wait(big_req)[0], big.len() as c_int);
    for i in 0..3 {
        assert!(
            ins[i][..lens[i]] == outs[i][..],
            "message {i} arrived changed"
        );
        assert!(
            ins[i][lens[i]..].iter().all(|&b| b == 0),
            "message {i}: written past it"
        );
    }
    assert!(
        ins[3][..big.len()] == big[..],
        "the large message arrived changed"
    );
    // SAFETY: live comms and the handles registered above.
    unsafe {
        for (mh, comm) in smhs.iter().map(|m| (*m, send)).chain([(big_mh, send)]) {
            assert_eq!((api.dereg_mr)(comm, mh), NCCL_SUCCESS);
        }
        for mh in rmhs {
            assert_eq!((api.dereg_mr)(recv, mh), NCCL_SUCCESS);
        }
    }
    close_pair_and_finalize(&api, pair, ctx);
}

#[test]
fn a_grouped_receive_matches_each_buffer_by_tag() {
    let _serial = serial();
    let (api, ctx, pair) = v12_with_a_pair();
    let (_, send, recv) = pair;
    // Three buffers, tags 7, 8, 9; sent in the order 9, 7, 8 with different sizes, one empty.
    let lens = [100usize, 0, 5000];
    let mut outs: Vec<Vec<u8>> = (0..3).map(|i| pattern(40 + i as u8, lens[i])).collect();
    let mut ins: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; 6000]).collect();
    let rmhs: Vec<Ptr> = ins.iter_mut().map(|b| api.register(recv, b)).collect();
    let smhs: Vec<Ptr> = outs
        .iter_mut()
        .map(|b| {
            // A zero-length buffer still needs a registration; give it one byte.
            if b.is_empty() {
                api.register(send, &mut [0u8; 1][..0])
            } else {
                api.register(send, b)
            }
        })
        .collect();
    let rreq = {
        let mut bufs: Vec<&mut [u8]> = ins.iter_mut().map(|b| &mut b[..]).collect();
        api.recv(recv, &mut bufs, &[7, 8, 9], &rmhs)
    };
    let mut sreqs = Vec::new();
    for i in [2usize, 0, 1] {
        sreqs.push((i, api.send(send, &mut outs[i], 7 + i as c_int, smhs[i])));
    }
    for (i, req) in sreqs {
        assert_eq!(api.wait(req)[0], lens[i] as c_int);
    }
    let sizes = api.wait(rreq);
    assert_eq!(
        &sizes[..3],
        &[100, 0, 5000],
        "each buffer's size, in irecv order"
    );
    for i in 0..3 {
        assert!(
            ins[i][..lens[i]] == outs[i][..],
            "buffer {i} (tag {})",
            7 + i
        );
        assert!(ins[i][lens[i]..].iter().all(|&b| b == 0));
    }
    close_pair_and_finalize(&api, pair, ctx);
}

#[test]
fn null_and_bogus_handles_are_refused_without_a_crash() {
    let _serial = serial();
    let api = api_v12();
    let t = &ncclNetPlugin_v12.0;
    let (rc, ctx) = (api.init)();
    assert_eq!(rc, NCCL_SUCCESS);
    let bogus = [
        null_mut(),
        0xdead_beef_usize as Ptr,
        // Looks like a handle of every table (high bits set, low bits a small index).
        0x0c7c_0000_0000_0001_usize as Ptr,
        (&raw const ncclNetPlugin_v12).cast_mut().cast(),
    ];
    let mut buf = [0u8; 64];
    let data: Ptr = buf.as_mut_ptr().cast();
    for h in bogus {
        let mut out = null_mut();
        let mut size = 64usize;
        let mut tag = 0;
        let mut d = data;
        let mut mh = h;
        // SAFETY: every pointer argument but the handle under test is a live local.
        unsafe {
            assert_ne!(
                (api.isend)(h, data, 64, 0, h, &mut out),
                NCCL_SUCCESS,
                "isend {h:p}"
            );
            assert_ne!(
                (api.irecv)(h, 1, &mut d, &mut size, &mut tag, &mut mh, &mut out),
                NCCL_SUCCESS,
                "irecv {h:p}"
            );
            assert_ne!(api.test(h).0, NCCL_SUCCESS, "test {h:p}");
            assert_ne!(
                (api.reg_mr)(h, data, 64, &mut out),
                NCCL_SUCCESS,
                "regMr {h:p}"
            );
            assert_ne!((api.dereg_mr)(h, h), NCCL_SUCCESS, "deregMr {h:p}");
            assert_ne!((api.accept)(h, &mut out), NCCL_SUCCESS, "accept {h:p}");
            assert_ne!((api.close_send)(h), NCCL_SUCCESS, "closeSend {h:p}");
            assert_ne!((api.close_recv)(h), NCCL_SUCCESS, "closeRecv {h:p}");
            assert_ne!((api.close_listen)(h), NCCL_SUCCESS, "closeListen {h:p}");
            let mut flush = null_mut();
            assert_ne!(
                (t.iflush.unwrap())(h, 1, &mut d, null_mut(), &mut mh, &mut flush),
                NCCL_SUCCESS,
                "iflush {h:p}"
            );
            if !h.is_null() {
                // NULL is the v6 – v10 "no context" and accepted there.
                assert_ne!((api.finalize)(h), NCCL_SUCCESS, "finalize {h:p}");
                assert_ne!(
                    (t.set_net_attr.unwrap())(h, null_mut()),
                    NCCL_SUCCESS,
                    "setNetAttr {h:p}"
                );
                let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
                assert_ne!(
                    (api.listen)(h, 0, handle.as_mut_ptr().cast(), &mut out),
                    NCCL_SUCCESS,
                    "listen on context {h:p}"
                );
            }
        }
    }
    // NULL out-pointers and arguments of a live pair.
    let pair = connect_pair(&api, ctx);
    let (listen, send, recv) = pair;
    let mh = api.register(send, &mut buf);
    // SAFETY: live comms; the NULL out-pointers are what is under test.
    unsafe {
        assert_ne!((api.devices)(null_mut()), NCCL_SUCCESS, "devices(NULL)");
        assert_ne!((api.isend)(send, data, 64, 0, mh, null_mut()), NCCL_SUCCESS);
        assert_ne!((api.reg_mr)(send, data, 64, null_mut()), NCCL_SUCCESS);
        assert_ne!(
            (api.reg_mr)(send, null_mut(), 64, &mut null_mut()),
            NCCL_SUCCESS
        );
        assert_ne!((api.accept)(listen, null_mut()), NCCL_SUCCESS);
        assert_ne!((api.test)(null_mut(), null_mut(), null_mut()), NCCL_SUCCESS);
        let mut out = null_mut();
        assert_ne!(
            (api.connect)(ctx, 0, null_mut(), &mut out),
            NCCL_SUCCESS,
            "NULL handle"
        );
        assert_ne!(
            (api.irecv)(
                recv,
                1,
                null_mut(),
                null_mut(),
                null_mut(),
                null_mut(),
                &mut out
            ),
            NCCL_SUCCESS,
            "NULL irecv arrays"
        );
        // A send comm is not a receive comm, nor the other way round.
        let mut d = data;
        let (mut size, mut tag, mut m) = (64usize, 0, mh);
        assert_ne!(
            (api.irecv)(send, 1, &mut d, &mut size, &mut tag, &mut m, &mut out),
            NCCL_SUCCESS
        );
        assert_ne!((api.isend)(recv, data, 64, 0, mh, &mut out), NCCL_SUCCESS);
        assert_ne!((api.close_recv)(send), NCCL_SUCCESS);
        assert_ne!((api.close_send)(recv), NCCL_SUCCESS);
        // A memory handle used as a comm, and a comm as a memory handle.
        assert_ne!((api.isend)(mh, data, 64, 0, send, &mut out), NCCL_SUCCESS);
        // The property query of a device that does not exist.
        assert_ne!(api.name_of(1).0, NCCL_SUCCESS);
        assert_ne!(api.name_of(-1).0, NCCL_SUCCESS);
        assert_eq!((api.dereg_mr)(send, mh), NCCL_SUCCESS);
    }
    // The pair still works after all that.
    api.transfer((send, recv), 9, 64, 1);
    close_pair_and_finalize(&api, pair, ctx);
}

#[test]
fn stale_handles_are_refused_after_close_dereg_test_and_finalize() {
    let _serial = serial();
    let (api, ctx, pair) = v12_with_a_pair();
    let (listen, send, recv) = pair;
    let mut out = pattern(3, 256);
    let mut into = [0u8; 256];
    let (smh, rmh) = (api.register(send, &mut out), api.register(recv, &mut into));
    let rreq = api.recv(recv, &mut [&mut into[..]], &[2], &[rmh]);
    let sreq = api.send(send, &mut out, 2, smh);
    api.wait(sreq);
    api.wait(rreq);
    // A request is gone once `test` reported it done.
    assert_ne!(api.test(sreq).0, NCCL_SUCCESS, "test of a finished send");
    assert_ne!(api.test(rreq).0, NCCL_SUCCESS, "test of a finished receive");
    // A deregistered memory handle.
    // SAFETY: live comms; the stale handles are what is under test.
    unsafe {
        assert_eq!((api.dereg_mr)(send, smh), NCCL_SUCCESS);
        assert_ne!((api.dereg_mr)(send, smh), NCCL_SUCCESS, "deregMr twice");
        let mut req = null_mut();
        assert_ne!(
            (api.isend)(send, out.as_mut_ptr().cast(), 256, 2, smh, &mut req),
            NCCL_SUCCESS
        );
        // A registration belongs to the comm's port only through a comm: dereg via the wrong
        // kind of handle fails, the right one works.
        assert_ne!((api.dereg_mr)(rmh, rmh), NCCL_SUCCESS);
        assert_eq!((api.dereg_mr)(recv, rmh), NCCL_SUCCESS);
    }
    close_pair(&api, pair);
    // SAFETY: the handles are stale; the handle layer must see it.
    unsafe {
        let mut req = null_mut();
        assert_ne!((api.close_send)(send), NCCL_SUCCESS, "closeSend twice");
        assert_ne!((api.close_recv)(recv), NCCL_SUCCESS, "closeRecv twice");
        assert_ne!(
            (api.close_listen)(listen),
            NCCL_SUCCESS,
            "closeListen twice"
        );
        assert_ne!(
            (api.isend)(send, out.as_mut_ptr().cast(), 8, 0, smh, &mut req),
            NCCL_SUCCESS
        );
        let mut acc = null_mut();
        assert_ne!(
            (api.accept)(listen, &mut acc),
            NCCL_SUCCESS,
            "accept on a closed listener"
        );
    }
    // With new comms and registrations live, the old handles are still refused and the new ones
    // work; a freed slot taken by a new object must not revive its old handle (generation).
    let pair2 = connect_pair(&api, ctx);
    let (_, send2, recv2) = pair2;
    let smh2 = api.register(send2, &mut out);
    let rmh2 = api.register(recv2, &mut into);
    // SAFETY: the old handles are stale, the new ones live.
    unsafe {
        let mut req = null_mut();
        let old_send = (api.isend)(send, out.as_mut_ptr().cast(), 8, 0, smh2, &mut req);
        assert_ne!(old_send, NCCL_SUCCESS, "isend on a closed comm");
        // The registration table hands slots out round-robin: cycle through all of them so a
        // live registration sits in the deregistered handle's slot at some point.
        for _ in 0..2 * crate::handle::CHUNK + 1 {
            let live = api.register(send2, &mut out);
            let old_mh = (api.isend)(send2, out.as_mut_ptr().cast(), 8, 0, smh, &mut req);
            assert_ne!(old_mh, NCCL_SUCCESS, "isend with a deregistered mhandle");
            assert_eq!((api.dereg_mr)(send2, live), NCCL_SUCCESS);
        }
        assert_ne!(
            (api.close_recv)(recv),
            NCCL_SUCCESS,
            "closeRecv of the old receive comm"
        );
        assert_ne!(api.test(rreq).0, NCCL_SUCCESS, "test of the old request");
        assert_eq!((api.dereg_mr)(send2, smh2), NCCL_SUCCESS);
        assert_eq!((api.dereg_mr)(recv2, rmh2), NCCL_SUCCESS);
    }
    close_pair(&api, pair2);
    assert_eq!((api.finalize)(ctx), NCCL_SUCCESS);
    assert_ne!((api.finalize)(ctx), NCCL_SUCCESS, "finalize twice");
    let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let mut l = null_mut();
    assert_ne!(
        (api.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut l),
        NCCL_SUCCESS,
        "listen with a finalized context"
    );
}

#[test]
fn sizes_over_the_limits_are_refused() {
    let _serial = serial();
    let (v12, v6) = (api_v12(), api_v6());
    let (rc, ctx) = (v12.init)();
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!((v6.init)().0, NCCL_SUCCESS);
    let pair = connect_pair(&v12, ctx);
    let (_, send, recv) = pair;
    let mut buf = vec![0u8; 4096];
    let data: Ptr = buf.as_mut_ptr().cast();
    let (smh, rmh) = (v12.register(send, &mut buf), v12.register(recv, &mut buf));
    let mut req = null_mut();
    // Larger than the maxP2pBytes Rivet advertises, inside a registration that large (the
    // pages are never touched, so they are never backed).
    let over = MAX_MESSAGE_BYTES + 1;
    let mut big = vec![0u8; over];
    let big_data: Ptr = big.as_mut_ptr().cast();
    let (big_smh, big_rmh) = (v12.register(send, &mut big), v12.register(recv, &mut big));
    assert_eq!(
        (v12.isend)(send, big_data, over, 0, big_smh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    let (mut d, mut size, mut tag, mut mh) = (big_data, over, 0, big_rmh);
    assert_eq!(
        (v12.irecv)(recv, 1, &mut d, &mut size, &mut tag, &mut mh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    // SAFETY: live comms and handles.
    unsafe {
        assert_eq!((v12.dereg_mr)(send, big_smh), NCCL_SUCCESS);
        assert_eq!((v12.dereg_mr)(recv, big_rmh), NCCL_SUCCESS);
    }
    drop(big);
    // A buffer that does not lie inside its registration.
    assert_eq!(
        (v12.isend)(send, data, 4097, 0, smh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    // SAFETY: inside `buf` (offset 1).
    let shifted: Ptr = unsafe { data.cast::<u8>().add(1) }.cast();
    assert_eq!(
        (v12.isend)(send, shifted, 4096, 0, smh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    // Starting below it (its offset from the registration's start wraps), on either side.
    let below: Ptr = data.cast::<u8>().wrapping_sub(1).cast();
    assert_eq!(
        (v12.isend)(send, below, 1, 0, smh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    let (mut d, mut size, mut tag, mut mh) = (below, 1, 0, rmh);
    assert_eq!(
        (v12.irecv)(recv, 1, &mut d, &mut size, &mut tag, &mut mh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    let (mut d, mut size) = (shifted, 4096);
    assert_eq!(
        (v12.irecv)(recv, 1, &mut d, &mut size, &mut tag, &mut mh, &mut req),
        NCCL_INVALID_ARGUMENT
    );
    // irecv's n outside 1..=maxRecvs, and grouped buffers past the limit.
    let mut ds = [data; 9];
    let mut sizes = [16usize; 9];
    let mut tags = [0 as c_int; 9];
    let mut mhs = [rmh; 9];
    for n in [0, -1, 9] {
        assert_eq!(
            (v12.irecv)(
                recv,
                n,
                ds.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req
            ),
            NCCL_INVALID_ARGUMENT,
            "irecv n = {n}"
        );
    }
    // The int-sized entries of v6 – v8: a negative size.
    let t = &ncclNetPlugin_v6.0;
    // SAFETY: live comms and handles; the sizes are what is under test.
    unsafe {
        assert_eq!(
            (t.isend.unwrap())(send, data, -1, 0, smh, &mut req),
            NCCL_INVALID_ARGUMENT
        );
        let mut isize = -5 as c_int;
        let mut d = data;
        let mut tag = 0;
        let mut mh = rmh;
        assert_eq!(
            (t.irecv.unwrap())(recv, 1, &mut d, &mut isize, &mut tag, &mut mh, &mut req),
            NCCL_INVALID_ARGUMENT
        );
        let mut out = null_mut();
        assert_eq!(
            (t.reg_mr.unwrap())(send, data, -1, NCCL_PTR_HOST, &mut out),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!((v12.dereg_mr)(send, smh), NCCL_SUCCESS);
        assert_eq!((v12.dereg_mr)(recv, rmh), NCCL_SUCCESS);
    }
    close_pair(&v12, pair);
    assert_eq!((v12.finalize)(ctx), NCCL_SUCCESS);
}

#[test]
fn init_and_finalize_cycle_with_contexts_of_their_own() {
    let _serial = serial();
    let api = api_v12();
    for round in 0..3u8 {
        let (rc_a, a) = (api.init)();
        let (rc_b, b) = (api.init)();
        assert_eq!((rc_a, rc_b), (NCCL_SUCCESS, NCCL_SUCCESS), "round {round}");
        assert_ne!(a, b, "each communicator gets its own context");
        // `a` ends; `b` still works, end to end.
        assert_eq!((api.finalize)(a), NCCL_SUCCESS);
        assert_eq!(api.device_count(), 1);
        let pair = connect_pair(&api, b);
        let (_, send, recv) = pair;
        api.transfer((send, recv), round, 1000, 0);
        close_pair(&api, pair);
        let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let mut l = null_mut();
        assert_ne!(
            (api.listen)(a, 0, handle.as_mut_ptr().cast(), &mut l),
            NCCL_SUCCESS,
            "the finalized context is stale"
        );
        assert_eq!((api.finalize)(b), NCCL_SUCCESS);
        assert_ne!((api.finalize)(a), NCCL_SUCCESS);
        assert_ne!((api.finalize)(b), NCCL_SUCCESS);
    }
}

#[test]
fn two_handles_of_one_buffer_share_a_registration_until_the_last_dereg() {
    let _serial = serial();
    let (api, ctx, pair) = v12_with_a_pair();
    let (_, send, recv) = pair;
    let mut out = pattern(11, 3000);
    let mut into = vec![0u8; 3000];
    // The port's registration cache hands both handles of each buffer one registration
    // (`regIsGlobal`): the first `deregMr` must leave it in place for the second handle.
    let (smh_a, smh_b) = (api.register(send, &mut out), api.register(send, &mut out));
    let (rmh_a, rmh_b) = (api.register(recv, &mut into), api.register(recv, &mut into));
    // SAFETY: live comms and handles.
    unsafe {
        assert_eq!((api.dereg_mr)(send, smh_a), NCCL_SUCCESS);
        assert_eq!((api.dereg_mr)(recv, rmh_a), NCCL_SUCCESS);
    }
    let rreq = api.recv(recv, &mut [&mut into[..]], &[4], &[rmh_b]);
    let sreq = api.send(send, &mut out, 4, smh_b);
    assert_eq!(api.wait(sreq)[0], 3000);
    assert_eq!(api.wait(rreq)[0], 3000);
    assert!(
        into == out,
        "the bytes arrived through the surviving handles"
    );
    // SAFETY: live comms and handles.
    unsafe {
        assert_eq!((api.dereg_mr)(send, smh_b), NCCL_SUCCESS);
        assert_eq!((api.dereg_mr)(recv, rmh_b), NCCL_SUCCESS);
    }
    close_pair_and_finalize(&api, pair, ctx);
}

/// `makeVDevice` of the v12 table over `members`; (rc, new device index).
fn make_vdevice_v12(members: &[c_int]) -> (NcclResult, c_int) {
    let make = ncclNetPlugin_v12
        .0
        .make_vdevice
        .expect("v12 exports makeVDevice");
    let mut props = NcclNetVDevicePropsV12 {
        ndevs: members.len() as c_int,
        devs: [0; 8],
    };
    props.devs[..members.len()].copy_from_slice(members);
    let mut d = -1;
    // SAFETY: as NCCL calls it: a live out-int and a filled request on this stack frame.
    let rc = unsafe { make(&mut d, &mut props) };
    (rc, d)
}

/// NIC fusion as NCCL 2.24+ drives it: two simulated ports fused by `makeVDevice` (named
/// `sim0+sim1`, speed summed, members listed), a connection on the fused device (one queue pair
/// per port, each message striped over both, every buffer registered on both ports' protection
/// domains under keys of their own), bytes checked for sizes around the stripe boundaries; the
/// same members give the same device again; refusals for bad requests.
#[test]
fn a_fused_device_stripes_each_message_over_its_ports() {
    let _serial = serial();
    sim::set_ports(2);
    crate::net::forget_devices_for_tests();
    let api = api_v12();
    let (rc, ctx) = (api.init)();
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!(api.device_count(), 2);
    let (rc, fused) = make_vdevice_v12(&[0, 1]);
    assert_eq!((rc, fused), (NCCL_SUCCESS, 2), "makeVDevice of both ports");
    assert_eq!(api.device_count(), 3, "devices() counts the fused device");
    assert_eq!(
        make_vdevice_v12(&[0, 1]),
        (NCCL_SUCCESS, 2),
        "same members, same device"
    );
    assert_eq!(
        make_vdevice_v12(&[1]),
        (NCCL_SUCCESS, 3),
        "a one-port device"
    );
    for bad in [&[0, 0][..], &[0, 7], &[]] {
        assert_ne!(make_vdevice_v12(bad).0, NCCL_SUCCESS, "makeVDevice {bad:?}");
    }
    let get = ncclNetPlugin_v12.0.get_properties.unwrap();
    let mut p = MaybeUninit::<NcclNetPropertiesV12>::zeroed();
    let mut one = MaybeUninit::<NcclNetPropertiesV12>::zeroed();
    // SAFETY: live property structs of the table's version.
    let (p, one) = unsafe {
        assert_eq!(get(fused, p.as_mut_ptr()), NCCL_SUCCESS);
        assert_eq!(get(0, one.as_mut_ptr()), NCCL_SUCCESS);
        (p.assume_init(), one.assume_init())
    };
    assert_eq!(api.name_of(fused), (NCCL_SUCCESS, "sim0+sim1".to_owned()));
    assert_eq!(p.speed, 2 * one.speed);
    assert_eq!((p.v_props.ndevs, &p.v_props.devs[..2]), (2, &[0, 1][..]));

    let pair = connect_pair_on(&api, ctx, fused);
    for (seed, len) in [
        (1u8, 0usize),
        (2, 1),
        (3, 128),
        (4, 129),
        (5, 4096),
        (6, 65_537),
        (7, 1 << 20),
    ] {
        api.transfer((pair.1, pair.2), seed, len, 9);
    }
    close_pair_and_finalize(&api, pair, ctx);
    sim::set_ports(1);
    crate::net::forget_devices_for_tests();
}

/// NCCL 2.28's loader on a host without an RDMA device (`ncclNetPluginInit` in
/// `src/plugin/net.cc`): the net table's `init(&comm->netContext, commHash, &config, logger,
/// profiler)` fails, NCCL then calls `finalize(comm->netContext)`, still NULL (the communicator is
/// zero-allocated), and skips the CollNet table (its `init` runs only after the net table's
/// succeeded; `ncclNetPluginFinalize` finalizes it only when enabled). The user must see nothing
/// above INFO, and the failed `init` must leave nothing behind for the next one.
#[test]
fn a_failed_init_then_finalize_of_null_logs_nothing_above_info() {
    use crate::log::{Level, tap};
    let _serial = serial();
    crate::net::forget_devices_for_tests();
    sim::set_no_device(true);
    let net = [
        (
            11,
            ncclNetPlugin_v11.0.init.unwrap(),
            ncclNetPlugin_v11.0.finalize.unwrap(),
        ),
        (
            12,
            ncclNetPlugin_v12.0.init.unwrap(),
            ncclNetPlugin_v12.0.finalize.unwrap(),
        ),
    ];
    for (version, init, finalize) in net {
        tap::start();
        let mut ctx: Ptr = null_mut();
        let mut config = NcclNetCommConfig {
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        // SAFETY: the arguments NCCL 2.28 passes: out-pointer, hash, config; no logger or
        // profiler (the tap sees every line the logger would).
        let rc = unsafe { init(&mut ctx, 0x28_09, &mut config, None, None) };
        assert_ne!(rc, NCCL_SUCCESS, "v{version} init without a device fails");
        assert!(ctx.is_null(), "v{version} a failed init writes no context");
        // SAFETY: NCCL's fail path passes the context it holds: NULL.
        let rc = unsafe { finalize(ctx) };
        assert_eq!(
            rc, NCCL_SUCCESS,
            "v{version} finalize(NULL) after a failed init"
        );
        let lines = tap::stop();
        let loud: Vec<&String> = lines
            .iter()
            .filter(|(level, _)| *level != Level::Info)
            .map(|(_, text)| text)
            .collect();
        assert!(loud.is_empty(), "v{version}: lines above INFO: {loud:?}");
        assert!(
            lines
                .iter()
                .any(|(_, text)| text.contains("no RDMA device")),
            "v{version}: an INFO line says why init failed: {lines:?}"
        );
    }
    // Were the CollNet table called anyway, its init fails and finalize(NULL) is as quiet.
    #[cfg(feature = "collnet")]
    for (version, init, finalize) in {
        use super::collnet_tables::{ncclCollNetPlugin_v11, ncclCollNetPlugin_v12};
        [
            (
                11,
                ncclCollNetPlugin_v11.0.init.unwrap(),
                ncclCollNetPlugin_v11.0.finalize.unwrap(),
            ),
            (
                12,
                ncclCollNetPlugin_v12.0.init.unwrap(),
                ncclCollNetPlugin_v12.0.finalize.unwrap(),
            ),
        ]
    } {
        tap::start();
        let mut ctx: Ptr = null_mut();
        // SAFETY: as above.
        let (rc_init, rc_finalize) =
            unsafe { (init(&mut ctx, 0x28_09, None), finalize(null_mut())) };
        let lines = tap::stop();
        assert_ne!(
            rc_init, NCCL_SUCCESS,
            "CollNet v{version} init without a device"
        );
        assert_eq!(
            rc_finalize, NCCL_SUCCESS,
            "CollNet v{version} finalize(NULL)"
        );
        assert!(
            lines.iter().all(|(level, _)| *level == Level::Info),
            "CollNet v{version}: {lines:?}"
        );
    }
    // The failed inits counted no user: once a device appears, init and finalize pair up and
    // the last finalize closes the devices again.
    sim::set_no_device(false);
    let api = api_v12();
    let (rc, ctx) = (api.init)();
    assert_eq!(rc, NCCL_SUCCESS);
    assert_eq!(api.device_count(), 1);
    assert_eq!((api.finalize)(ctx), NCCL_SUCCESS);
    let mut n = 0;
    // SAFETY: `n` is a live local.
    let rc = unsafe { (api.devices)(&mut n) };
    assert_ne!(rc, NCCL_SUCCESS, "no user left: the devices are closed");
}

/// Lines the test logger received: `(level, flags, text)`.
static LOGGED: Mutex<Vec<(c_int, core::ffi::c_ulong, String)>> = Mutex::new(Vec::new());

/// A logger with the fixed arguments the plugin passes (`fmt` is always `"%s"`, one string
/// after it). Defining a C-variadic function needs an unstable feature; on the x86-64 and AArch64
/// Linux calling conventions a variadic call places these six arguments where this function
/// reads them.
extern "C" fn recording_logger(
    level: c_int,
    flags: core::ffi::c_ulong,
    _file: *const core::ffi::c_char,
    _line: c_int,
    fmt: *const core::ffi::c_char,
    text: *const core::ffi::c_char,
) {
    // SAFETY: the plugin passes NUL-terminated strings for `fmt` and the one argument.
    let (fmt, text) = unsafe { (CStr::from_ptr(fmt), CStr::from_ptr(text)) };
    // The plugin formats every line itself: any other format string is recorded as a failure
    // (no panic may unwind out of a C callback).
    let text = if fmt == c"%s" {
        text.to_string_lossy().into_owned()
    } else {
        format!("format string {fmt:?}, not %s")
    };
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if logged.len() < 10_000 {
        logged.push((level, flags, text));
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[test]
fn init_logs_the_version_line_through_the_logger() {
    let _serial = serial();
    // As in a fresh process: the next `init` sets the devices up again.
    crate::net::forget_devices_for_tests();
    LOGGED.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let t = &ncclNetPlugin_v12.0;
    // SAFETY: see `recording_logger`: the plugin calls the logger with exactly the six arguments
    // it reads, which the variadic call passes in the same registers.
    let logger = unsafe {
        core::mem::transmute::<
            extern "C" fn(
                c_int,
                core::ffi::c_ulong,
                *const core::ffi::c_char,
                c_int,
                *const core::ffi::c_char,
                *const core::ffi::c_char,
            ),
            unsafe extern "C" fn(
                c_int,
                core::ffi::c_ulong,
                *const core::ffi::c_char,
                c_int,
                *const core::ffi::c_char,
                ...
            ),
        >(recording_logger)
    };
    let mut ctx = null_mut();
    // SAFETY: a valid out-pointer, NULL config and profiler (allowed), a logger that stays callable.
    let rc = unsafe { t.init.unwrap()(&mut ctx, 0x7e57, null_mut(), Some(logger), None) };
    assert_eq!(rc, NCCL_SUCCESS);
    // SAFETY: the context `init` returned, with no comm open on it.
    assert_eq!(unsafe { t.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
    let logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let expected = crate::version::line().to_string();
    let lines: Vec<_> = logged
        .iter()
        .filter(|(_, _, text)| text.contains(&expected))
        .collect();
    assert_eq!(lines.len(), 1, "one version line at init, got {logged:?}");
    let (level, flags, text) = lines[0];
    assert_eq!(*level, NCCL_LOG_INFO, "{text}");
    assert_ne!(flags & NCCL_NET, 0, "the NET subsystem shows it: {text}");
    assert!(
        text.contains(&format!("commit {}", crate::version::COMMIT)),
        "{text}"
    );
    let tables: Vec<u32> = every_api().iter().map(|a| a.version).collect();
    let claimed: Vec<u32> = crate::version::NET_ABI.collect();
    assert_eq!(
        tables, claimed,
        "the version line names the tables exported"
    );
}

/// `init`'s profiler argument is what the data path's entries read; NULL forgets it again.
#[test]
fn profiler_callback_follows_init() {
    /// A profiler that records nothing.
    ///
    /// # Safety
    /// None: it reads none of its arguments (it is never called here).
    unsafe extern "C" fn recorder(
        _: *mut *mut c_void,
        _: c_int,
        _: *mut c_void,
        _: i64,
        _: *mut c_void,
    ) -> NcclResult {
        NCCL_SUCCESS
    }
    let _serial = serial();
    super::shims::set_profiler(Some(recorder));
    // Kept only in a build with the profiler feature; a constant `None` without it.
    assert_eq!(
        super::shims::profiler_callback().is_some(),
        cfg!(feature = "profiler")
    );
    super::shims::set_profiler(None);
    assert!(super::shims::profiler_callback().is_none());
}
