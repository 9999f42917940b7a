//! Decoders of the data protocol: clear-to-send entries, completion records, immediates and
//! work-request ids. They must never panic, must reject what the encoder never produces, and
//! must round-trip what they accept.

use rivet_core::data::MAX_RECVS;
use rivet_core::data::codec::{CTS_ENTRY_LEN, CtsEntry, Imm, SizeRecord, WrId};
use rivet_core::nic::MAX_WR_BYTES;

/// One run of the target on libFuzzer's bytes.
pub fn check(data: &[u8]) {
    // Clear-to-send entry: the first 32 bytes (zero-padded).
    let mut entry = [0u8; CTS_ENTRY_LEN];
    let take = data.len().min(CTS_ENTRY_LEN);
    entry[..take].copy_from_slice(&data[..take]);
    if let Ok(decoded) = CtsEntry::decode(&entry) {
        assert!(decoded.n >= 1 && usize::from(decoded.n) <= MAX_RECVS);
        assert!(decoded.index < decoded.n);
        assert!(decoded.addr.checked_add(decoded.size).is_some());
        assert_eq!(decoded.encode(), entry, "entry round trip");
    }

    // Completion record: group size from the first byte, sizes from the rest.
    if let Some((&n, rest)) = data.split_first() {
        if let Ok(record) = SizeRecord::decode(rest, n) {
            assert!(usize::from(record.n) <= MAX_RECVS && record.n >= 1);
            assert!(record.sizes.iter().all(|&s| s <= MAX_WR_BYTES));
            let (bytes, len) = record.encode();
            assert_eq!(len, 4 * usize::from(n));
            assert_eq!(&bytes[..len], &rest[..len], "record round trip");
        }
    }

    // Immediate: the first 4 bytes.
    if data.len() >= 4 {
        let imm = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        if let Ok(decoded) = Imm::decode(imm) {
            assert!(decoded.n >= 1 && usize::from(decoded.n) <= MAX_RECVS);
            assert!(decoded.record || (decoded.n == 1 && !decoded.mismatch));
            assert_eq!(decoded.encode(), imm, "immediate round trip");
        }
    }

    // Work-request id: the first 8 bytes.
    if data.len() >= 8 {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&data[..8]);
        let wr_id = u64::from_le_bytes(raw);
        if let Ok(decoded) = WrId::decode(wr_id) {
            assert!(decoded.index < 256);
            assert_eq!(decoded.encode(), wr_id, "wr_id round trip");
        }
    }
}
