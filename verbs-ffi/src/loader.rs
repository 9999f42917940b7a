//! Run-time loading of libibverbs (and, optionally, libmlx5) with `dlopen`/`dlsym`.
//!
//! Unsafe because it calls the C dynamic loader and turns symbol addresses into typed function
//! pointers; each cast is sound only because the Rust signature below matches the C prototype in
//! rdma-core's `verbs.h` / `mlx5dv.h` (reference §1.1).
//!
//! Rules (reference §1.4): `RTLD_NOW | RTLD_LOCAL`; plain `dlsym` (it returns the default
//! `@@IBVERBS_1.1` version, never the ancient 1.0 ABI); the libraries are never `dlclose`d, because
//! providers register destructors and keep state tied to them. Everything is loaded once per process.
#![allow(unsafe_code)]

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ffi::CString;
use std::sync::OnceLock;

use crate::error::VerbsError;
use crate::sys::{
    ibv_async_event, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_ece, ibv_gid,
    ibv_gid_entry, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
};

/// Default soname of libibverbs (the runtime package's name, not the `.so` dev symlink).
pub const IBVERBS_SONAME: &str = "libibverbs.so.1";
/// Soname of the mlx5 provider with the direct-verbs API.
pub const MLX5_SONAME: &str = "libmlx5.so.1";
/// Environment variable that overrides [`IBVERBS_SONAME`] (a path or a soname).
pub const IBVERBS_LIB_ENV: &str = "RIVET_IBVERBS_LIB";

/// Resolved libibverbs entry points.
///
/// Required symbols are plain function pointers; optional ones (newer rdma-core) are `Option`s.
/// Calling any of them is `unsafe`: the caller upholds the C API's contract.
#[derive(Debug)]
pub struct Verbs {
    /// The name or path that was passed to `dlopen`.
    pub library: String,
    /// `ibv_get_device_list`.
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    /// `ibv_free_device_list`.
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    /// `ibv_get_device_name`.
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    /// `ibv_get_device_guid` (returns a `__be64`).
    pub get_device_guid: unsafe extern "C" fn(*mut ibv_device) -> u64,
    /// `ibv_open_device`.
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    /// `ibv_close_device`.
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    /// `ibv_query_device`.
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    /// `ibv_query_port` (the exported compat symbol: fills 48 bytes).
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    /// `ibv_query_gid`.
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    /// `ibv_alloc_pd`.
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    /// `ibv_dealloc_pd`.
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    /// `ibv_reg_mr` (the exported function, not the header macro).
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `ibv_dereg_mr`.
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    /// `ibv_create_cq`.
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut c_void,
        c_int,
    ) -> *mut ibv_cq,
    /// `ibv_destroy_cq`.
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    /// `ibv_create_qp`.
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    /// `ibv_modify_qp`.
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    /// `ibv_query_qp`.
    pub query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    /// `ibv_destroy_qp`.
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    /// `ibv_get_async_event`.
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    /// `ibv_ack_async_event`.
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    /// `ibv_wc_status_str`.
    pub wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
    /// `ibv_event_type_str`.
    pub event_type_str: unsafe extern "C" fn(u32) -> *const c_char,
    /// `ibv_reg_mr_iova2` (rdma-core v28+).
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    /// `ibv_reg_dmabuf_mr` (v34+): `(pd, offset, length, iova, fd, access)`.
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    /// `_ibv_query_gid_ex` (v32+): `(ctx, port, index, entry, flags, entry_size)`.
    pub query_gid_ex: Option<
        unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
    >,
    /// `ibv_query_ece` (v31+).
    pub query_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    /// `ibv_set_ece` (v31+).
    pub set_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    /// `ibv_is_fork_initialized` (v35+): returns `enum ibv_fork_status`.
    pub is_fork_initialized: Option<unsafe extern "C" fn() -> c_int>,
    /// `ibv_fork_init`.
    pub fork_init: Option<unsafe extern "C" fn() -> c_int>,
}

