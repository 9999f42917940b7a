//! Why a decoder rejected its input.

use core::fmt;

use super::{MessageKind, RivetVersion, WIRE_VERSION};

/// Up to four bytes found where a magic was expected (fewer when only a prefix had arrived).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MagicBytes {
    bytes: [u8; 4],
    len: u8,
}

impl MagicBytes {
    /// The first `min(bytes.len(), 4)` bytes of `bytes`.
    pub fn new(bytes: &[u8]) -> Self {
        let mut out = [0; 4];
        let mut len = 0;
        for (slot, byte) in out.iter_mut().zip(bytes) {
            *slot = *byte;
            len += 1;
        }
        Self { bytes: out, len }
    }

    /// The bytes found.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl fmt::Display for MagicBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("0x")?;
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(" \"")?;
        for &byte in self.as_bytes() {
            let shown = if byte.is_ascii_graphic() {
                char::from(byte)
            } else {
                '.'
            };
            write!(f, "{shown}")?;
        }
        f.write_str("\"")
    }
}

/// Why bytes were not a valid listen handle, frame or endpoint description.
///
/// `what` fields name the structure being decoded (`"listen handle"`, `"frame header"`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the structure needs.
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        found: usize,
    },
    /// The magic is not ours: the bytes are not from Rivet, or not this kind of structure.
    BadMagic {
        /// The structure being decoded.
        what: &'static str,
        /// The magic it must start with.
        expected: [u8; 4],
        /// What was there instead (possibly only the first bytes of it).
        found: MagicBytes,
    },
    /// The peer speaks another wire version: the two ranks run incompatible Rivet releases.
    VersionMismatch {
        /// The structure being decoded.
        what: &'static str,
        /// Our [`WIRE_VERSION`].
        ours: u16,
        /// The version the peer wrote.
        theirs: u16,
        /// The peer's Rivet release, when the structure carries it in its permanent prefix.
        their_rivet: Option<RivetVersion>,
    },
    /// The listen handle's checksum does not match its contents: it was corrupted in transit.
    BadChecksum {
        /// The checksum stored in the handle.
        found: u32,
        /// The checksum of the handle's contents.
        computed: u32,
    },
    /// The frame header names a message kind this wire version does not define.
    UnknownKind {
        /// The kind code found.
        found: u8,
    },
    /// The frame header declares a body longer than any message may be.
    Oversize {
        /// The declared body length.
        declared: u32,
        /// [`MAX_BODY_LEN`](super::MAX_BODY_LEN).
        max: u32,
    },
    /// The frame header declares a body length that is wrong for its message kind.
    BadLength {
        /// The message kind.
        kind: MessageKind,
        /// The declared body length.
        declared: u32,
        /// The body length of this kind.
        expected: u32,
    },
    /// A field holds a value outside its range (reserved bytes included).
    BadField {
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
        /// What the field must hold.
        expected: &'static str,
    },
    /// More bytes follow a complete structure.
    TrailingBytes {
        /// The structure decoded.
        what: &'static str,
        /// How many bytes are left over.
        extra: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated {
                what,
                needed,
                found,
            } => {
                write!(f, "truncated {what}: needs {needed} bytes, found {found}")
            }
            Self::BadMagic {
                what,
                expected,
                found,
            } => write!(
                f,
                "bad magic in {what}: found {found}, expected {} (not a Rivet peer, or corrupted)",
                MagicBytes::new(expected)
            ),
            Self::VersionMismatch {
                what,
                ours,
                theirs,
                their_rivet,
            } => {
                let age = if theirs > ours { "newer" } else { "older" };
                write!(
                    f,
                    "wire version mismatch in {what}: the peer speaks version {theirs} ({age}"
                )?;
                if let Some(rivet) = their_rivet {
                    write!(f, ", Rivet {rivet}")?;
                }
                write!(
                    f,
                    "), we speak version {ours} (Rivet {}); run the same Rivet release on every rank",
                    RivetVersion::ours()
                )
            }
            Self::BadChecksum { found, computed } => write!(
                f,
                "listen handle checksum mismatch: stored {found:#010x}, computed {computed:#010x} (the handle was corrupted)"
            ),
            Self::UnknownKind { found } => write!(
                f,
                "unknown message kind {found} in frame header (wire version {WIRE_VERSION} defines 1..=4)"
            ),
            Self::Oversize { declared, max } => write!(
                f,
                "frame header declares a body of {declared} bytes, more than the maximum {max}"
            ),
            Self::BadLength {
                kind,
                declared,
                expected,
            } => write!(
                f,
                "frame header declares a {kind} body of {declared} bytes, expected {expected}"
            ),
            Self::BadField {
                field,
                value,
                expected,
            } => {
                write!(
                    f,
                    "bad {field}: found {value} ({value:#x}), expected {expected}"
                )
            }
            Self::TrailingBytes { what, extra } => {
                write!(f, "{extra} unexpected bytes after a complete {what}")
            }
        }
    }
}

impl core::error::Error for WireError {}
