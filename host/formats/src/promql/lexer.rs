//! PromQL's tokens: identifiers, numbers, durations, strings (Go's quoting), operators and
//! punctuation, with the byte offset of each for error messages.
//!
//! The lexer never recurses and never allocates more than the input's size; the parser bounds
//! the input's length before calling it.

use super::ParseError;

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// A name: metric, label, function, aggregator or keyword (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
    Ident(String),
    Number(f64),
    /// Milliseconds.
    Duration(i64),
    Str(String),
    LParen,
    RParen,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Comma,
    Colon,
    At,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    /// `=` (label matcher).
    Assign,
    /// `==`
    Eql,
    Neq,
    Lte,
    Lss,
    Gte,
    Gtr,
    EqlRegex,
    NeqRegex,
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier {s:?}"),
            Tok::Number(n) => format!("number {n}"),
            Tok::Duration(ms) => format!("duration {}", super::ast::format_duration(*ms)),
            Tok::Str(s) if s.len() > 16 => format!("string {:?}...", &s[..s.floor_char_boundary(16)]),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Eof => "end of input".to_string(),
            other => format!("\"{}\"", other.symbol()),
        }
    }

    fn symbol(&self) -> &'static str {
        match self {
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::Comma => ",",
            Tok::Colon => ":",
            Tok::At => "@",
            Tok::Add => "+",
            Tok::Sub => "-",
            Tok::Mul => "*",
            Tok::Div => "/",
            Tok::Mod => "%",
            Tok::Pow => "^",
            Tok::Assign => "=",
            Tok::Eql => "==",
            Tok::Neq => "!=",
            Tok::Lte => "<=",
            Tok::Lss => "<",
            Tok::Gte => ">=",
            Tok::Gtr => ">",
            Tok::EqlRegex => "=~",
            Tok::NeqRegex => "!~",
            _ => "?",
        }
    }
}

/// A token and the byte offset it starts at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub pos: usize,
}

/// Splits `input` into tokens, ending with [`Tok::Eof`].
pub(crate) fn lex(input: &str) -> Result<Vec<Token>, ParseError> {
    let b = input.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let simple = |tok, len| (tok, len);
        let (tok, len) = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'(' => simple(Tok::LParen, 1),
            b')' => simple(Tok::RParen, 1),
            b'{' => simple(Tok::LBrace, 1),
            b'}' => simple(Tok::RBrace, 1),
            b'[' => simple(Tok::LBracket, 1),
            b']' => simple(Tok::RBracket, 1),
            b',' => simple(Tok::Comma, 1),
            b'@' => simple(Tok::At, 1),
            b'+' => simple(Tok::Add, 1),
            b'-' => simple(Tok::Sub, 1),
            b'*' => simple(Tok::Mul, 1),
            b'/' => simple(Tok::Div, 1),
            b'%' => simple(Tok::Mod, 1),
            b'^' => simple(Tok::Pow, 1),
            b'=' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Eql, 2),
                Some(b'~') => simple(Tok::EqlRegex, 2),
                _ => simple(Tok::Assign, 1),
            },
            b'!' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Neq, 2),
                Some(b'~') => simple(Tok::NeqRegex, 2),
                _ => return Err(ParseError::at(input, i, "unexpected character after '!'")),
            },
            b'<' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Lte, 2),
                _ => simple(Tok::Lss, 1),
            },
            b'>' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Gte, 2),
                _ => simple(Tok::Gtr, 1),
            },
            b'"' | b'\'' | b'`' => {
                let (s, end) = lex_string(input, i)?;
                out.push(Token { tok: Tok::Str(s), pos: start });
                i = end;
                continue;
            }
            b'0'..=b'9' | b'.' => {
                let (tok, end) = lex_number_or_duration(input, i)?;
                out.push(Token { tok, pos: start });
                i = end;
                continue;
            }
            b':' if !b.get(i + 1).is_some_and(|&n| is_ident_start(n)) => simple(Tok::Colon, 1),
            c if is_ident_start(c) || c == b':' => {
                let mut end = i + 1;
                while end < b.len() && (is_ident_char(b[end])) {
                    end += 1;
                }
                let word = &input[i..end];
                let lower = word.to_ascii_lowercase();
                // `Inf` and `NaN` are numbers in any case, as in Prometheus.
                let tok = match lower.as_str() {
                    "inf" => Tok::Number(f64::INFINITY),
                    "nan" => Tok::Number(f64::NAN),
                    _ => Tok::Ident(word.to_string()),
                };
                out.push(Token { tok, pos: start });
                i = end;
                continue;
            }
            _ => {
                let ch = input[i..].chars().next().unwrap_or('?');
                return Err(ParseError::at(input, i, format!("unexpected character {ch:?}")));
            }
        };
        out.push(Token { tok, pos: start });
        i += len;
    }
    out.push(Token { tok: Tok::Eof, pos: b.len() });
    Ok(out)
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

