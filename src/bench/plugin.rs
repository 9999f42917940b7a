//! The plugin as NCCL sees it: `dlopen` the shared library, take its `ncclNetPlugin_v12` table,
//! and call through it.
//!
//! Why this stays FFI although the plugin is also linked in as a Rust library: `rivet bench`
//! measures and checks the library NCCL would load, through the same C table NCCL calls (the
//! per-version shims, the panic guard and the handle checks included), and `--plugin PATH` may
//! name any build of it. An in-process Rust call would skip that boundary and run the linked copy,
//! not the file under test. The rest of the `rivet` command (`info`, `doctor`, `selftest`) reaches
//! the plugin through the library's safe Rust API (`nccl_net_rivet::devices`,
//! `nccl_net_rivet::diag`).
//!
//! Unsafe: `dlopen`/`dlsym` and calls through C function pointers cannot be checked by the
//! compiler. This module is the only place in the `rivet` binary that calls the plugin unsafely
//! (the binary's other `unsafe` is one `getrlimit` in `doctor`); everything outside it sees [`Plugin`], [`Comm`] and [`Region`], which keep the pointers NCCL's contract
//! requires (comms, memory handles, requests) paired with what they belong to.

use super::Error;
use core::ffi::{c_int, c_void};
use nccl_net_rivet::sys::NcclNetV11;
use nccl_net_rivet::sys::{
    NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_TRAFFIC_CLASS_UNDEF, NCCL_PTR_HOST, NCCL_SUCCESS,
    NcclNetCommConfig, NcclNetPropertiesV12, NcclNetVDevicePropsV12, NcclResult,
};
use std::ffi::{CStr, CString};
use std::path::Path;

type TableV12 = NcclNetV11<NcclNetPropertiesV12, NcclNetVDevicePropsV12>;
type Ptr = *mut c_void;

/// NCCL's name for a result code.
pub(crate) fn result_name(code: NcclResult) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown result",
    }
}

fn check(call: &'static str, code: NcclResult) -> Result<(), Error> {
    if code == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(Error::Plugin { call, code })
    }
}

/// A loaded plugin with one v11+ context (one "communicator").
#[derive(Debug)]
pub(crate) struct Plugin {
    lib: *mut c_void,
    table: &'static TableV12,
    ctx: Ptr,
    /// The device every comm uses.
    pub(crate) dev: c_int,
    /// Name of the device (`getProperties(dev).name`).
    pub(crate) device_name: String,
    /// Link speed the plugin reports, Mb/s.
    pub(crate) speed_mbps: i32,
}

/// The listen handle that travels from the listening side to the connecting side.
pub(crate) type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];

