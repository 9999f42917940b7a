//! Logging through the `ncclDebugLogger_t` NCCL hands to `init`, never through stdout or stderr.
//!
//! Unsafe: the logger is a C-variadic function pointer supplied by NCCL; calling it is FFI.
//!
//! The logger is stored once per process (NCCL passes the same function on every `init`) and
//! every line is formatted in Rust and passed as a single `"%s"` argument, so no user-controlled
//! text is ever interpreted as a format string.

#![allow(unsafe_code)]

use crate::sys::{NCCL_INIT, NCCL_LOG_INFO, NCCL_LOG_WARN, NCCL_NET, NcclDebugLogger};
use core::ffi::{c_char, c_int, c_ulong};
use std::ffi::CString;
use std::fmt;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The logger NCCL passed, as a raw function address (null = none, log nothing).
static LOGGER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Remember NCCL's logger. A null logger keeps whatever was stored before.
pub(crate) fn set_logger(logger: NcclDebugLogger) {
    if let Some(f) = logger {
        LOGGER.store(f as *mut (), Ordering::Release);
    }
}

/// Severity of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// Something failed; NCCL shows it at `NCCL_DEBUG=WARN`.
    Warn,
    /// Progress and configuration; shown at `NCCL_DEBUG=INFO` for the NET/INIT subsystems.
    Info,
}

/// Send one line to NCCL's logger. Lines are prefixed with `NET/Rivet: `.
pub(crate) fn log(
    level: Level,
    subsystems: c_ulong,
    file: &'static str,
    line: u32,
    args: fmt::Arguments<'_>,
) {
    #[cfg(test)]
    tap::record(level, args);
    let raw = LOGGER.load(Ordering::Acquire);
    if raw.is_null() {
        return;
    }
    // SAFETY: `raw` was stored from a non-null `ncclDebugLogger_t` in `set_logger`; function
    // pointers and data pointers have the same size and representation on every target we build.
    let logger: unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...) =
        unsafe { core::mem::transmute::<*mut (), _>(raw) };
    // Interior NUL bytes (from peer-supplied names, say) would truncate the line; replace them.
    let text = format!("NET/Rivet: {args}").replace('\0', "\\0");
    let Ok(text) = CString::new(text) else { return };
    let file = CString::new(file).unwrap_or_default();
    let (level, flags) = match level {
        Level::Warn => (NCCL_LOG_WARN, !0),
        Level::Info => (NCCL_LOG_INFO, subsystems),
    };
    let line = c_int::try_from(line).unwrap_or(c_int::MAX);
    // SAFETY: NCCL's logger is `printf`-like; we pass a constant "%s" format and one valid,
    // NUL-terminated string argument, so the variadic call reads exactly what it is given.
    unsafe {
        logger(
            level,
            flags,
            file.as_ptr(),
            line,
            c"%s".as_ptr(),
            text.as_ptr(),
        )
    };
}

/// Subsystem flags for INFO lines about initialisation and devices.
pub(crate) const INIT_NET: c_ulong = NCCL_INIT | NCCL_NET;

/// `warn!(...)`: one WARN line through NCCL's logger.
macro_rules! log_warn {
    ($($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Warn, 0, file!(), line!(), format_args!($($arg)*))
    };
}

/// `info!(flags, ...)`: one INFO line for the given subsystems.
macro_rules! log_info {
    ($flags:expr, $($arg:tt)*) => {
        $crate::log::log($crate::log::Level::Info, $flags, file!(), line!(), format_args!($($arg)*))
    };
}

pub(crate) use {log_info as info, log_warn as warn};

/// Tests only: the lines the current thread sends towards NCCL's logger, so a test that replays
/// NCCL's calls can check what a user would see (thread-local: tests running beside it do not
/// mix their lines in).
#[cfg(test)]
pub(crate) mod tap {
    use crate::log::Level;
    use std::cell::RefCell;
    use std::fmt;

    thread_local! {
        static LINES: RefCell<Option<Vec<(Level, String)>>> = const { RefCell::new(None) };
    }

    /// Start recording this thread's lines.
    pub(crate) fn start() {
        LINES.with(|l| *l.borrow_mut() = Some(Vec::new()));
    }

    pub(super) fn record(level: Level, args: fmt::Arguments<'_>) {
        LINES.with(|l| {
            if let Some(lines) = l.borrow_mut().as_mut() {
                lines.push((level, format!("NET/Rivet: {args}")));
            }
        });
    }

    /// Stop recording; the lines since [`start`].
    pub(crate) fn stop() -> Vec<(Level, String)> {
        LINES.with(|l| l.borrow_mut().take().unwrap_or_default())
    }
}