const DURATION_UNITS: [(&str, i64); 7] = [
    ("y", 365 * 24 * 3_600_000),
    ("w", 7 * 24 * 3_600_000),
    ("d", 24 * 3_600_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// A Prometheus duration (`1h30m`, `5m`, `250ms`): units in decreasing order, each at most once.
pub(crate) fn parse_duration(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut total: i64 = 0;
    let mut last_unit = None::<usize>;
    if b.is_empty() {
        return None;
    }
    while i < b.len() {
        let digits_start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == digits_start {
            return None;
        }
        let n: i64 = s[digits_start..i].parse().ok()?;
        let unit_start = i;
        while i < b.len() && b[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &s[unit_start..i];
        let idx = DURATION_UNITS.iter().position(|(u, _)| *u == unit)?;
        if last_unit.is_some_and(|l| idx <= l) {
            return None;
        }
        last_unit = Some(idx);
        total = total.checked_add(n.checked_mul(DURATION_UNITS[idx].1)?)?;
    }
    Some(total)
}

fn lex_number_or_duration(input: &str, start: usize) -> Result<(Tok, usize), ParseError> {
    let b = input.as_bytes();
    // Hexadecimal integers, as Go's ParseFloat reads them.
    if b[start] == b'0' && matches!(b.get(start + 1), Some(b'x' | b'X')) {
        let mut end = start + 2;
        while end < b.len() && b[end].is_ascii_hexdigit() {
            end += 1;
        }
        let v = u64::from_str_radix(&input[start + 2..end], 16)
            .map_err(|_| ParseError::at(input, start, format!("bad number {:?}", &input[start..end])))?;
        return Ok((Tok::Number(v as f64), end));
    }
    // A duration is digits and unit letters (`5m`, `1h30m`, `250ms`).
    let mut end = start;
    while end < b.len() && b[end].is_ascii_digit() {
        end += 1;
    }
    if end > start && end < b.len() && matches!(b[end], b'y' | b'w' | b'd' | b'h' | b'm' | b's') {
        let mut d_end = end;
        while d_end < b.len() && (b[d_end].is_ascii_alphanumeric()) {
            d_end += 1;
        }
        let text = &input[start..d_end];
        return match parse_duration(text) {
            Some(ms) => Ok((Tok::Duration(ms), d_end)),
            None => Err(ParseError::at(input, start, format!("bad duration {text:?}"))),
        };
    }
    // A decimal number: digits, a fraction, an exponent.
    if end < b.len() && b[end] == b'.' {
        end += 1;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
    }
    if end < b.len() && matches!(b[end], b'e' | b'E') {
        let mut e = end + 1;
        if e < b.len() && matches!(b[e], b'+' | b'-') {
            e += 1;
        }
        if e < b.len() && b[e].is_ascii_digit() {
            while e < b.len() && b[e].is_ascii_digit() {
                e += 1;
            }
            end = e;
        }
    }
    let text = &input[start..end];
    if end < b.len() && is_ident_char(b[end]) {
        let mut bad_end = end;
        while bad_end < b.len() && is_ident_char(b[bad_end]) {
            bad_end += 1;
        }
        return Err(ParseError::at(
            input,
            start,
            format!("bad number or duration syntax: {:?}", &input[start..bad_end]),
        ));
    }
    match text.parse::<f64>() {
        Ok(v) if text != "." => Ok((Tok::Number(v), end)),
        _ => Err(ParseError::at(input, start, format!("bad number {text:?}"))),
    }
}

/// A quoted string from `start` (its opening quote): its value and the offset after it.
/// Double and single quotes take Go's escapes; backquotes are raw.
fn lex_string(input: &str, start: usize) -> Result<(String, usize), ParseError> {
    let quote = input.as_bytes()[start];
    let mut out = String::new();
    let mut chars = input[start + 1..].char_indices();
    let unterminated = || ParseError::at(input, start, "unterminated quoted string");
    while let Some((off, c)) = chars.next() {
        let here = start + 1 + off;
        if c as u32 == u32::from(quote) {
            return Ok((out, here + 1));
        }
        if quote == b'`' {
            out.push(c);
            continue;
        }
        match c {
            '\n' => return Err(unterminated()),
            '\\' => {
                let (_, e) = chars.next().ok_or_else(unterminated)?;
                let mut take_hex = |n: usize| -> Result<u32, ParseError> {
                    let mut v = 0u32;
                    for _ in 0..n {
                        let (_, h) = chars.next().ok_or_else(unterminated)?;
                        v = v * 16
                            + h.to_digit(16).ok_or_else(|| ParseError::at(input, here, "invalid escape sequence"))?;
                    }
                    Ok(v)
                };
                let bad = || ParseError::at(input, here, "invalid escape sequence");
                match e {
                    'a' => out.push('\x07'),
                    'b' => out.push('\x08'),
                    'f' => out.push('\x0c'),
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    'v' => out.push('\x0b'),
                    '\\' => out.push('\\'),
                    '"' if quote == b'"' => out.push('"'),
                    '\'' if quote == b'\'' => out.push('\''),
                    'x' => {
                        let v = take_hex(2)?;
                        // A byte escape: only ASCII keeps the string valid UTF-8.
                        out.push(char::from_u32(v).filter(char::is_ascii).ok_or_else(bad)?);
                    }
                    'u' => out.push(char::from_u32(take_hex(4)?).ok_or_else(bad)?),
                    'U' => out.push(char::from_u32(take_hex(8)?).ok_or_else(bad)?),
                    '0'..='7' => {
                        let mut v = e.to_digit(8).unwrap_or(0);
                        for _ in 0..2 {
                            let (_, o) = chars.next().ok_or_else(unterminated)?;
                            v = v * 8 + o.to_digit(8).ok_or_else(bad)?;
                        }
                        out.push(char::from_u32(v).filter(char::is_ascii).ok_or_else(bad)?);
                    }
                    _ => return Err(bad()),
                }
            }
            c => out.push(c),
        }
    }
    Err(unterminated())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn numbers_durations_and_names() {
        assert_eq!(
            toks("rate(x:y[5m]) offset 1h30m"),
            vec![
                Tok::Ident("rate".into()),
                Tok::LParen,
                Tok::Ident("x:y".into()),
                Tok::LBracket,
                Tok::Duration(300_000),
                Tok::RBracket,
                Tok::RParen,
                Tok::Ident("offset".into()),
                Tok::Duration(5_400_000),
                Tok::Eof
            ]
        );
        assert_eq!(
            toks("0x1f 1e3 .5 2.5E-1")[..4],
            [Tok::Number(31.0), Tok::Number(1000.0), Tok::Number(0.5), Tok::Number(0.25)]
        );
        assert_eq!(toks("Inf")[0], Tok::Number(f64::INFINITY));
        assert!(matches!(toks("NaN")[0], Tok::Number(n) if n.is_nan()));
        assert_eq!(toks("250ms")[0], Tok::Duration(250));
        assert!(lex("5m1h").is_err(), "units out of order");
        assert!(lex("12abc").is_err());
        assert_eq!(toks("a # comment\n+ b").len(), 4);
    }

    #[test]
    fn strings_take_go_escapes() {
        assert_eq!(toks(r#""a\"b\n\x41\u00e9""#)[0], Tok::Str("a\"b\nAé".into()));
        assert_eq!(toks(r"'it\'s'")[0], Tok::Str("it's".into()));
        assert_eq!(toks(r"`raw\n`")[0], Tok::Str("raw\\n".into()));
        assert_eq!(toks(r#""\101""#)[0], Tok::Str("A".into()));
        assert!(lex("\"open").is_err());
        assert!(lex(r#""bad \q""#).is_err());
        assert!(lex(r#""\xff""#).is_err(), "not UTF-8");
    }

    #[test]
    fn operators() {
        assert_eq!(
            toks("== != <= < >= > =~ !~ = ^ %"),
            vec![
                Tok::Eql,
                Tok::Neq,
                Tok::Lte,
                Tok::Lss,
                Tok::Gte,
                Tok::Gtr,
                Tok::EqlRegex,
                Tok::NeqRegex,
                Tok::Assign,
                Tok::Pow,
                Tok::Mod,
                Tok::Eof
            ]
        );
        assert!(lex("a ! b").is_err());
        assert!(lex("a $ b").is_err());
    }
}
