//! CRC-32C (Castagnoli), bit by bit: the listen handle's corruption check.
//!
//! 60 bytes once per connection do not justify a table.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// CRC-32C of `bytes` (initial value and final xor all ones, as iSCSI and ext4 use it).
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (POLY & mask);
        }
    }
    !crc
}
