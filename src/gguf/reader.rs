//! A bounded little-endian cursor over a byte slice.
//!
//! Every read checks the remaining length first and reports a [`Short`] read
//! (offset, bytes needed, file length) instead of indexing out of bounds; the
//! parser attaches the key/tensor context to turn it into a [`GgufError`].
//! Nothing here can panic: all arithmetic is checked and all slicing goes
//! through `get`.

use super::error::GgufError;

/// A read that ran past the end of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Short {
    pub offset: u64,
    pub needed: u64,
    pub file_len: u64,
}

impl Short {
    /// Names what was being read, producing the user-facing error.
    pub fn context(self, context: impl Into<String>) -> GgufError {
        GgufError::Truncated {
            context: context.into(),
            offset: self.offset,
            needed: self.needed,
            file_len: self.file_len,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

macro_rules! read_le {
    ($name:ident, $t:ty) => {
        #[doc = concat!("Reads a little-endian `", stringify!($t), "`.")]
        pub fn $name(&mut self) -> Result<$t, Short> {
            let b = self.bytes(std::mem::size_of::<$t>() as u64)?;
            let mut a = [0u8; std::mem::size_of::<$t>()];
            a.copy_from_slice(b);
            Ok(<$t>::from_le_bytes(a))
        }
    };
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Current offset from the start of the buffer.
    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes left after the cursor.
    pub fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn short(&self, needed: u64) -> Short {
        Short {
            offset: self.pos as u64,
            needed,
            file_len: self.buf.len() as u64,
        }
    }

    /// Takes the next `n` bytes (zero-copy).
    pub fn bytes(&mut self, n: u64) -> Result<&'a [u8], Short> {
        if n > self.remaining() {
            return Err(self.short(n));
        }
        // n <= remaining <= usize::MAX, so the casts and the addition are exact.
        let end = self.pos + n as usize;
        let out = self.buf.get(self.pos..end).ok_or_else(|| self.short(n))?;
        self.pos = end;
        Ok(out)
    }

    /// Fails (without moving) unless `n` more bytes are available; used to reject
    /// impossible element counts before looping or allocating.
    pub fn require(&self, n: u64) -> Result<(), Short> {
        if n > self.remaining() {
            Err(self.short(n))
        } else {
            Ok(())
        }
    }

    read_le!(u8, u8);
    read_le!(i8, i8);
    read_le!(u16, u16);
    read_le!(i16, i16);
    read_le!(u32, u32);
    read_le!(i32, i32);
    read_le!(u64, u64);
    read_le!(i64, i64);
    read_le!(f32, f32);
    read_le!(f64, f64);

    /// A GGUF string: u64 byte length, then the bytes (not NUL-terminated, not
    /// yet UTF-8 checked). The `Short` of an oversized length points at the
    /// bytes, after the length field.
    pub fn string_bytes(&mut self) -> Result<&'a [u8], Short> {
        let n = self.u64()?;
        self.bytes(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_in_order() {
        let buf = [1u8, 0x34, 0x12, 0x78, 0x56, 0x34, 0x12, 0xff];
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(0x1234));
        assert_eq!(r.u32(), Ok(0x1234_5678));
        assert_eq!(r.i8(), Ok(-1));
        assert_eq!(r.remaining(), 0);
        assert_eq!(
            r.u8(),
            Err(Short {
                offset: 8,
                needed: 1,
                file_len: 8
            })
        );
    }

    #[test]
    fn short_read_does_not_advance() {
        let buf = [0u8; 6];
        let mut r = Reader::new(&buf);
        r.u16().unwrap();
        assert_eq!(
            r.u64(),
            Err(Short {
                offset: 2,
                needed: 8,
                file_len: 6
            })
        );
        assert_eq!(r.pos(), 2);
        assert_eq!(r.u32(), Ok(0));
        assert!(r.u8().is_err());
    }

    #[test]
    fn huge_lengths_fail_without_overflow() {
        let mut buf = u64::MAX.to_le_bytes().to_vec();
        buf.extend_from_slice(b"abc");
        let mut r = Reader::new(&buf);
        assert_eq!(
            r.string_bytes(),
            Err(Short {
                offset: 8,
                needed: u64::MAX,
                file_len: 11
            })
        );
        let mut r = Reader::new(&buf);
        assert!(r.bytes(u64::MAX).is_err());
        assert!(r.require(12).is_err());
        assert!(r.require(11).is_ok());
    }

    #[test]
    fn strings_and_floats() {
        let mut buf = 3u64.to_le_bytes().to_vec();
        buf.extend_from_slice(b"hey");
        buf.extend_from_slice(&1.5f32.to_le_bytes());
        buf.extend_from_slice(&(-2.25f64).to_le_bytes());
        let mut r = Reader::new(&buf);
        assert_eq!(r.string_bytes(), Ok(&b"hey"[..]));
        assert_eq!(r.f32(), Ok(1.5));
        assert_eq!(r.f64(), Ok(-2.25));
        assert!(r.is_empty() || r.remaining() == 0);
    }

    #[test]
    fn empty_buffer() {
        let mut r = Reader::new(&[]);
        assert!(r.is_empty());
        assert_eq!(r.bytes(0), Ok(&[][..]));
        assert_eq!(
            r.u8(),
            Err(Short {
                offset: 0,
                needed: 1,
                file_len: 0
            })
        );
        assert_eq!(
            Short {
                offset: 0,
                needed: 1,
                file_len: 0
            }
            .context("magic")
            .to_string(),
            "truncated file: magic needs 1 bytes at offset 0, file has 0"
        );
    }
}
