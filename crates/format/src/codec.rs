//! Little helpers for the compact binary encodings: LEB128 varints,
//! length-prefixed byte strings, fixed-width little-endian integers.
//! Decoding never panics on hostile input: every read is bounds-checked and
//! every length is checked against the bytes that remain.

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Input ended before the structure did.
    #[error("truncated: needed {needed} more bytes while reading {what}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// How many bytes were missing.
        needed: usize,
    },
    /// A field held a value outside its domain.
    #[error("invalid {what}: {value}")]
    BadValue {
        /// Field name.
        what: &'static str,
        /// The offending value.
        value: u64,
    },
    /// Wrong magic bytes or version.
    #[error("bad header: {0}")]
    BadHeader(&'static str),
    /// A structural invariant does not hold (unsorted names, bad name...).
    #[error("invalid structure: {0}")]
    Invalid(String),
    /// Bytes left over after the structure ended.
    #[error("{0} trailing bytes after the end of the structure")]
    Trailing(usize),
}

/// Appends encoded values to a buffer.
#[derive(Default)]
pub struct Writer {
    /// The encoded bytes so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(cap),
        }
    }
    /// Unsigned LEB128.
    pub fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }
    /// Zig-zag signed LEB128.
    pub fn svarint(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// Fixed 4 bytes little-endian.
    pub fn u32_le(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// Fixed 8 bytes little-endian.
    pub fn u64_le(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// Raw bytes, no length.
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// Varint length then bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }
}

/// Reads encoded values from a slice.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Fails unless everything was consumed.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
    /// `n` raw bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                what,
                needed: n - self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    /// Fixed 4 bytes little-endian.
    pub fn u32_le(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Fixed 8 bytes little-endian.
    pub fn u64_le(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// 32 raw bytes.
    pub fn id(&mut self, what: &'static str) -> Result<[u8; 32], DecodeError> {
        let b = self.take(32, what)?;
        let mut a = [0u8; 32];
        a.copy_from_slice(b);
        Ok(a)
    }
    /// Unsigned LEB128, at most 10 bytes, no overflow.
    pub fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8(what)?;
            let part = (b & 0x7f) as u64;
            if i == 9 && part > 1 {
                return Err(DecodeError::BadValue { what, value: part });
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::BadValue { what, value: v })
    }
    /// Varint that must fit a `u32`.
    pub fn varint_u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| DecodeError::BadValue { what, value: v })
    }
    /// Zig-zag signed LEB128.
    pub fn svarint(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        let v = self.varint(what)?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    /// Varint length then bytes; the length is checked against what remains
    /// before anything is allocated.
    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.varint(what)?;
        let n = usize::try_from(n).map_err(|_| DecodeError::BadValue { what, value: n })?;
        self.take(n, what)
    }
    /// A count of items each at least `min_item_len` bytes long, checked
    /// against the remaining input so hostile counts cannot force huge
    /// allocations.
    pub fn count(&mut self, what: &'static str, min_item_len: usize) -> Result<usize, DecodeError> {
        let n = self.varint(what)?;
        let max = self.remaining() / min_item_len.max(1);
        if n > max as u64 {
            return Err(DecodeError::BadValue { what, value: n });
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varint_roundtrip(v in any::<u64>(), s in any::<i64>()) {
            let mut w = Writer::default();
            w.varint(v);
            w.svarint(s);
            let mut r = Reader::new(&w.buf);
            prop_assert_eq!(r.varint("v").unwrap(), v);
            prop_assert_eq!(r.svarint("s").unwrap(), s);
            r.finish().unwrap();
        }

        #[test]
        fn reader_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = r.varint("a");
            let _ = r.bytes("b");
            let _ = r.count("c", 4);
            let _ = r.id("d");
        }
    }

    #[test]
    fn varint_vectors() {
        for (v, enc) in [
            (0u64, vec![0x00]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (300, vec![0xac, 0x02]),
            (
                u64::MAX,
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            let mut w = Writer::default();
            w.varint(v);
            assert_eq!(w.buf, enc, "varint {v}");
        }
        // An 11-byte or overflowing varint is rejected.
        let bad = [0xffu8; 11];
        assert!(Reader::new(&bad).varint("x").is_err());
    }
}
