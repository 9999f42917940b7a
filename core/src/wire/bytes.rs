//! Little-endian cursor helpers shared by the decoders. Reads never panic: running past the end
//! is a [`WireError::Truncated`].

use super::WireError;

/// Reads fields in order from a byte slice.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`, which hold a `what` (named in errors).
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self {
            bytes,
            pos: 0,
            what,
        }
    }

    /// The next `N` bytes.
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let end = self.pos.saturating_add(N);
        let slice = self.bytes.get(self.pos..end).ok_or(WireError::Truncated {
            what: self.what,
            needed: end,
            found: self.bytes.len(),
        })?;
        let mut out = [0; N];
        for (slot, byte) in out.iter_mut().zip(slice) {
            *slot = *byte;
        }
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads `N` reserved bytes, which must all be zero.
    /// One byte that is 0 or 1 (a flag whose other bits are reserved).
    pub(crate) fn flag(&mut self, field: &'static str) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(WireError::BadField {
                field,
                value: u64::from(b),
                expected: "0 or 1",
            }),
        }
    }

    pub(crate) fn reserved<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<(), WireError> {
        let bytes = self.array::<N>()?;
        match bytes.iter().find(|&&b| b != 0) {
            Some(&b) => Err(WireError::BadField {
                field,
                value: u64::from(b),
                expected: "0",
            }),
            None => Ok(()),
        }
    }

    /// Fails with [`WireError::TrailingBytes`] unless every byte was read.
    pub(crate) fn finish(self) -> Result<(), WireError> {
        match self.bytes.len().saturating_sub(self.pos) {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes {
                what: self.what,
                extra,
            }),
        }
    }
}
