//! The group-setup message: the first message on every connection of a CollNet group, from the
//! connecting rank to the accepting one, so the acceptor learns which rank the connection comes
//! from and that it belongs to this group (a connection from elsewhere is dropped).
//!
//! Fixed 32 bytes, little-endian, validated like the handshake formats ([`crate::wire`]): every
//! reserved byte must be zero, and `decode(x)` succeeds only on `encode`'s output.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"RVTG"` |
//! | 4 | 2 | version ([`HELLO_VERSION`]) |
//! | 6 | 2 | reserved, zero |
//! | 8 | 4 | ranks in the group, `2..=MAX_RANKS` |
//! | 12 | 4 | the sender's rank, below the group size |
//! | 16 | 8 | group id ([`super::layout::group_id`]) |
//! | 24 | 8 | reserved, zero |

use super::layout::MAX_RANKS;
use core::fmt;

/// Bytes of a hello.
pub const HELLO_LEN: usize = 32;
/// The format's version.
pub const HELLO_VERSION: u16 = 1;
const MAGIC: [u8; 4] = *b"RVTG";

/// Who a connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Ranks in the group.
    pub nranks: u32,
    /// The sender's rank.
    pub rank: u32,
    /// The group's id.
    pub group: u64,
}

/// A hello that is not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelloError {
    /// Not `HELLO_LEN` bytes.
    Length(usize),
    /// Wrong magic: not a Rivet CollNet peer.
    Magic,
    /// Another version of the format.
    Version(u16),
    /// A reserved byte is not zero.
    Reserved,
    /// The group size or rank is out of range.
    Rank {
        /// Claimed group size.
        nranks: u32,
        /// Claimed rank.
        rank: u32,
    },
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length(n) => write!(f, "a group hello of {n} bytes (expected {HELLO_LEN})"),
            Self::Magic => f.write_str("not a Rivet CollNet group hello (bad magic)"),
            Self::Version(v) => write!(
                f,
                "group hello version {v}, this Rivet speaks {HELLO_VERSION}: mixed Rivet releases"
            ),
            Self::Reserved => f.write_str("a group hello with non-zero reserved bytes"),
            Self::Rank { nranks, rank } => {
                write!(f, "a group hello claiming rank {rank} of {nranks}")
            }
        }
    }
}

/// Why a well-formed hello is not admitted into this rank's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Another group (another `connect`, or a stale connection from an earlier one).
    OtherGroup {
        /// The hello's group id.
        group: u64,
        /// The hello's group size.
        nranks: u32,
    },
    /// It claims to be this rank.
    OwnRank(u32),
    /// That rank is connected already.
    Duplicate(u32),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OtherGroup { group, nranks } => {
                write!(
                    f,
                    "it belongs to another group ({group:#x} of {nranks} ranks)"
                )
            }
            Self::OwnRank(r) => write!(f, "it claims this rank ({r})"),
            Self::Duplicate(r) => write!(f, "rank {r} is connected already"),
        }
    }
}

impl Hello {
    /// Whether rank `me` of group `group` (of `nranks`) takes this connection, given which ranks
    /// are connected already: the sender's rank, or why not.
    pub fn admit(
        &self,
        group: u64,
        nranks: u32,
        me: u32,
        connected: impl Fn(u32) -> bool,
    ) -> Result<u32, Refusal> {
        if self.group != group || self.nranks != nranks {
            return Err(Refusal::OtherGroup {
                group: self.group,
                nranks: self.nranks,
            });
        }
        if self.rank == me {
            return Err(Refusal::OwnRank(me));
        }
        if connected(self.rank) {
            return Err(Refusal::Duplicate(self.rank));
        }
        Ok(self.rank)
    }

    /// The 32 bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&HELLO_VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&self.nranks.to_le_bytes());
        out[12..16].copy_from_slice(&self.rank.to_le_bytes());
        out[16..24].copy_from_slice(&self.group.to_le_bytes());
        out
    }

    /// Parse and validate a received hello.
    pub fn decode(bytes: &[u8]) -> Result<Self, HelloError> {
        let b: &[u8; HELLO_LEN] = bytes
            .try_into()
            .map_err(|_| HelloError::Length(bytes.len()))?;
        if b[0..4] != MAGIC {
            return Err(HelloError::Magic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != HELLO_VERSION {
            return Err(HelloError::Version(version));
        }
        if b[6..8] != [0, 0] || b[24..32] != [0; 8] {
            return Err(HelloError::Reserved);
        }
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let (nranks, rank) = (word(8), word(12));
        if !(2..=MAX_RANKS).contains(&nranks) || rank >= nranks {
            return Err(HelloError::Rank { nranks, rank });
        }
        let mut group = [0u8; 8];
        group.copy_from_slice(&b[16..24]);
        Ok(Self {
            nranks,
            rank,
            group: u64::from_le_bytes(group),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let h = Hello {
            nranks: 4,
            rank: 3,
            group: 0x1234_5678_9abc_def0,
        };
        let bytes = h.encode();
        assert_eq!(Hello::decode(&bytes), Ok(h));
        assert_eq!(Hello::decode(&bytes[..31]), Err(HelloError::Length(31)));
        let mut bad = bytes;
        bad[0] = b'X';
        assert_eq!(Hello::decode(&bad), Err(HelloError::Magic));
        let mut bad = bytes;
        bad[4] = 2;
        assert_eq!(Hello::decode(&bad), Err(HelloError::Version(2)));
        let mut bad = bytes;
        bad[30] = 1;
        assert_eq!(Hello::decode(&bad), Err(HelloError::Reserved));
        let bad = Hello {
            nranks: 4,
            rank: 4,
            group: 1,
        }
        .encode();
        assert_eq!(
            Hello::decode(&bad),
            Err(HelloError::Rank { nranks: 4, rank: 4 })
        );
        let bad = Hello {
            nranks: 1,
            rank: 0,
            group: 1,
        }
        .encode();
        assert!(Hello::decode(&bad).is_err());
    }

    #[test]
    fn admission() {
        let h = Hello {
            nranks: 4,
            rank: 2,
            group: 9,
        };
        assert_eq!(h.admit(9, 4, 0, |_| false), Ok(2));
        let other = Err(Refusal::OtherGroup {
            group: 9,
            nranks: 4,
        });
        assert_eq!(h.admit(8, 4, 0, |_| false), other);
        assert_eq!(h.admit(9, 5, 0, |_| false), other);
        assert_eq!(h.admit(9, 4, 2, |_| false), Err(Refusal::OwnRank(2)));
        assert_eq!(h.admit(9, 4, 0, |r| r == 2), Err(Refusal::Duplicate(2)));
    }
}
