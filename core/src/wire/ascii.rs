//! Short printable-ASCII strings with a fixed maximum length, carried zero-padded on the wire.

use core::fmt;

use super::WireError;

macro_rules! short_ascii {
    ($(#[$doc:meta])* $name:ident, $max:expr, $field:literal, $expected:literal) => {
        $(#[$doc])*
        ///
        /// Always 1..=`MAX_LEN` bytes of printable ASCII without spaces (`'!'..='~'`), so it is
        /// safe to put in a log line.
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name {
            len: u8,
            bytes: [u8; $max],
        }

        impl $name {
            /// Longest accepted string, in bytes.
            pub const MAX_LEN: usize = $max;

            /// Validates `s`.
            pub fn new(s: &str) -> Result<Self, WireError> {
                let raw = s.as_bytes();
                let len = u8::try_from(raw.len())
                    .ok()
                    .filter(|&len| (1..=$max).contains(&usize::from(len)))
                    .ok_or(WireError::BadField {
                        field: concat!($field, " length"),
                        value: raw.len() as u64,
                        expected: $expected,
                    })?;
                let mut bytes = [0; $max];
                for (slot, byte) in bytes.iter_mut().zip(raw) {
                    *slot = *byte;
                }
                Self::from_wire(len, bytes)
            }

            /// Validates the wire form: a length and the zero-padded bytes.
            pub(crate) fn from_wire(len: u8, bytes: [u8; $max]) -> Result<Self, WireError> {
                let n = usize::from(len);
                if !(1..=$max).contains(&n) {
                    return Err(WireError::BadField {
                        field: concat!($field, " length"),
                        value: u64::from(len),
                        expected: $expected,
                    });
                }
                for (i, &byte) in bytes.iter().enumerate() {
                    let ok = if i < n { byte.is_ascii_graphic() } else { byte == 0 };
                    if !ok {
                        return Err(WireError::BadField {
                            field: if i < n {
                                concat!($field, " byte")
                            } else {
                                concat!($field, " padding")
                            },
                            value: u64::from(byte),
                            expected: if i < n { "printable ASCII ('!'..='~')" } else { "0" },
                        });
                    }
                }
                Ok(Self { len, bytes })
            }

            /// The length byte of the wire form.
            pub(crate) fn wire_len(&self) -> u8 {
                self.len
            }

            /// The zero-padded bytes of the wire form.
            pub(crate) fn wire_bytes(&self) -> &[u8; $max] {
                &self.bytes
            }

            /// The string.
            pub fn as_str(&self) -> &str {
                let bytes = self.bytes.get(..usize::from(self.len)).unwrap_or(&[]);
                // Always ASCII by construction; the fallback is unreachable.
                core::str::from_utf8(bytes).unwrap_or("?")
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.as_str())
            }
        }
    };
}

short_ascii!(
    /// Name of a NIC (for example `mlx5_0`), for log lines.
    DeviceName,
    32,
    "device name",
    "1..=32 bytes"
);

short_ascii!(
    /// A Rivet release (`CARGO_PKG_VERSION`, for example `0.1.0`), for error messages.
    RivetVersion,
    16,
    "Rivet version",
    "1..=16 bytes"
);

impl RivetVersion {
    /// The release of this build (`CARGO_PKG_VERSION`, cut to 16 bytes).
    pub fn ours() -> Self {
        let full = env!("CARGO_PKG_VERSION");
        let cut = full.get(..full.len().min(Self::MAX_LEN)).unwrap_or(full);
        Self::new(cut).unwrap_or(Self {
            len: 1,
            bytes: *b"?\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        })
    }
}