impl Plugin {
    /// `dlopen(path)`, `dlsym("ncclNetPlugin_v12")`, `init`, `devices`, `getProperties(dev)`;
    /// with `fuse`, `makeVDevice` of those devices first, whose device is used instead of `dev`.
    pub(crate) fn load(path: &Path, dev: c_int, fuse: Option<&[c_int]>) -> Result<Self, Error> {
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            Error::Usage(format!(
                "plugin path {} contains a NUL byte",
                path.display()
            ))
        })?;
        // SAFETY: a valid C string; RTLD_NOW|RTLD_LOCAL as NCCL's loader does.
        let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(Error::Load(format!(
                "dlopen {}: {}",
                path.display(),
                dlerror()
            )));
        }
        // SAFETY: `lib` is a live handle from dlopen and the symbol name is a C string literal.
        let sym = unsafe { libc::dlsym(lib, c"ncclNetPlugin_v12".as_ptr()) };
        if sym.is_null() {
            // SAFETY: `lib` came from dlopen and nothing from it is in use.
            unsafe { libc::dlclose(lib) };
            return Err(Error::Load(format!(
                "{} exports no ncclNetPlugin_v12 table (not a Rivet build of NCCL net API v12?)",
                path.display()
            )));
        }
        // SAFETY: `ncclNetPlugin_v12` is an immutable static of this layout inside the library, which
        // stays loaded (we never dlclose while the reference is in use: only in `Drop`, after the
        // last call).
        let table: &'static TableV12 = unsafe { &*sym.cast::<TableV12>() };
        let mut plugin = Self {
            lib,
            table,
            ctx: core::ptr::null_mut(),
            dev,
            device_name: String::new(),
            speed_mbps: 0,
        };
        let init = table
            .init
            .ok_or_else(|| missing("the v12 table has no init"))?;
        let mut config = NcclNetCommConfig {
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        // SAFETY: the arguments NCCL passes: an out-pointer for the context, a config that
        // outlives the call, no logger (the plugin then stays silent) and no profiler.
        let code = unsafe { init(&mut plugin.ctx, 0x7269_7665_7462, &mut config, None, None) };
        if code != NCCL_SUCCESS {
            return Err(Error::NoDevice(format!(
                "the plugin's init returned {} ({}): no usable RDMA device (`rivet info` says why)",
                code,
                result_name(code)
            )));
        }
        let devices = table.devices.ok_or_else(|| missing("no devices entry"))?;
        let mut ndev: c_int = 0;
        // SAFETY: a valid out-pointer.
        check("devices", unsafe { devices(&mut ndev) })?;
        if ndev < 1 {
            return Err(Error::NoDevice("the plugin reports 0 devices".into()));
        }
        let dev = match fuse {
            None => dev,
            Some(members) => {
                let make = table
                    .make_vdevice
                    .ok_or_else(|| missing("no makeVDevice (the plugin cannot fuse devices)"))?;
                let mut request = NcclNetVDevicePropsV12 {
                    ndevs: c_int::try_from(members.len()).unwrap_or(0),
                    devs: [0; 8],
                };
                for (slot, m) in request.devs.iter_mut().zip(members) {
                    *slot = *m;
                }
                let mut fused: c_int = -1;
                // SAFETY: an out-int and a filled v12 request, both live for the call.
                check("makeVDevice", unsafe { make(&mut fused, &mut request) })?;
                // As NCCL: the fused device counts among the devices from now on.
                // SAFETY: a valid out-pointer.
                check("devices", unsafe { devices(&mut ndev) })?;
                fused
            }
        };
        plugin.dev = dev;
        if dev < 0 || dev >= ndev {
            return Err(Error::Usage(format!(
                "--dev {dev}: the plugin has {ndev} device(s) (0..{})",
                ndev - 1
            )));
        }
        let get_properties = table
            .get_properties
            .ok_or_else(|| missing("no getProperties"))?;
        let mut props = core::mem::MaybeUninit::<NcclNetPropertiesV12>::zeroed();
        // SAFETY: `props` is a writable v12 properties struct, the type this table's entry takes.
        check("getProperties", unsafe {
            get_properties(dev, props.as_mut_ptr())
        })?;
        // SAFETY: zero-initialised, then written by getProperties; every field is plain data.
        let props = unsafe { props.assume_init() };
        if props.ptr_support & NCCL_PTR_HOST == 0 {
            return Err(Error::Load(format!(
                "device {dev} does not take host memory (ptrSupport {:#x})",
                props.ptr_support
            )));
        }
        plugin.device_name = if props.name.is_null() {
            format!("device {dev}")
        } else {
            // SAFETY: the plugin returns a NUL-terminated name that lives as long as the library.
            unsafe { CStr::from_ptr(props.name) }
                .to_string_lossy()
                .into_owned()
        };
        plugin.speed_mbps = props.speed;
        Ok(plugin)
    }

    /// `listen`: a listen comm and the handle to give the connecting side.
    pub(crate) fn listen(&self) -> Result<(Listener<'_>, Handle), Error> {
        let f = self.table.listen.ok_or_else(|| missing("no listen"))?;
        let mut handle: Handle = [0; NCCL_NET_HANDLE_MAXSIZE];
        let mut comm: Ptr = core::ptr::null_mut();
        // SAFETY: a 128-byte handle buffer and an out-pointer, as NCCL passes.
        check("listen", unsafe {
            f(self.ctx, self.dev, handle.as_mut_ptr().cast(), &mut comm)
        })?;
        if comm.is_null() {
            return Err(Error::Plugin {
                call: "listen (NULL listenComm)",
                code: 0,
            });
        }
        Ok((Listener { plugin: self, comm }, handle))
    }

    /// One `connect` poll with the same handle buffer each time; `Some` once established.
    pub(crate) fn connect_poll(&self, handle: &mut Handle) -> Result<Option<Comm<'_>>, Error> {
        let f = self.table.connect.ok_or_else(|| missing("no connect"))?;
        let mut comm: Ptr = core::ptr::null_mut();
        // SAFETY: the same 128-byte handle buffer on every poll, an out-pointer, no device handle.
        let code = unsafe {
            f(
                self.ctx,
                self.dev,
                handle.as_mut_ptr().cast(),
                &mut comm,
                core::ptr::null_mut(),
            )
        };
        if code != NCCL_SUCCESS {
            if !comm.is_null() {
                // NCCL closes a comm returned alongside an error.
                drop(Comm {
                    plugin: self,
                    comm,
                    send: true,
                });
            }
            return Err(Error::Plugin {
                call: "connect",
                code,
            });
        }
        Ok((!comm.is_null()).then_some(Comm {
            plugin: self,
            comm,
            send: true,
        }))
    }

    fn call_test(&self, req: Ptr, sizes: Option<&mut [c_int; 8]>) -> Result<bool, Error> {
        let f = self.table.test.ok_or_else(|| missing("no test"))?;
        let mut done: c_int = 0;
        let sizes = sizes.map_or(core::ptr::null_mut(), |s| s.as_mut_ptr());
        // SAFETY: a request the plugin returned and has not completed yet; `sizes` is NULL or has
        // room for the 8 buffers a request can cover.
        check("test", unsafe { f(req, &mut done, sizes) })?;
        Ok(done != 0)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(finalize) = self.table.finalize {
            // SAFETY: the context from init; every comm borrowed `self`, so all are closed by now.
            unsafe { finalize(self.ctx) };
        }
        // SAFETY: nothing from the library is referenced any more (comms borrow `self`).
        unsafe { libc::dlclose(self.lib) };
    }
}

