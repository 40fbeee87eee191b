//! The sizes a Parquet page header declares, read before the parquet crate reads it.
//!
//! The crate's page reader allocates a page's declared uncompressed size before it
//! decompresses a byte (`Vec::with_capacity(uncompressed_page_size)` in `decode_page`): a
//! damaged header declaring 1.4 GB aborted the reader on allocation (found by fuzzing,
//! fuzz/regressions/tier_points/oom-3eb8…). Its header type is not public, so this reads the
//! header's Thrift compact encoding itself, the way the crate does (parquet 60): the fields
//! it knows by their schema's types, whatever type the bytes claim, and the others skipped by
//! the type they claim. Where the two could take different bytes (a known field whose bytes
//! claim another type, a size given twice) the header is refused, so that a header passed
//! here declares to the crate the sizes it declared here.

/// Most bytes a page may declare, compressed or not. The writer's pages hold at most
/// [`crate::schema::PAGE_ROWS`] rows and about 1 MiB (the parquet crate's default page and
/// dictionary limits, passed by up to one batch of rows): a page past this is damaged.
pub const MAX_PAGE_BYTES: i64 = 16 << 20;

/// Nesting a page header needs is 3 (a data page header's statistics); more is damaged.
const MAX_DEPTH: usize = 8;

/// What a page header declares: its own length in bytes and the page's sizes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageSizes {
    pub header_len: usize,
    pub uncompressed: i64,
    pub compressed: i64,
}

/// The types of the fields the parquet crate reads, by id, in a page header and the headers
/// nested in it (without statistics, which it skips).
const PAGE_HEADER: &[(i16, Field)] = &[
    (1, Field::I32),
    (2, Field::I32),
    (3, Field::I32),
    (4, Field::I32),
    (5, Field::Struct(DATA_PAGE_HEADER)),
    (6, Field::Struct(&[])),
    (7, Field::Struct(DICTIONARY_PAGE_HEADER)),
    (8, Field::Struct(DATA_PAGE_HEADER_V2)),
];
const DATA_PAGE_HEADER: &[(i16, Field)] = &[(1, Field::I32), (2, Field::I32), (3, Field::I32), (4, Field::I32)];
const DICTIONARY_PAGE_HEADER: &[(i16, Field)] = &[(1, Field::I32), (2, Field::I32), (3, Field::Bool)];
const DATA_PAGE_HEADER_V2: &[(i16, Field)] = &[
    (1, Field::I32),
    (2, Field::I32),
    (3, Field::I32),
    (4, Field::I32),
    (5, Field::I32),
    (6, Field::I32),
    (7, Field::Bool),
];

