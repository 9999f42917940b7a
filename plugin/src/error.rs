//! The plugin's error type and its mapping onto `ncclResult_t`.
//!
//! NCCL's guidance (`plugins/net/README.md`): `ncclSystemError` for network and hardware
//! failures, `ncclInternalError` for NCCL misusing the API, `ncclInvalidUsage` for user or
//! configuration errors, `ncclRemoteError` for failures of the peer or the fabric.

use crate::sys::{
    NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR,
    NCCL_SYSTEM_ERROR, NcclResult,
};
use std::fmt;

/// Which `ncclResult_t` an error is reported as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Network or hardware failure on this host (`ncclSystemError`).
    System,
    /// NCCL called the API wrongly, or a plugin bug (`ncclInternalError`).
    Internal,
    /// An argument is out of range for this ABI version (`ncclInvalidArgument`).
    InvalidArgument,
    /// User or configuration error (`ncclInvalidUsage`).
    InvalidUsage,
    /// The peer or the fabric failed (`ncclRemoteError`).
    Remote,
}

impl ErrorClass {
    /// The `ncclResult_t` value.
    pub fn code(self) -> NcclResult {
        match self {
            Self::System => NCCL_SYSTEM_ERROR,
            Self::Internal => NCCL_INTERNAL_ERROR,
            Self::InvalidArgument => NCCL_INVALID_ARGUMENT,
            Self::InvalidUsage => NCCL_INVALID_USAGE,
            Self::Remote => NCCL_REMOTE_ERROR,
        }
    }
}

/// An error returned by one of the plugin's entry points, with the text of its one log line.
///
/// One pointer wide (the fields are boxed): every data-path call returns a `NetResult`, and a
/// result that fits in registers is not copied through memory at each layer on the way up
/// (`benches/callgrind_pingpong.sh`). Errors are rare; the allocation is on the error path only.
#[derive(Debug)]
pub struct NetError(Box<Inner>);

#[derive(Debug)]
struct Inner {
    class: ErrorClass,
    message: String,
    /// Whether the error was already logged where it happened (so the entry point does not log
    /// it a second time).
    logged: bool,
}

impl NetError {
    /// A new error of `class` saying `message`.
    #[cold]
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self(Box::new(Inner {
            class,
            message: message.into(),
            logged: false,
        }))
    }

    /// NCCL misused the API (NULL or unknown handle, call out of order).
    pub fn misuse(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Internal, message)
    }

    /// An argument this ABI version cannot carry or that is out of range.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::InvalidArgument, message)
    }

    /// A user or configuration error.
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::InvalidUsage, message)
    }

    /// A local system or hardware failure.
    pub fn system(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::System, message)
    }

    /// The peer or fabric failed.
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Remote, message)
    }

    /// Mark as already logged.
    pub fn logged(mut self) -> Self {
        self.0.logged = true;
        self
    }

    /// Whether it was already logged.
    pub fn was_logged(&self) -> bool {
        self.0.logged
    }

    /// The class (and so the `ncclResult_t`).
    pub fn class(&self) -> ErrorClass {
        self.0.class
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for NetError {}

/// Result of a plugin entry point.
pub(crate) type NetResult<T> = Result<T, NetError>;

// The data path's results stay one register wide (see `NetError`).
const _: () = assert!(size_of::<NetResult<()>>() == size_of::<usize>());