/// A table entry the plugin left NULL.
fn missing(entry: &str) -> Error {
    Error::Load(format!("the v12 table has no {entry} entry"))
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string valid until the next dl* call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// A listen comm.
#[derive(Debug)]
pub(crate) struct Listener<'p> {
    plugin: &'p Plugin,
    comm: Ptr,
}

impl<'p> Listener<'p> {
    /// One `accept` poll; `Some` once the connection is established.
    pub(crate) fn accept_poll(&self) -> Result<Option<Comm<'p>>, Error> {
        let f = self
            .plugin
            .table
            .accept
            .ok_or_else(|| missing("no accept"))?;
        let mut comm: Ptr = core::ptr::null_mut();
        // SAFETY: our live listen comm and an out-pointer; no device handle.
        check("accept", unsafe {
            f(self.comm, &mut comm, core::ptr::null_mut())
        })?;
        Ok((!comm.is_null()).then_some(Comm {
            plugin: self.plugin,
            comm,
            send: false,
        }))
    }
}

impl Drop for Listener<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.plugin.table.close_listen {
            // SAFETY: our live listen comm, closed once.
            unsafe { f(self.comm) };
        }
    }
}

/// An established send or receive comm.
#[derive(Debug)]
pub(crate) struct Comm<'p> {
    plugin: &'p Plugin,
    comm: Ptr,
    send: bool,
}

/// Host memory registered on one comm.
#[derive(Debug)]
pub(crate) struct Region<'c, 'p> {
    comm: &'c Comm<'p>,
    /// The bytes; boxed so their address never moves while registered. Only the plugin touches
    /// them (through `base`) while registered.
    buf: Box<[u8]>,
    base: *mut u8,
    len: usize,
    mh: Ptr,
}

/// An in-flight isend or irecv.
#[derive(Debug)]
pub(crate) struct Request(Ptr);

impl<'p> Comm<'p> {
    /// `regMr` of a fresh zeroed buffer of `len` bytes.
    pub(crate) fn register(&self, len: usize) -> Result<Region<'_, 'p>, Error> {
        let f = self
            .plugin
            .table
            .reg_mr
            .ok_or_else(|| missing("no regMr"))?;
        let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
        let base = buf.as_mut_ptr();
        let len = buf.len();
        let mut mh: Ptr = core::ptr::null_mut();
        // SAFETY: our live comm and a host buffer that outlives the registration (deregistered in
        // Region's Drop before the box is freed).
        check("regMr", unsafe {
            f(self.comm, base.cast(), len, NCCL_PTR_HOST, &mut mh)
        })?;
        Ok(Region {
            comm: self,
            buf,
            base,
            len,
            mh,
        })
    }