/// Resolved libmlx5 direct-verbs entry points (for a later mlx5 direct data path).
#[derive(Debug)]
pub struct Mlx5 {
    /// `mlx5dv_is_supported(struct ibv_device *) -> bool` (MLX5_1.8).
    pub is_supported: Option<unsafe extern "C" fn(*mut ibv_device) -> bool>,
    /// `mlx5dv_init_obj(struct mlx5dv_obj *, uint64_t obj_type)`.
    pub init_obj: unsafe extern "C" fn(*mut c_void, u64) -> c_int,
    /// `mlx5dv_create_qp(ctx, struct ibv_qp_init_attr_ex *, struct mlx5dv_qp_init_attr *)` (MLX5_1.3).
    pub create_qp:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void, *mut c_void) -> *mut ibv_qp>,
}

/// The process-wide libibverbs table, loaded on first use.
///
/// The library named by `RIVET_IBVERBS_LIB`, else `libibverbs.so.1`, is opened once; a failure is
/// remembered and returned again on every call.
pub fn verbs() -> Result<&'static Verbs, VerbsError> {
    static VERBS: OnceLock<Result<Verbs, VerbsError>> = OnceLock::new();
    VERBS
        .get_or_init(|| {
            let library = std::env::var(IBVERBS_LIB_ENV)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| IBVERBS_SONAME.to_owned());
            Verbs::load(&library)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The process-wide libmlx5 table, loaded on first use after libibverbs; `Err` when absent.
///
/// `libmlx5.so.1` links the system `libibverbs.so.1`; with `RIVET_IBVERBS_LIB` pointing elsewhere
/// the two may not share one libibverbs, and mlx5dv calls on our objects would fail.
pub fn mlx5() -> Result<&'static Mlx5, VerbsError> {
    static MLX5: OnceLock<Result<Mlx5, VerbsError>> = OnceLock::new();
    MLX5.get_or_init(|| {
        // libmlx5 depends on libibverbs; load ours first so both resolve to one copy.
        verbs()?;
        Mlx5::load(MLX5_SONAME)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `ibv_fork_init()`: makes registered memory safe across `fork()` on old kernels.
///
/// Returns `Err(Unsupported)` if the symbol is missing; `EINVAL` once any MR exists.
pub fn fork_init() -> Result<(), VerbsError> {
    let verbs = verbs()?;
    let init = verbs.fork_init.ok_or(VerbsError::Unsupported {
        what: "ibv_fork_init",
    })?;
    // SAFETY: takes no arguments; libibverbs documents it as callable at any time (it fails, rather
    // than misbehaves, once memory is registered).
    let ret = unsafe { init() };
    crate::error::check("ibv_fork_init", ret)
}

/// `ibv_is_fork_initialized()`: a [`crate::sys::fork_status`] value, or `None` if the symbol is missing.
pub fn fork_status() -> Result<Option<i32>, VerbsError> {
    let verbs = verbs()?;
    // SAFETY: takes no arguments and only reads library state.
    Ok(verbs.is_fork_initialized.map(|f| unsafe { f() }))
}

/// A `dlopen` handle that is deliberately never closed.
struct Library {
    name: String,
    handle: *mut c_void,
}

impl Library {
    fn open(name: &str) -> Result<Self, VerbsError> {
        let c_name = CString::new(name).map_err(|_| VerbsError::Load {
            library: name.to_owned(),
            detail: "name contains NUL".into(),
        })?;
        // SAFETY: c_name is a valid NUL-terminated string; dlopen has no other preconditions. Loading
        // runs the library's constructors, which is what linking against it would do too.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(VerbsError::Load {
                library: name.to_owned(),
                detail: dlerror_text(),
            });
        }
        Ok(Self {
            name: name.to_owned(),
            handle,
        })
    }

    /// The symbol's address, or the `dlerror` text when it is absent.
    fn address(&self, symbol: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: dlerror only reads/clears thread-local loader state; calling it first discards any
        // stale message so a later one belongs to this lookup.
        unsafe { libc::dlerror() };
        // SAFETY: handle came from a successful dlopen and is never closed; symbol is NUL-terminated.
        let address = unsafe { libc::dlsym(self.handle, symbol.as_ptr()) };
        if address.is_null() {
            Err(dlerror_text())
        } else {
            Ok(address)
        }
    }

    /// Looks up a function and casts it to `F`.
    ///
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn` type whose signature matches the C prototype of `symbol`.
    unsafe fn function<F: Copy>(&self, symbol: &'static CStr) -> Result<F, VerbsError> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        let address = self
            .address(symbol)
            .map_err(|detail| VerbsError::MissingSymbol {
                library: self.name.clone(),
                symbol: symbol.to_str().unwrap_or("?"),
                detail,
            })?;
        // SAFETY: F is a function-pointer type of pointer size (asserted above) matching the symbol's C
        // prototype (the caller's contract); the address is non-null.
        Ok(unsafe { core::mem::transmute_copy::<*mut c_void, F>(&address) })
    }

    /// Like [`Self::function`], but an absent symbol is `None`.
    ///
    /// # Safety
    /// As for [`Self::function`].
    unsafe fn optional<F: Copy>(&self, symbol: &'static CStr) -> Option<F> {
        // SAFETY: forwarded caller contract.
        unsafe { self.function(symbol) }.ok()
    }
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on this
    // thread; it is copied out at once.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "unknown dynamic loader error".to_owned()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Verbs {
    /// Opens `library` and resolves the table, without caching. Use [`verbs`] in normal code; this is
    /// for tests and tools that want to try a specific library.
    pub fn load(library: &str) -> Result<Self, VerbsError> {
        let lib = Library::open(library)?;
        // SAFETY: each target type is the exact C prototype of the named symbol from rdma-core
        // verbs.h (types in crate::sys mirror the C structs).
        unsafe {
            Ok(Self {
                library: library.to_owned(),
                get_device_list: lib.function(c"ibv_get_device_list")?,
                free_device_list: lib.function(c"ibv_free_device_list")?,
                get_device_name: lib.function(c"ibv_get_device_name")?,
                get_device_guid: lib.function(c"ibv_get_device_guid")?,
                open_device: lib.function(c"ibv_open_device")?,
                close_device: lib.function(c"ibv_close_device")?,
                query_device: lib.function(c"ibv_query_device")?,
                query_port: lib.function(c"ibv_query_port")?,
                query_gid: lib.function(c"ibv_query_gid")?,
                alloc_pd: lib.function(c"ibv_alloc_pd")?,
                dealloc_pd: lib.function(c"ibv_dealloc_pd")?,
                reg_mr: lib.function(c"ibv_reg_mr")?,
                dereg_mr: lib.function(c"ibv_dereg_mr")?,
                create_cq: lib.function(c"ibv_create_cq")?,
                destroy_cq: lib.function(c"ibv_destroy_cq")?,
                create_qp: lib.function(c"ibv_create_qp")?,
                modify_qp: lib.function(c"ibv_modify_qp")?,
                query_qp: lib.function(c"ibv_query_qp")?,
                destroy_qp: lib.function(c"ibv_destroy_qp")?,
                get_async_event: lib.function(c"ibv_get_async_event")?,
                ack_async_event: lib.function(c"ibv_ack_async_event")?,
                wc_status_str: lib.function(c"ibv_wc_status_str")?,
                event_type_str: lib.function(c"ibv_event_type_str")?,
                reg_mr_iova2: lib.optional(c"ibv_reg_mr_iova2"),
                reg_dmabuf_mr: lib.optional(c"ibv_reg_dmabuf_mr"),
                query_gid_ex: lib.optional(c"_ibv_query_gid_ex"),
                query_ece: lib.optional(c"ibv_query_ece"),
                set_ece: lib.optional(c"ibv_set_ece"),
                is_fork_initialized: lib.optional(c"ibv_is_fork_initialized"),
                fork_init: lib.optional(c"ibv_fork_init"),
            })
        }
    }

    /// Names of the optional entry points this library provides.
    pub fn optional_symbols(&self) -> Vec<&'static str> {
        let present = [
            ("ibv_reg_mr_iova2", self.reg_mr_iova2.is_some()),
            ("ibv_reg_dmabuf_mr", self.reg_dmabuf_mr.is_some()),
            ("_ibv_query_gid_ex", self.query_gid_ex.is_some()),
            ("ibv_query_ece", self.query_ece.is_some()),
            ("ibv_set_ece", self.set_ece.is_some()),
            (
                "ibv_is_fork_initialized",
                self.is_fork_initialized.is_some(),
            ),
            ("ibv_fork_init", self.fork_init.is_some()),
        ];
        present
            .iter()
            .filter(|(_, p)| *p)
            .map(|(n, _)| *n)
            .collect()
    }

    /// `ibv_wc_status_str`: the library's name for a completion status.
    pub fn wc_status_name(&self, status: u32) -> &'static str {
        // SAFETY: the function accepts any value and returns a pointer to a static string ("unknown"
        // for values it does not know).
        static_str(unsafe { (self.wc_status_str)(status) })
    }

    /// `ibv_event_type_str`: the library's name for an async event type.
    pub fn event_type_name(&self, event_type: u32) -> &'static str {
        // SAFETY: as for wc_status_name.
        static_str(unsafe { (self.event_type_str)(event_type) })
    }
}

/// A C string with static storage (libibverbs' name tables) as `&'static str`.
fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "unknown";
    }
    // SAFETY: non-null pointers from ibv_*_str point into static, NUL-terminated tables.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("unknown")
}

