//! The crate's error type.

use std::fmt;

/// Why a verbs operation failed.
///
/// Every variant that carries an `errno` prints the system's text for it. Values are cheap to
/// build (no allocation) except the loader variants, which only occur once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// `dlopen` of a library failed.
    Load {
        /// The library name or path given to `dlopen`.
        library: String,
        /// `dlerror()` text.
        detail: String,
    },
    /// A required symbol is missing from a loaded library.
    MissingSymbol {
        /// The library it was looked up in.
        library: String,
        /// The symbol.
        symbol: &'static str,
        /// `dlerror()` text.
        detail: String,
    },
    /// An optional entry point is absent from this libibverbs / provider.
    Unsupported {
        /// What is missing (a symbol or an ops slot).
        what: &'static str,
    },
    /// A verbs call failed.
    Call {
        /// The C function.
        call: &'static str,
        /// The errno it reported.
        errno: i32,
    },
    /// Memory registration failed.
    Register {
        /// The C function (`ibv_reg_mr_iova2`, `ibv_reg_mr` or `ibv_reg_dmabuf_mr`).
        call: &'static str,
        /// The errno it reported.
        errno: i32,
        /// Bytes that were to be registered.
        len: usize,
    },
    /// `post_send` / `post_recv` rejected a work request.
    Post {
        /// `ibv_post_send` or `ibv_post_recv`.
        call: &'static str,
        /// The errno it reported.
        errno: i32,
        /// Index of the first rejected WR in the caller's slice (later ones were not posted).
        bad_index: Option<usize>,
    },
    /// An argument was out of range before any C call was made.
    InvalidArgument {
        /// What was wrong.
        what: &'static str,
    },
}

/// Formats `errno` as `"<strerror text> (errno N)"`.
pub(crate) struct Errno(pub(crate) i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = std::io::Error::from_raw_os_error(self.0).to_string();
        // std appends " (os error N)"; keep only the strerror part and say errno ourselves.
        let text = text.split(" (os error").next().unwrap_or(&text);
        write!(f, "{text} (errno {})", self.0)
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Load { library, detail } => write!(f, "cannot load {library}: {detail}"),
            Self::MissingSymbol {
                library,
                symbol,
                detail,
            } => {
                write!(f, "{library} lacks required symbol {symbol}: {detail}")
            }
            Self::Unsupported { what } => {
                write!(f, "{what} is not available in this libibverbs/provider")
            }
            Self::Call { call, errno } => write!(f, "{call} failed: {}", Errno(*errno)),
            Self::Register { call, errno, len } => {
                write!(f, "{call} of {len} bytes failed: {}", Errno(*errno))?;
                if *errno == libc::ENOMEM || *errno == libc::EPERM {
                    f.write_str(
                        "; registered memory is pinned and counts against RLIMIT_MEMLOCK: \
                         check `ulimit -l` (it should be unlimited for RDMA)",
                    )?;
                }
                Ok(())
            }
            Self::Post {
                call,
                errno,
                bad_index,
            } => {
                write!(f, "{call} failed: {}", Errno(*errno))?;
                if let Some(i) = bad_index {
                    write!(f, " at work request {i}")?;
                }
                Ok(())
            }
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
        }
    }
}

impl std::error::Error for VerbsError {}

impl VerbsError {
    /// The errno, for variants that carry one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Call { errno, .. } | Self::Register { errno, .. } | Self::Post { errno, .. } => {
                Some(*errno)
            }
            _ => None,
        }
    }
}

/// The calling thread's current errno (0 if none is set).
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Turns a verbs `int` return into a result: 0 is success; a positive value is the errno itself
/// (most verbs return it directly); a negative value means "see errno".
pub(crate) fn check(call: &'static str, ret: i32) -> Result<(), VerbsError> {
    match ret {
        0 => Ok(()),
        r if r > 0 => Err(VerbsError::Call { call, errno: r }),
        r => {
            let errno = last_errno();
            Err(VerbsError::Call {
                call,
                errno: if errno != 0 { errno } else { -r },
            })
        }
    }
}

/// errno after a call that returned NULL; never 0, so the error always says something.
pub(crate) fn errno_after_null() -> i32 {
    match last_errno() {
        0 => libc::EIO,
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_error_names_the_call_and_strerror() {
        let e = VerbsError::Call {
            call: "ibv_modify_qp",
            errno: libc::EINVAL,
        };
        let s = e.to_string();
        assert!(
            s.starts_with("ibv_modify_qp failed: Invalid argument"),
            "{s}"
        );
        assert!(s.ends_with("(errno 22)"), "{s}");
        assert_eq!(e.errno(), Some(libc::EINVAL));
    }

    #[test]
    fn register_error_hints_at_memlock_for_enomem_and_eperm_only() {
        for errno in [libc::ENOMEM, libc::EPERM] {
            let s = VerbsError::Register {
                call: "ibv_reg_mr_iova2",
                errno,
                len: 4096,
            }
            .to_string();
            assert!(s.contains("ulimit -l"), "{s}");
            assert!(s.contains("4096 bytes"), "{s}");
        }
        let s = VerbsError::Register {
            call: "ibv_reg_mr",
            errno: libc::EINVAL,
            len: 1,
        }
        .to_string();
        assert!(!s.contains("ulimit"), "{s}");
    }

    #[test]
    fn post_error_reports_the_bad_index() {
        let s = VerbsError::Post {
            call: "ibv_post_send",
            errno: libc::ENOMEM,
            bad_index: Some(3),
        }
        .to_string();
        assert!(s.contains("Cannot allocate memory"), "{s}");
        assert!(s.ends_with("at work request 3"), "{s}");
    }

    #[test]
    fn check_maps_positive_returns_to_errno() {
        assert_eq!(check("x", 0), Ok(()));
        assert_eq!(
            check("x", libc::ETIMEDOUT),
            Err(VerbsError::Call {
                call: "x",
                errno: libc::ETIMEDOUT
            })
        );
        assert!(matches!(
            check("x", -1),
            Err(VerbsError::Call { call: "x", .. })
        ));
    }

    #[test]
    fn load_errors_name_the_library_and_symbol() {
        let s = VerbsError::MissingSymbol {
            library: "libibverbs.so.1".into(),
            symbol: "ibv_open_device",
            detail: "undefined symbol".into(),
        }
        .to_string();
        assert!(
            s.contains("libibverbs.so.1")
                && s.contains("ibv_open_device")
                && s.contains("undefined")
        );
    }
}
