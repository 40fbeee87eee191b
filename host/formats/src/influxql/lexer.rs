//! InfluxQL tokens, read lazily: the parser pulls them one at a time, so a statement outside
//! the subset is refused by name before the lexer meets syntax it does not know (a regular
//! expression's body, say).

use super::QueryError;
use super::time;

/// One token.
#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// A bare identifier or keyword (`SELECT`, `cpu`, `mean`).
    Ident(String),
    /// A double-quoted identifier (`"pmu.phase"`): never a keyword.
    Quoted(String),
    /// A single-quoted string literal.
    Str(String),
    Int(i64),
    Float(f64),
    /// A duration literal, in nanoseconds.
    Duration(i64),
    /// An operator or punctuation: `= != <> < <= > >= =~ !~ + - * / ( ) , ; .`
    Sym(&'static str),
    Eof,
}

impl Tok {
    /// Whether this is keyword `kw` (case-insensitive, bare identifiers only).
    pub fn is(&self, kw: &str) -> bool {
        matches!(self, Tok::Ident(s) if s.eq_ignore_ascii_case(kw))
    }

    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => s.clone(),
            Tok::Quoted(s) => format!("\"{s}\""),
            Tok::Str(s) => format!("'{s}'"),
            Tok::Int(n) => n.to_string(),
            Tok::Float(f) => f.to_string(),
            Tok::Duration(ns) => format!("{ns}ns"),
            Tok::Sym(s) => (*s).to_string(),
            Tok::Eof => "the end of the query".into(),
        }
    }
}

const SYMBOLS: [&str; 18] =
    ["!=", "<>", "<=", ">=", "=~", "!~", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",", ";", "."];

/// A lexer over one query string.
#[derive(Debug)]
pub struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Lexer<'a> {
        Lexer { src, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    fn skip_space_and_comments(&mut self) {
        loop {
            let rest = self.rest();
            let trimmed = rest.trim_start();
            self.pos += rest.len() - trimmed.len();
            if trimmed.starts_with("--") {
                self.pos += trimmed.find('\n').unwrap_or(trimmed.len());
            } else {
                return;
            }
        }
    }

    fn quoted(&mut self, quote: char) -> Result<String, QueryError> {
        let mut out = String::new();
        let mut chars = self.rest().char_indices().skip(1);
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, c)) => out.push(c),
                    None => break,
                },
                c if c == quote => {
                    self.pos += i + c.len_utf8();
                    return Ok(out);
                }
                c => out.push(c),
            }
        }
        Err(QueryError::Syntax(format!("unterminated {quote}-quoted text at offset {}", self.pos)))
    }

    /// The next token.
    pub fn next_token(&mut self) -> Result<Tok, QueryError> {
        self.skip_space_and_comments();
        let rest = self.rest();
        let Some(c) = rest.chars().next() else { return Ok(Tok::Eof) };
        if c == '"' {
            return self.quoted('"').map(Tok::Quoted);
        }
        if c == '\'' {
            return self.quoted('\'').map(Tok::Str);
        }
        if c.is_ascii_digit() || (c == '.' && rest[1..].starts_with(|d: char| d.is_ascii_digit())) {
            return self.number();
        }
        if c.is_alphabetic() || c == '_' {
            let len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            self.pos += len;
            return Ok(Tok::Ident(rest[..len].to_string()));
        }
        for sym in SYMBOLS {
            if rest.starts_with(sym) {
                self.pos += sym.len();
                return Ok(Tok::Sym(sym));
            }
        }
        Err(QueryError::Syntax(format!("unexpected character {c:?} at offset {}", self.pos)))
    }

    fn number(&mut self) -> Result<Tok, QueryError> {
        let rest = self.rest();
        let len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let digits = &rest[..len];
        let after = &rest[len..];
        // Exponents (1e9, 2.5E-3) make a float.
        let mut end = len;
        if after.starts_with(['e', 'E']) {
            let exp = &after[1..];
            let sign = usize::from(exp.starts_with(['+', '-']));
            let digits_len = exp[sign..].find(|c: char| !c.is_ascii_digit()).unwrap_or(exp.len() - sign);
            if digits_len > 0 {
                end = len + 1 + sign + digits_len;
            }
        }
        // Digits followed by a unit (and maybe more digit-unit pairs): a duration.
        let word = after.find(|c: char| !(c.is_alphanumeric() || c == 'µ')).unwrap_or(after.len());
        if end == len && word > 0 && !digits.contains('.') {
            let text = &rest[..len + word];
            let ns = time::parse_duration(text).ok_or_else(|| {
                QueryError::Syntax(format!("invalid duration {text:?}: use units ns, u, ms, s, m, h, d, w"))
            })?;
            self.pos += len + word;
            return Ok(Tok::Duration(ns));
        }
        let text = &rest[..end];
        self.pos += end;
        if end == len && !text.contains('.') {
            text.parse().map(Tok::Int).map_err(|_| QueryError::Syntax(format!("integer {text} is too large")))
        } else {
            text.parse().map(Tok::Float).map_err(|_| QueryError::Syntax(format!("invalid number {text:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(q: &str) -> Vec<Tok> {
        let mut l = Lexer::new(q);
        let mut out = Vec::new();
        loop {
            match l.next_token().unwrap() {
                Tok::Eof => return out,
                t => out.push(t),
            }
        }
    }

    #[test]
    fn tokens_of_a_dashboard_query() {
        let toks =
            all("SELECT mean(\"value\") FROM \"pmu.phase\" WHERE (\"site\" = 'atl') AND time >= 1700000000000ms and \
                        time <= now() - 5m GROUP BY time(1m) fill(null); -- done\n");
        assert_eq!(toks[0], Tok::Ident("SELECT".into()));
        assert_eq!(toks[3], Tok::Quoted("value".into()));
        assert!(toks.contains(&Tok::Str("atl".into())));
        assert!(toks.contains(&Tok::Duration(1_700_000_000_000_000_000)));
        assert!(toks.contains(&Tok::Duration(300_000_000_000)));
        assert!(toks.contains(&Tok::Sym(">=")) && toks.contains(&Tok::Sym("<=")));
        assert_eq!(toks.last(), Some(&Tok::Sym(";")));
        assert_eq!(all("1.5 2e3 7 .5"), vec![Tok::Float(1.5), Tok::Float(2000.0), Tok::Int(7), Tok::Float(0.5)]);
        assert_eq!(all("'it\\'s'"), vec![Tok::Str("it's".into())]);
    }

    #[test]
    fn lexical_errors_say_where() {
        assert!(Lexer::new("'open").next_token().unwrap_err().to_string().contains("unterminated"));
        assert!(Lexer::new("5parsecs").next_token().unwrap_err().to_string().contains("invalid duration"));
        assert!(Lexer::new("^").next_token().unwrap_err().to_string().contains("offset 0"));
    }
}