    /// `isend` of `region[offset..offset+len]`; `None` = "try later".
    pub(crate) fn isend(
        &self,
        region: &Region<'_, '_>,
        offset: usize,
        len: usize,
        tag: c_int,
    ) -> Result<Option<Request>, Error> {
        let data = region.slice_ptr(offset, len)?;
        let f = self.plugin.table.isend.ok_or_else(|| missing("no isend"))?;
        let mut req: Ptr = core::ptr::null_mut();
        // SAFETY: our live send comm, a range inside a buffer registered on it, no profiler handle.
        check("isend", unsafe {
            f(
                self.comm,
                data,
                len,
                tag,
                region.mh,
                core::ptr::null_mut(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `irecv` of one buffer `region[offset..offset+len]`; `None` = "try later".
    pub(crate) fn irecv(
        &self,
        region: &Region<'_, '_>,
        offset: usize,
        len: usize,
        tag: c_int,
    ) -> Result<Option<Request>, Error> {
        self.irecv_group(region, &[(offset, len, tag)])
    }

    /// `irecv` of up to 8 buffers of `region` in one request: `(offset, len, tag)` each.
    pub(crate) fn irecv_group(
        &self,
        region: &Region<'_, '_>,
        buffers: &[(usize, usize, c_int)],
    ) -> Result<Option<Request>, Error> {
        if buffers.is_empty() || buffers.len() > 8 {
            return Err(Error::Usage(format!(
                "a grouped receive takes 1 to 8 buffers, not {}",
                buffers.len()
            )));
        }
        let mut data: [Ptr; 8] = [core::ptr::null_mut(); 8];
        let mut sizes = [0usize; 8];
        let mut tags: [c_int; 8] = [0; 8];
        let mut mhs: [Ptr; 8] = [region.mh; 8];
        let mut phandles: [Ptr; 8] = [core::ptr::null_mut(); 8];
        for (j, &(offset, len, tag)) in buffers.iter().enumerate() {
            data[j] = region.slice_ptr(offset, len)?;
            sizes[j] = len;
            tags[j] = tag;
        }
        let n = c_int::try_from(buffers.len()).unwrap_or(1);
        let f = self.plugin.table.irecv.ok_or_else(|| missing("no irecv"))?;
        let mut req: Ptr = core::ptr::null_mut();
        // SAFETY: our live receive comm; the arrays hold 8 elements, of which the first n (1..=8)
        // are filled; every range lies inside a buffer registered on this comm.
        check("irecv", unsafe {
            f(
                self.comm,
                n,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                phandles.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `test` returning every buffer's size (a grouped receive reports one per buffer).
    pub(crate) fn test_sizes(&self, req: &Request) -> Result<Option<[c_int; 8]>, Error> {
        let mut sizes: [c_int; 8] = [0; 8];
        let done = self.plugin.call_test(req.0, Some(&mut sizes))?;
        Ok(done.then_some(sizes))
    }

    /// `test`: `Some(bytes)` once the request completed (the request is then gone).
    pub(crate) fn test(&self, req: &Request) -> Result<Option<usize>, Error> {
        let mut sizes: [c_int; 8] = [0; 8];
        let done = self.plugin.call_test(req.0, Some(&mut sizes))?;
        Ok(done.then(|| usize::try_from(sizes[0]).unwrap_or(0)))
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        let f = if self.send {
            self.plugin.table.close_send
        } else {
            self.plugin.table.close_recv
        };
        if let Some(f) = f {
            // SAFETY: our live comm, closed once; its regions borrowed it and are gone.
            unsafe { f(self.comm) };
        }
    }
}

impl Region<'_, '_> {
    /// Size of the buffer in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The buffer's bytes, to fill before a send and check after a receive. Only while no request
    /// on this range is in flight: the NIC writes receive buffers behind Rust's back.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    fn slice_ptr(&self, offset: usize, len: usize) -> Result<Ptr, Error> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::Usage(format!(
                "message of {len} bytes at offset {offset} does not fit the {}-byte buffer",
                self.len
            )));
        }
        // In bounds (checked above); the plugin writes receive buffers through this pointer.
        Ok(self.base.wrapping_add(offset).cast())
    }
}

impl Drop for Region<'_, '_> {
    fn drop(&mut self) {
        if let Some(f) = self.comm.plugin.table.dereg_mr {
            // SAFETY: a registration made on this live comm, released once.
            unsafe { f(self.comm.comm, self.mh) };
        }
    }
}
