//! Random bytes for listen ids and PSNs, from the kernel (`getrandom`).
//!
//! Unsafe: one `libc::getrandom` call into a caller-provided buffer.

#![allow(unsafe_code)]

/// Fill `buf` with random bytes; falls back to time and address entropy if `getrandom` fails
/// (the values need to be unpredictable enough to tell connections apart, not secret).
pub(crate) fn fill(buf: &mut [u8]) {
    // SAFETY: `buf` is valid for writes of its length.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(got).is_ok_and(|n| n == buf.len()) {
        return;
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (buf.as_ptr() as u64).rotate_left(32)
        ^ u64::from(std::process::id());
    let mut x = seed | 1;
    for byte in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
}

/// A random `u64`.
pub(crate) fn u64() -> u64 {
    let mut bytes = [0u8; 8];
    fill(&mut bytes);
    u64::from_le_bytes(bytes)
}
