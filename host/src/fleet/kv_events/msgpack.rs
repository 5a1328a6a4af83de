//! A msgpack reader over one payload, value by value, without building a tree: the token ids
//! of a stored block, most of a message's bytes, go straight into their list.

use rmpv::Value;

/// Nesting a skipped value may have; deeper is malformed.
const MAX_DEPTH: usize = 64;

pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// What the next value is, as far as the decoder cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nil,
    Array(usize),
    Map(usize),
    Other,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.bytes.get(self.at).ok_or("the message ends early")?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or("the message ends early")?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn be(&mut self, n: usize) -> Result<u64, String> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// The kind of the next value, without reading it (a container's length is read).
    pub fn peek(&mut self) -> Result<Kind, String> {
        let marker = *self.bytes.get(self.at).ok_or("the message ends early")?;
        Ok(match marker {
            0xc0 => Kind::Nil,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array(0),
            0x80..=0x8f | 0xde | 0xdf => Kind::Map(0),
            _ => Kind::Other,
        })
    }

    pub fn nil(&mut self) -> Result<bool, String> {
        if self.peek()? == Kind::Nil {
            self.at += 1;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn array(&mut self) -> Result<usize, String> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok(usize::from(m & 0x0f)),
            0xdc => Ok(self.be(2)? as usize),
            0xdd => Ok(self.be(4)? as usize),
            _ => Err("a list was expected".into()),
        }
    }

    pub fn map(&mut self) -> Result<usize, String> {
        match self.byte()? {
            m @ 0x80..=0x8f => Ok(usize::from(m & 0x0f)),
            0xde => Ok(self.be(2)? as usize),
            0xdf => Ok(self.be(4)? as usize),
            _ => Err("a map was expected".into()),
        }
    }

    pub fn str(&mut self) -> Result<&'a str, String> {
        let n = match self.byte()? {
            m @ 0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return Err("text was expected".into()),
        };
        std::str::from_utf8(self.take(n)?).map_err(|_| "text that is not UTF-8".into())
    }

    /// An integer as its 64 bits (a negative one as its two's complement).
    pub fn int(&mut self) -> Result<u64, String> {
        Ok(match self.byte()? {
            m @ 0x00..=0x7f => u64::from(m),
            m @ 0xe0..=0xff => i64::from(m as i8) as u64,
            0xcc => self.be(1)?,
            0xcd => self.be(2)?,
            0xce => self.be(4)?,
            0xcf => self.be(8)?,
            0xd0 => i64::from(self.be(1)? as u8 as i8) as u64,
            0xd1 => i64::from(self.be(2)? as u16 as i16) as u64,
            0xd2 => i64::from(self.be(4)? as u32 as i32) as u64,
            0xd3 => self.be(8)?,
            _ => return Err("an integer was expected".into()),
        })
    }

    /// A non-negative integer.
    pub fn uint(&mut self) -> Result<u64, String> {
        let negative = matches!(self.bytes.get(self.at), Some(0xe0..=0xff | 0xd0..=0xd3));
        let value = self.int()?;
        if negative && (value as i64) < 0 {
            return Err("a negative number where none may be".into());
        }
        Ok(value)
    }

    /// Bytes (`bin`), or `None` when the next value is not bytes (nothing is read then).
    pub fn bin(&mut self) -> Result<Option<&'a [u8]>, String> {
        let n = match self.bytes.get(self.at) {
            Some(0xc4) => {
                self.at += 1;
                self.be(1)?
            }
            Some(0xc5) => {
                self.at += 1;
                self.be(2)?
            }
            Some(0xc6) => {
                self.at += 1;
                self.be(4)?
            }
            _ => return Ok(None),
        };
        self.take(n as usize).map(Some)
    }

    /// Reads past the next value, whatever it is.
    pub fn skip(&mut self) -> Result<(), String> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("values nested too deep".into());
        }
        let marker = self.byte()?;
        let (items, bytes) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (2 * usize::from(marker & 0x0f), 0),
            0x90..=0x9f => (usize::from(marker & 0x0f), 0),
            0xa0..=0xbf => (0, usize::from(marker & 0x1f)),
            0xc4 | 0xd9 => (0, self.be(1)? as usize),
            0xc5 | 0xda => (0, self.be(2)? as usize),
            0xc6 | 0xdb => (0, self.be(4)? as usize),
            0xc7 => (0, self.be(1)? as usize + 1),
            0xc8 => (0, self.be(2)? as usize + 1),
            0xc9 => (0, self.be(4)? as usize + 1),
            0xca => (0, 4),
            0xcb => (0, 8),
            0xcc | 0xd0 => (0, 1),
            0xcd | 0xd1 => (0, 2),
            0xce | 0xd2 => (0, 4),
            0xcf | 0xd3 => (0, 8),
            0xd4 => (0, 2),
            0xd5 => (0, 3),
            0xd6 => (0, 5),
            0xd7 => (0, 9),
            0xd8 => (0, 17),
            0xdc => (self.be(2)? as usize, 0),
            0xdd => (self.be(4)? as usize, 0),
            0xde => (2 * self.be(2)? as usize, 0),
            0xdf => (2 * self.be(4)? as usize, 0),
            0xc1 => return Err("not msgpack (marker 0xc1)".into()),
        };
        self.take(bytes)?;
        for _ in 0..items {
            self.skip_at(depth + 1)?;
        }
        Ok(())
    }

    /// The next value as a tree, for the rare fields of any shape.
    pub fn value(&mut self) -> Result<Value, String> {
        let start = self.at;
        self.skip()?;
        let mut raw = &self.bytes[start..self.at];
        rmpv::decode::read_value(&mut raw).map_err(|e| format!("not msgpack: {e}"))
    }
}