#[derive(Clone, Copy, Debug)]
enum Field {
    I32,
    Bool,
    Struct(&'static [(i16, Field)]),
}

/// Reads the page header at the start of `bytes` and checks the sizes it declares: each given
/// once, not negative, and at most [`MAX_PAGE_BYTES`].
pub fn page_sizes(bytes: &[u8]) -> Result<PageSizes, String> {
    let mut r = Reader { bytes, at: 0 };
    let (mut uncompressed, mut compressed) = (None, None);
    r.read_struct(PAGE_HEADER, 0, &mut |id, value| {
        let (size, what) = match id {
            2 => (&mut uncompressed, "uncompressed"),
            3 => (&mut compressed, "compressed"),
            _ => return Ok(()),
        };
        if !(0..=MAX_PAGE_BYTES).contains(&value) {
            return Err(format!("a page header declares {value} {what} bytes, outside 0..={MAX_PAGE_BYTES}"));
        }
        if size.replace(value).is_some() {
            return Err(format!("a page header declares its {what} size twice"));
        }
        Ok(())
    })?;
    let (Some(uncompressed), Some(compressed)) = (uncompressed, compressed) else {
        return Err("a page header lacks its sizes".into());
    };
    Ok(PageSizes { header_len: r.at, uncompressed, compressed })
}

// Thrift compact protocol types.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const I8: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.bytes.get(self.at).ok_or("a page header ends early")?;
        self.at += 1;
        Ok(b)
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err("a page header ends early".into());
        }
        self.at += n as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift.min(63);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a page header holds a varint longer than 10 bytes".into())
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next field's id and type, or `None` at the struct's end.
    fn field_header(&mut self, last_id: i16) -> Result<Option<(i16, u8)>, String> {
        let b = self.byte()?;
        let kind = b & 0x0f;
        if kind == 0 {
            return Ok(None);
        }
        let delta = (b >> 4) as i16;
        let id = if delta == 0 {
            i16::try_from(self.zigzag()?).map_err(|_| "a page header's field id overflows")?
        } else {
            last_id.checked_add(delta).ok_or("a page header's field id overflows")?
        };
        Ok(Some((id, kind)))
    }

    /// Reads a struct whose fields `known` the parquet crate reads by type, skipping the
    /// others; hands each i32 field of the outermost struct to `top`.
    fn read_struct(
        &mut self,
        known: &[(i16, Field)],
        depth: usize,
        top: &mut dyn FnMut(i16, i64) -> Result<(), String>,
    ) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("a page header nests values more than {MAX_DEPTH} deep"));
        }
        let mut last_id = 0;
        while let Some((id, kind)) = self.field_header(last_id)? {
            last_id = id;
            let Some(&(_, field)) = known.iter().find(|(k, _)| *k == id) else {
                self.skip(kind, depth + 1)?;
                continue;
            };
            let claimed = match field {
                Field::I32 => kind == I32,
                Field::Bool => matches!(kind, BOOL_TRUE | BOOL_FALSE),
                Field::Struct(_) => kind == STRUCT,
            };
            if !claimed {
                let wanted = match field {
                    Field::I32 => "an i32",
                    Field::Bool => "a boolean",
                    Field::Struct(_) => "a struct",
                };
                return Err(format!("a page header's field {id} is of type {kind}, not {wanted}"));
            }
            match field {
                // The crate keeps the low 32 bits of a longer varint.
                Field::I32 if depth == 0 => top(id, i64::from(self.zigzag()? as i32))?,
                Field::I32 => drop(self.varint()?),
                Field::Bool => {}
                Field::Struct(fields) => self.read_struct(fields, depth + 1, &mut |_, _| Ok(()))?,
            }
        }
        Ok(())
    }

    /// Skips one value of type `kind` as the parquet crate does, nested `depth` deep.
    fn skip(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("a page header nests values more than {MAX_DEPTH} deep"));
        }
        match kind {
            BOOL_TRUE | BOOL_FALSE => Ok(()),
            I8 => self.advance(1),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.advance(8),
            UUID => self.advance(16),
            BINARY => {
                let n = self.varint()?;
                self.advance(n)
            }
            LIST | SET => {
                let b = self.byte()?;
                let n = match b >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.skip_each(n, &[b & 0x0f], depth)
            }
            MAP => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let b = self.byte()?;
                self.skip_each(n, &[b >> 4, b & 0x0f], depth)
            }
            STRUCT => self.read_struct(&[], depth, &mut |_, _| Ok(())),
            other => Err(format!("a page header holds a value of unknown type {other}")),
        }
    }

    /// Skips `n` elements, each a value of every type in `kinds`. The parquet crate skips a
    /// boolean element as no bytes (the compact protocol gives it one) and would loop over a
    /// count of them taking none: a count past the bytes left is damaged.
    fn skip_each(&mut self, n: u64, kinds: &[u8], depth: usize) -> Result<(), String> {
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(format!("a page header declares {n} elements in fewer bytes"));
        }
        for _ in 0..n {
            for &kind in kinds {
                self.skip(kind, depth + 1)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data page header as the parquet crate writes one: type, both sizes, then a nested
    /// data page header with a struct (statistics) inside.
    fn header(uncompressed: i64, compressed: i64) -> Vec<u8> {
        let zigzag = |v: i64| {
            let mut z = ((v << 1) ^ (v >> 63)) as u64;
            let mut out = Vec::new();
            loop {
                if z < 0x80 {
                    out.push(z as u8);
                    return out;
                }
                out.push((z as u8 & 0x7f) | 0x80);
                z >>= 7;
            }
        };
        let mut h = vec![0x15];
        h.extend(zigzag(0));
        h.push(0x15);
        h.extend(zigzag(uncompressed));
        h.push(0x15);
        h.extend(zigzag(compressed));
        // Field 5 (delta 2), a struct: num_values, encodings, and statistics with a binary.
        h.extend([0x2c, 0x15, 0x08, 0x15, 0x00, 0x15, 0x06, 0x15, 0x06, 0x5c, 0x18, 0x02, 0xab, 0xcd, 0x00, 0x00]);
        h.push(0x00);
        h
    }

    #[test]
    fn the_sizes_of_a_well_formed_header_are_read_past_its_nested_fields() {
        let mut bytes = header(1000, 300);
        let len = bytes.len();
        bytes.extend([0xff; 300]);
        assert_eq!(page_sizes(&bytes), Ok(PageSizes { header_len: len, uncompressed: 1000, compressed: 300 }));
    }

    #[test]
    fn a_page_declaring_more_than_the_bound_is_refused_before_anything_is_allocated() {
        let err = page_sizes(&header(1_396_079_267, 300)).unwrap_err();
        assert!(err.contains("1396079267 uncompressed bytes"), "{err}");
        assert!(page_sizes(&header(100, -1)).unwrap_err().contains("-1 compressed"));
    }

    #[test]
    fn damaged_headers_are_errors() {
        let good = header(10, 10);
        for cut in 0..good.len() {
            assert!(page_sizes(&good[..cut]).is_err(), "cut at {cut}");
        }
        // Field 2 twice, the second time by its id in full.
        let twice = [0x15, 0x00, 0x15, 0x02, 0x15, 0x02, 0x05, 0x04, 0x02, 0x00];
        assert!(page_sizes(&twice).unwrap_err().contains("uncompressed size twice"));
        // A list declaring a billion elements in three bytes.
        assert!(page_sizes(&[0x99, 0xf5, 0x80, 0x94, 0xeb, 0xdc, 0x03, 0x00]).unwrap_err().contains("elements"));
        // Structs nested past the bound.
        let mut deep = vec![0x9c];
        deep.extend([0x1c; 20]);
        assert!(page_sizes(&deep).unwrap_err().contains("deep"));
        assert!(page_sizes(&[0x9e, 0x00]).unwrap_err().contains("unknown type 14"));
        // Field 3 claiming to be a boolean: the parquet crate reads an i32 from the next byte.
        assert!(page_sizes(&[0x15, 0x04, 0x15, 0x02, 0x12, 0x00, 0x00]).unwrap_err().contains("field 3 is of type 2"));
    }
}