impl Mlx5 {
    /// Opens `library` and resolves the mlx5dv entry points, without caching.
    pub fn load(library: &str) -> Result<Self, VerbsError> {
        let lib = Library::open(library)?;
        // SAFETY: target types match the mlx5dv.h prototypes, with the attribute structs left as
        // `void *` because nothing here builds them yet.
        unsafe {
            Ok(Self {
                is_supported: lib.optional(c"mlx5dv_is_supported"),
                init_obj: lib.function(c"mlx5dv_init_obj")?,
                create_qp: lib.optional(c"mlx5dv_create_qp"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_load_error_with_dlerror_text() {
        let err = Verbs::load("/nonexistent/libibverbs.so.1").unwrap_err();
        match &err {
            VerbsError::Load { library, detail } => {
                assert_eq!(library, "/nonexistent/libibverbs.so.1");
                assert!(detail.contains("No such file"), "{detail}");
            }
            other => panic!("expected Load, got {other:?}"),
        }
        assert!(
            err.to_string()
                .contains("cannot load /nonexistent/libibverbs.so.1")
        );
    }

    #[test]
    fn library_without_verbs_is_a_missing_symbol_error() {
        // libc is always loadable and has none of the verbs.
        let err = Verbs::load("libc.so.6").unwrap_err();
        match err {
            VerbsError::MissingSymbol {
                library,
                symbol,
                detail,
            } => {
                assert_eq!(library, "libc.so.6");
                assert_eq!(symbol, "ibv_get_device_list");
                assert!(detail.contains("ibv_get_device_list"), "{detail}");
            }
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
        assert!(matches!(
            Mlx5::load("libc.so.6"),
            Err(VerbsError::MissingSymbol {
                symbol: "mlx5dv_init_obj",
                ..
            })
        ));
    }

    #[test]
    fn static_str_handles_null() {
        assert_eq!(static_str(core::ptr::null()), "unknown");
        assert_eq!(static_str(c"RoCE".as_ptr()), "RoCE");
    }
}
