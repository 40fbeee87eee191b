//! The `FORMAT` file: which on-disk format version a data directory holds. It carries a
//! checksum so that a damaged file (a flipped bit) is told apart from one that names a version
//! this build cannot read: the first is repaired at open, the second refused.

/// Where the file lives, relative to the data directory.
pub(super) const PATH: &str = "FORMAT";

const FIRST_LINE: &str = "timeshard-store";

/// What a directory's `FORMAT` file says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Declared {
    /// A version, with a checksum that matches (`checked`) or from a build that wrote none.
    Version { version: u32, checked: bool },
    /// The file is not what any build wrote: why.
    Damaged(String),
}

/// The file's contents for `version`. Builds that predate the checksum read only the
/// `format` line, so they still read this.
pub(super) fn body(version: u32) -> String {
    let head = format!("{FIRST_LINE}\nformat {version}\n");
    let crc = crc32c::crc32c(head.as_bytes());
    format!("{head}crc {crc:08x}\n")
}

/// Reads the file's bytes. Bounded: it looks at no more than the few lines a build writes.
pub(super) fn parse(bytes: &[u8]) -> Declared {
    const MAX_LEN: usize = 256;
    if bytes.len() > MAX_LEN {
        return Declared::Damaged(format!("it is {} bytes long, more than any build writes", bytes.len()));
    }
    let text = String::from_utf8_lossy(bytes);
    let version = text.lines().find_map(|l| l.strip_prefix("format ")).and_then(|v| v.trim().parse::<u32>().ok());
    // Found in the bytes, not in `text`: a lossy decoding replaces each invalid byte with three,
    // so an index into `text` can lie past the end of `bytes` (found by fuzzing,
    // fuzz/regressions/store_open/crash-02f9…).
    let crc_at = bytes.windows(5).position(|w| w == b"\ncrc ").map(|i| i + 1);
    match (version, crc_at) {
        (Some(version), None) if text.starts_with(FIRST_LINE) => Declared::Version { version, checked: false },
        (_, Some(at)) => {
            let declared =
                std::str::from_utf8(&bytes[at + 4..]).ok().and_then(|v| u32::from_str_radix(v.trim(), 16).ok());
            let actual = crc32c::crc32c(&bytes[..at]);
            match (version, declared) {
                (Some(version), Some(crc)) if crc == actual => Declared::Version { version, checked: true },
                _ => Declared::Damaged(format!("its checksum does not match (it reads {text:?})")),
            }
        }
        _ => Declared::Damaged(format!("it does not name a format version (it reads {text:?})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_build_writes_reads_back_checked() {
        for v in [1, 2, 7] {
            assert_eq!(parse(body(v).as_bytes()), Declared::Version { version: v, checked: true });
        }
    }

    /// Found by fuzzing (fuzz/regressions/store_open/crash-02f9…): invalid UTF-8 before the
    /// `crc` line made the line's index in the lossy text lie past the end of the bytes, and
    /// opening the store panicked on a damaged FORMAT file instead of repairing it.
    #[test]
    fn invalid_utf8_before_the_checksum_line_is_damage_not_a_panic() {
        let bytes =
            include_bytes!("../../../../fuzz/regressions/store_open/crash-02f957e9d8b2da1693109d532dde534509becec9");
        // The target's first byte picks what it opens; FORMAT is the rest.
        assert!(matches!(parse(&bytes[1..]), Declared::Damaged(_)));
        let mut flipped = body(2).into_bytes();
        flipped[3] = 0xff;
        assert!(matches!(parse(&flipped), Declared::Damaged(_)), "a flipped byte in the first line");
        flipped.splice(0..0, [0xaa; 12]);
        assert!(matches!(parse(&flipped), Declared::Damaged(_)));
    }

    #[test]
    fn a_file_from_before_the_checksum_still_reads() {
        assert_eq!(parse(b"timeshard-store\nformat 2\n"), Declared::Version { version: 2, checked: false });
    }

    #[test]
    fn no_single_flipped_bit_reads_as_another_version() {
        // Seed 3021 of the simulator flipped a bit in FORMAT. Whatever bit it is, the file is
        // either seen as damaged or still names the version written (a flip in the word `crc`
        // leaves the version line whole), never "format 3", which would be refused as newer.
        let good = body(2).into_bytes();
        let mut damaged = 0;
        for i in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            match parse(&bad) {
                Declared::Damaged(_) => damaged += 1,
                Declared::Version { version, .. } => {
                    assert_eq!(version, 2, "bit {i}: {:?}", String::from_utf8_lossy(&bad))
                }
            }
        }
        assert!(damaged > good.len() * 8 / 2, "{damaged} of {} flips seen", good.len() * 8);
    }

    #[test]
    fn foreign_and_oversized_files_are_damaged() {
        assert!(matches!(parse(b"hello\n"), Declared::Damaged(_)));
        assert!(matches!(parse(&[b'x'; 300]), Declared::Damaged(_)));
        assert!(matches!(parse(b""), Declared::Damaged(_)));
    }
}
