//! A recursive-descent parser of the InfluxQL subset (see the module above for the grammar).

use timeshard_proto::TimeRange;
use timeshard_proto::time::MAX_TIMESTAMP;
use timeshard_proto::window::{Grid, check_windows};

use super::lexer::{Lexer, Tok};
use super::time::parse_rfc3339;
use super::{Agg, Column, Fill, GroupTags, QueryError, Select, Statement, TagCond};

/// Deepest nesting of parentheses a WHERE clause may have. The parser descends once per level,
/// so without a bound a request of 10,000 `(` overflowed the stack and aborted the node.
pub const MAX_WHERE_DEPTH: usize = 32;
/// Longest query text accepted (InfluxDB's clients send a few KB; a dashboard's largest, tens).
pub const MAX_QUERY_BYTES: usize = 256 * 1024;

fn unsupported<T>(what: impl Into<String>) -> Result<T, QueryError> {
    Err(QueryError::Unsupported(what.into()))
}

/// Parses the statements of `query` (separated by `;`), resolving `now()` to `now_ns`.
pub fn parse(query: &str, now_ns: i64) -> Result<Vec<Statement>, QueryError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(QueryError::TooLarge(format!(
            "the query text is {} bytes; the limit is {MAX_QUERY_BYTES}",
            query.len()
        )));
    }
    let mut p = Parser { lexer: Lexer::new(query), peeked: None, now_ns, depth: 0 };
    let mut out = Vec::new();
    loop {
        while p.eat_sym(";")? {}
        if p.peek()? == &Tok::Eof {
            break;
        }
        out.push(p.statement()?);
        match p.next()? {
            Tok::Sym(";") | Tok::Eof => {}
            t => return Err(QueryError::Syntax(format!("unexpected {} after the statement", t.describe()))),
        }
    }
    if out.is_empty() {
        return Err(QueryError::Syntax("the query is empty".into()));
    }
    Ok(out)
}

struct Parser<'a> {
    lexer: Lexer<'a>,
    peeked: Option<Tok>,
    now_ns: i64,
    /// Parentheses open in the WHERE clause being parsed (at most [`MAX_WHERE_DEPTH`]).
    depth: usize,
}

/// Bounds on time from a WHERE clause.
#[derive(Default)]
struct TimeBounds {
    start: Option<i64>,
    end: Option<i64>,
}

impl TimeBounds {
    fn lower(&mut self, t: i64) {
        self.start = Some(self.start.map_or(t, |s| s.max(t)));
    }
    fn upper(&mut self, t: i64) {
        self.end = Some(self.end.map_or(t, |e| e.min(t)));
    }
}

impl Parser<'_> {
    fn peek(&mut self) -> Result<&Tok, QueryError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lexer.next_token()?);
        }
        Ok(self.peeked.as_ref().expect("just peeked"))
    }

    fn next(&mut self) -> Result<Tok, QueryError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lexer.next_token(),
        }
    }

    fn eat_kw(&mut self, kw: &str) -> Result<bool, QueryError> {
        if self.peek()?.is(kw) {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn eat_sym(&mut self, sym: &'static str) -> Result<bool, QueryError> {
        if *self.peek()? == Tok::Sym(sym) {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), QueryError> {
        let t = self.next()?;
        if t.is(kw) { Ok(()) } else { Err(QueryError::Syntax(format!("expected {kw}, found {}", t.describe()))) }
    }

    fn expect_sym(&mut self, sym: &'static str) -> Result<(), QueryError> {
        match self.next()? {
            Tok::Sym(s) if s == sym => Ok(()),
            t => Err(QueryError::Syntax(format!("expected {sym}, found {}", t.describe()))),
        }
    }

    /// An identifier, bare or double-quoted.
    fn ident(&mut self, what: &str) -> Result<String, QueryError> {
        match self.next()? {
            Tok::Ident(s) | Tok::Quoted(s) => Ok(s),
            t => Err(QueryError::Syntax(format!("expected {what}, found {}", t.describe()))),
        }
    }

    fn count(&mut self, what: &str) -> Result<usize, QueryError> {
        match self.next()? {
            Tok::Int(n) if n >= 0 => Ok(n as usize),
            t => Err(QueryError::Syntax(format!("{what} needs a number, found {}", t.describe()))),
        }
    }

    fn statement(&mut self) -> Result<Statement, QueryError> {
        let t = self.next()?;
        if t.is("SELECT") {
            return self.select().map(Statement::Select);
        }
        if t.is("SHOW") {
            return self.show();
        }
        if t.is("CREATE") {
            return self.create();
        }
        match t {
            Tok::Ident(word) => unsupported(format!("{} statements", word.to_uppercase())),
            t => Err(QueryError::Syntax(format!("expected SELECT or SHOW, found {}", t.describe()))),
        }
    }

    /// `CREATE DATABASE ...` and `CREATE RETENTION POLICY ...`, which Telegraf and the 1.x
    /// clients send at start-up: accepted and ignored (a node has one namespace, and retention
    /// is per series class). The rest of the statement is read up to `;` without meaning.
    fn create(&mut self) -> Result<Statement, QueryError> {
        let what = self.ident("DATABASE or RETENTION POLICY after CREATE")?;
        match what.to_ascii_uppercase().as_str() {
            "DATABASE" => {
                self.ident("a database name")?;
            }
            "RETENTION" => {
                self.expect_kw("POLICY")?;
                self.ident("a retention policy name")?;
            }
            other => return unsupported(format!("CREATE {other}")),
        }
        while !matches!(self.peek()?, Tok::Eof | Tok::Sym(";")) {
            self.next()?;
        }
        Ok(Statement::Create)
    }

    fn show(&mut self) -> Result<Statement, QueryError> {
        let what = self.ident("what to SHOW")?;
        match what.to_ascii_uppercase().as_str() {
            "DATABASES" => Ok(Statement::ShowDatabases),
            "RETENTION" => {
                self.expect_kw("POLICIES")?;
                if self.eat_kw("ON")? {
                    self.ident("a database")?;
                }
                Ok(Statement::ShowRetentionPolicies)
            }
            "MEASUREMENTS" => {
                if self.peek()?.is("WITH") || self.peek()?.is("WHERE") || self.peek()?.is("ON") {
                    return unsupported("SHOW MEASUREMENTS with WITH, WHERE or ON");
                }
                let (limit, offset) = self.limit_offset()?;
                Ok(Statement::ShowMeasurements { limit, offset })
            }
            "TAG" => {
                let which = self.ident("KEYS or VALUES")?;
                let measurement = self.show_from()?;
                if which.eq_ignore_ascii_case("KEYS") {
                    return Ok(Statement::ShowTagKeys { measurement });
                }
                if !which.eq_ignore_ascii_case("VALUES") {
                    return Err(QueryError::Syntax(format!("expected KEYS or VALUES after SHOW TAG, found {which}")));
                }
                self.expect_kw("WITH")?;
                self.expect_kw("KEY")?;
                let keys = match self.next()? {
                    Tok::Sym("=") => vec![self.ident("a tag key")?],
                    t if t.is("IN") => {
                        self.expect_sym("(")?;
                        let mut keys = vec![self.ident("a tag key")?];
                        while self.eat_sym(",")? {
                            keys.push(self.ident("a tag key")?);
                        }
                        self.expect_sym(")")?;
                        keys
                    }
                    Tok::Sym(op @ ("=~" | "!~" | "!=" | "<>")) => {
                        return unsupported(format!("WITH KEY {op} (use = or IN)"));
                    }
                    t => {
                        return Err(QueryError::Syntax(format!(
                            "expected = or IN after WITH KEY, found {}",
                            t.describe()
                        )));
                    }
                };
                let mut tags = Vec::new();
                if self.eat_kw("WHERE")? {
                    let mut bounds = TimeBounds::default();
                    self.conditions(&mut tags, &mut bounds)?;
                }
                self.limit_offset()?;
                Ok(Statement::ShowTagValues { measurement, keys, tags })
            }
            "FIELD" => {
                self.expect_kw("KEYS")?;
                let measurement = self.show_from()?;
                Ok(Statement::ShowFieldKeys { measurement })
            }
            other => unsupported(format!("SHOW {}", other.to_uppercase())),
        }
    }

    fn show_from(&mut self) -> Result<Option<String>, QueryError> {
        if self.eat_kw("ON")? {
            self.ident("a database")?;
        }
        if self.eat_kw("FROM")? { self.source().map(Some) } else { Ok(None) }
    }

    fn limit_offset(&mut self) -> Result<(Option<usize>, usize), QueryError> {
        let mut limit = None;
        let mut offset = 0;
        loop {
            if self.eat_kw("LIMIT")? {
                limit = Some(self.count("LIMIT")?);
            } else if self.eat_kw("OFFSET")? {
                offset = self.count("OFFSET")?;
            } else {
                return Ok((limit, offset));
            }
        }
    }

    /// `[db.][rp.]measurement`: the measurement.
    fn source(&mut self) -> Result<String, QueryError> {
        match self.peek()? {
            Tok::Sym("/") => return unsupported("FROM with a regular expression"),
            Tok::Sym("(") => return unsupported("subqueries"),
            _ => {}
        }
        let mut name = self.ident("a measurement")?;
        for _ in 0..2 {
            if !self.eat_sym(".")? {
                break;
            }
            // `db..m` skips the retention policy.
            if *self.peek()? == Tok::Sym(".") {
                continue;
            }
            name = self.ident("a measurement")?;
        }
        if self.eat_sym(",")? {
            return unsupported("several measurements in FROM");
        }
        Ok(name)
    }

    fn select(&mut self) -> Result<Select, QueryError> {
        let mut columns: Vec<Column> = Vec::new();
        loop {
            columns.push(self.column()?);
            if !self.eat_sym(",")? {
                break;
            }
        }
        let aggregates = columns.iter().filter(|c| c.agg.is_some()).count();
        if aggregates != 0 && aggregates != columns.len() {
            return unsupported("mixing aggregates and raw fields in one SELECT");
        }
        // Repeated column names get suffixes, as InfluxDB names them (mean, mean_1).
        for i in 1..columns.len() {
            let taken = |n: &str, cols: &[Column]| cols.iter().any(|c| c.name == n);
            if taken(&columns[i].name, &columns[..i]) {
                let base = columns[i].name.clone();
                let mut k = 1;
                while taken(&format!("{base}_{k}"), &columns[..i]) {
                    k += 1;
                }
                columns[i].name = format!("{base}_{k}");
            }
        }
        if self.peek()?.is("INTO") {
            return unsupported("SELECT ... INTO");
        }
        self.expect_kw("FROM")?;
        let measurement = self.source()?;
        let mut tags = Vec::new();
        let mut bounds = TimeBounds::default();
        if self.eat_kw("WHERE")? {
            self.conditions(&mut tags, &mut bounds)?;
        }
        let mut select = Select {
            columns,
            measurement,
            tags,
            start: bounds.start.unwrap_or(0).max(0),
            end: bounds.end.unwrap_or(MAX_TIMESTAMP).min(MAX_TIMESTAMP),
            bounded_start: bounds.start.is_some(),
            interval: None,
            group_tags: GroupTags::None,
            fill: Fill::Null,
            descending: false,
            limit: None,
            offset: 0,
            slimit: None,
            soffset: 0,
        };
        if self.eat_kw("GROUP")? {
            self.expect_kw("BY")?;
            self.group_by(&mut select)?;
        }
        if self.eat_kw("FILL")? {
            select.fill = self.fill()?;
        }
        if self.eat_kw("ORDER")? {
            self.expect_kw("BY")?;
            let key = self.ident("time")?;
            if !key.eq_ignore_ascii_case("time") {
                return unsupported(format!("ORDER BY {key} (only ORDER BY time)"));
            }
            if self.eat_kw("DESC")? {
                select.descending = true;
            } else {
                self.eat_kw("ASC")?;
            }
        }
        loop {
            if self.eat_kw("LIMIT")? {
                select.limit = Some(self.count("LIMIT")?);
            } else if self.eat_kw("OFFSET")? {
                select.offset = self.count("OFFSET")?;
            } else if self.eat_kw("SLIMIT")? {
                select.slimit = Some(self.count("SLIMIT")?);
            } else if self.eat_kw("SOFFSET")? {
                select.soffset = self.count("SOFFSET")?;
            } else if self.peek()?.is("TZ") {
                return unsupported("tz() (answers are in UTC)");
            } else {
                break;
            }
        }
        if select.interval.is_some() && !select.aggregates() {
            return unsupported("GROUP BY time() without an aggregate function");
        }
        if select.interval.is_some() {
            if bounds.start.is_none() {
                return unsupported("GROUP BY time() without a lower time bound (add WHERE time >= ...)");
            }
            // As InfluxDB: windows end at now unless the query says otherwise.
            if bounds.end.is_none() {
                select.end = self.now_ns.min(MAX_TIMESTAMP);
            }
        }
        if select.start >= select.end {
            return Err(QueryError::Syntax("the time range is empty: its start is not before its end".into()));
        }
        // Every window of the range gets a row (fill), data or not: bound them before anything runs.
        if let Some(width) = select.interval {
            let range = TimeRange::new(select.start, select.end).map_err(|e| QueryError::Syntax(e.to_string()))?;
            check_windows(&range, Grid::epoch(width)).map_err(QueryError::TooLarge)?;
        }
        Ok(select)
    }

    fn column(&mut self) -> Result<Column, QueryError> {
        let (agg, field) = match self.next()? {
            Tok::Sym("*") => return unsupported("SELECT * (name the fields)"),
            Tok::Quoted(field) => (None, field),
            Tok::Ident(name) if *self.peek()? == Tok::Sym("(") => {
                let Some(agg) = Agg::from_name(&name) else {
                    return unsupported(format!("the function {name}()"));
                };
                self.next()?;
                let field = match self.next()? {
                    Tok::Ident(f) | Tok::Quoted(f) => f,
                    Tok::Sym("*") => return unsupported(format!("{name}(*) (name the field)")),
                    t => {
                        return Err(QueryError::Syntax(format!(
                            "expected a field in {name}(), found {}",
                            t.describe()
                        )));
                    }
                };
                if *self.peek()? == Tok::Sym("(") {
                    return unsupported("nested functions");
                }
                if *self.peek()? != Tok::Sym(")") {
                    return unsupported(format!("arguments to {name}() other than one field"));
                }
                self.next()?;
                (Some(agg), field)
            }
            Tok::Ident(field) => (None, field),
            t => return Err(QueryError::Syntax(format!("expected a field or function, found {}", t.describe()))),
        };
        if let Tok::Sym(op @ ("+" | "-" | "*" | "/")) = self.peek()? {
            return unsupported(format!("arithmetic in SELECT ({op})"));
        }
        let name = if self.eat_kw("AS")? {
            self.ident("a column name")?
        } else {
            agg.map_or_else(|| field.clone(), |a| a.name().to_string())
        };
        Ok(Column { agg, field, name })
    }

    /// `cond (AND cond)*`, parentheses allowed; tag conditions into `tags`, time into `bounds`.
    fn conditions(&mut self, tags: &mut Vec<TagCond>, bounds: &mut TimeBounds) -> Result<(), QueryError> {
        loop {
            if self.eat_sym("(")? {
                if self.depth == MAX_WHERE_DEPTH {
                    return Err(QueryError::TooLarge(format!(
                        "WHERE nests parentheses more than {MAX_WHERE_DEPTH} deep"
                    )));
                }
                self.depth += 1;
                self.conditions(tags, bounds)?;
                self.depth -= 1;
                self.expect_sym(")")?;
            } else {
                self.condition(tags, bounds)?;
            }
            if self.eat_kw("AND")? {
                continue;
            }
            if self.peek()?.is("OR") {
                return unsupported("OR in WHERE (only AND)");
            }
            return Ok(());
        }
    }

    fn condition(&mut self, tags: &mut Vec<TagCond>, bounds: &mut TimeBounds) -> Result<(), QueryError> {
        let lhs = match self.next()? {
            Tok::Ident(s) | Tok::Quoted(s) => s,
            t => return Err(QueryError::Syntax(format!("expected a tag or time in WHERE, found {}", t.describe()))),
        };
        let op = match self.next()? {
            Tok::Sym(op @ ("=" | "!=" | "<>" | "<" | "<=" | ">" | ">=")) => op,
            Tok::Sym(op @ ("=~" | "!~")) => return unsupported(format!("regular expressions ({op})")),
            t => return Err(QueryError::Syntax(format!("expected a comparison after {lhs}, found {}", t.describe()))),
        };
        if lhs.eq_ignore_ascii_case("time") {
            let t = self.time_expr()?;
            match op {
                ">=" => bounds.lower(t),
                ">" => bounds.lower(t.saturating_add(1)),
                "<" => bounds.upper(t),
                "<=" => bounds.upper(t.saturating_add(1)),
                "=" => {
                    bounds.lower(t);
                    bounds.upper(t.saturating_add(1));
                }
                _ => return unsupported(format!("time {op} (use <, <=, >, >= or =)")),
            }
            return Ok(());
        }
        match self.next()? {
            Tok::Str(value) if matches!(op, "=" | "!=" | "<>") => {
                tags.push(TagCond { key: lhs, value, equal: op == "=" });
                Ok(())
            }
            Tok::Str(_) => unsupported(format!("tag comparisons with {op} (use = or !=)")),
            Tok::Int(_) | Tok::Float(_) | Tok::Sym("-") => {
                unsupported(format!("conditions on field values ({lhs} {op} a number); only tags and time"))
            }
            t => {
                Err(QueryError::Syntax(format!("expected a quoted tag value after {lhs} {op}, found {}", t.describe())))
            }
        }
    }

    /// A time: `'RFC 3339'`, integer nanoseconds, a duration literal or `now()`, then any number
    /// of `± duration`.
    fn time_expr(&mut self) -> Result<i64, QueryError> {
        let mut t = match self.next()? {
            Tok::Str(s) => parse_rfc3339(&s).ok_or_else(|| {
                QueryError::Syntax(format!("invalid time '{s}': use RFC 3339, e.g. '2023-11-14T22:13:20Z'"))
            })?,
            Tok::Int(n) => n,
            Tok::Duration(ns) => ns,
            Tok::Ident(f) if f.eq_ignore_ascii_case("now") => {
                self.expect_sym("(")?;
                self.expect_sym(")")?;
                self.now_ns
            }
            t => return Err(QueryError::Syntax(format!("expected a time, found {}", t.describe()))),
        };
        loop {
            let sign = match self.peek()? {
                Tok::Sym("+") => 1,
                Tok::Sym("-") => -1,
                _ => return Ok(t),
            };
            self.next()?;
            let d = match self.next()? {
                Tok::Duration(d) => d,
                Tok::Int(n) => n,
                t => return Err(QueryError::Syntax(format!("expected a duration, found {}", t.describe()))),
            };
            t = t.saturating_add(sign * d);
        }
    }

    fn group_by(&mut self, select: &mut Select) -> Result<(), QueryError> {
        loop {
            match self.next()? {
                Tok::Ident(t) if t.eq_ignore_ascii_case("time") && *self.peek()? == Tok::Sym("(") => {
                    self.next()?;
                    let w = match self.next()? {
                        Tok::Duration(w) if w > 0 => w,
                        t => {
                            return Err(QueryError::Syntax(format!("time() needs a duration, found {}", t.describe())));
                        }
                    };
                    if self.eat_sym(",")? {
                        return unsupported("an offset in GROUP BY time()");
                    }
                    self.expect_sym(")")?;
                    select.interval = Some(w);
                }
                Tok::Sym("*") => select.group_tags = GroupTags::All,
                Tok::Ident(k) | Tok::Quoted(k) => match &mut select.group_tags {
                    GroupTags::Keys(keys) => keys.push(k),
                    GroupTags::All => {}
                    g @ GroupTags::None => *g = GroupTags::Keys(vec![k]),
                },
                Tok::Sym("/") => return unsupported("GROUP BY a regular expression"),
                t => {
                    return Err(QueryError::Syntax(format!(
                        "expected time() or a tag in GROUP BY, found {}",
                        t.describe()
                    )));
                }
            }
            if !self.eat_sym(",")? {
                return Ok(());
            }
        }
    }

    fn fill(&mut self) -> Result<Fill, QueryError> {
        self.expect_sym("(")?;
        let fill = match self.next()? {
            t if t.is("null") => Fill::Null,
            t if t.is("none") => Fill::None,
            t if t.is("previous") => Fill::Previous,
            t if t.is("linear") => return unsupported("fill(linear)"),
            Tok::Int(n) => Fill::Value(n as f64),
            Tok::Float(f) => Fill::Value(f),
            Tok::Sym("-") => match self.next()? {
                Tok::Int(n) => Fill::Value(-(n as f64)),
                Tok::Float(f) => Fill::Value(-f),
                t => return Err(QueryError::Syntax(format!("expected a number in fill(), found {}", t.describe()))),
            },
            t => {
                return Err(QueryError::Syntax(format!(
                    "expected null, none, previous or a number in fill(), found {}",
                    t.describe()
                )));
            }
        };
        self.expect_sym(")")?;
        Ok(fill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000_000_000;
    const MIN: i64 = 60_000_000_000;

    fn select(q: &str) -> Select {
        match parse(q, NOW).unwrap().remove(0) {
            Statement::Select(s) => s,
            other => panic!("not a select: {other:?}"),
        }
    }

    fn unsupported_msg(q: &str) -> String {
        match parse(q, NOW) {
            Err(e @ QueryError::Unsupported(_)) => e.to_string(),
            other => panic!("{q}: expected unsupported, got {other:?}"),
        }
    }

    #[test]
    fn a_grafana_query() {
        let s = select(
            "SELECT mean(\"value\"), max(value) AS top FROM \"autogen\".\"pmu.phase\" WHERE (\"site\" = 'atl' AND bus != '3') \
             AND time >= 1700000000000ms and time <= 1700003600000ms GROUP BY time(1m), \"bus\" fill(none) ORDER BY time DESC LIMIT 10",
        );
        assert_eq!(s.measurement, "pmu.phase");
        assert_eq!(
            s.columns.iter().map(|c| (c.agg, c.name.as_str())).collect::<Vec<_>>(),
            vec![(Some(Agg::Mean), "mean"), (Some(Agg::Max), "top")]
        );
        assert_eq!(
            s.tags,
            vec![
                TagCond { key: "site".into(), value: "atl".into(), equal: true },
                TagCond { key: "bus".into(), value: "3".into(), equal: false },
            ]
        );
        assert_eq!((s.start, s.end), (NOW, NOW + 60 * MIN + 1));
        assert!(s.bounded_start);
        assert_eq!(s.interval, Some(MIN));
        assert_eq!(s.group_tags, GroupTags::Keys(vec!["bus".into()]));
        assert_eq!(s.fill, Fill::None);
        assert!(s.descending);
        assert_eq!(s.limit, Some(10));
        assert_eq!(s.fields(), vec![("value".to_string(), "pmu.phase".to_string())]);
    }

    #[test]
    fn times_in_every_form() {
        let s = select("select v from m where time > now() - 1h and time < '2023-11-14T22:13:20Z' + 1s");
        assert_eq!((s.start, s.end), (NOW - 3_600_000_000_000 + 1, NOW + 1_000_000_000));
        let s = select("SELECT v FROM m WHERE time = 5");
        assert_eq!((s.start, s.end), (5, 6));
        let s = select("SELECT count(v) FROM m");
        assert_eq!((s.start, s.end, s.bounded_start), (0, MAX_TIMESTAMP, false));
        assert!(matches!(parse("SELECT v FROM m WHERE time > 10 AND time < 5", NOW), Err(QueryError::Syntax(_))));
    }

    #[test]
    fn repeated_columns_get_suffixes() {
        let s = select("SELECT mean(a), mean(b), mean(c) FROM m");
        assert_eq!(s.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["mean", "mean_1", "mean_2"]);
    }

    #[test]
    fn show_statements() {
        let all = parse("SHOW DATABASES; show measurements limit 5; SHOW TAG VALUES FROM cpu WITH KEY IN (host, \"dc\") \
                         WHERE region = 'eu'; SHOW TAG KEYS; SHOW FIELD KEYS FROM \"pmu.phase\"; SHOW RETENTION POLICIES ON db",
            NOW).unwrap();
        assert_eq!(all[0], Statement::ShowDatabases);
        assert_eq!(all[1], Statement::ShowMeasurements { limit: Some(5), offset: 0 });
        assert_eq!(
            all[2],
            Statement::ShowTagValues {
                measurement: Some("cpu".into()),
                keys: vec!["host".into(), "dc".into()],
                tags: vec![TagCond { key: "region".into(), value: "eu".into(), equal: true }],
            }
        );
        assert_eq!(all[3], Statement::ShowTagKeys { measurement: None });
        assert_eq!(all[4], Statement::ShowFieldKeys { measurement: Some("pmu.phase".into()) });
        assert_eq!(all[5], Statement::ShowRetentionPolicies);
    }

    /// Telegraf and the 1.x clients send these at start-up; they used to get a 400.
    #[test]
    fn create_database_and_retention_policy_are_accepted_as_no_ops() {
        let all = parse(
            "CREATE DATABASE \"telegraf\"; CREATE DATABASE edge WITH DURATION 30d REPLICATION 1 NAME rp; \
             CREATE RETENTION POLICY \"a_year\" ON \"telegraf\" DURATION 52w REPLICATION 1 SHARD DURATION 1d DEFAULT; \
             SHOW DATABASES",
            0,
        )
        .unwrap();
        assert_eq!(all, vec![Statement::Create, Statement::Create, Statement::Create, Statement::ShowDatabases]);
        for bad in ["CREATE USER admin WITH PASSWORD 'x'", "CREATE", "CREATE RETENTION", "CREATE DATABASE"] {
            assert!(parse(bad, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn outside_the_subset_is_named() {
        for (q, what) in [
            ("SELECT * FROM m", "SELECT *"),
            ("SELECT median(v) FROM m", "median()"),
            ("SELECT v FROM m WHERE host =~ /^a(b|c)$/", "regular expressions (=~)"),
            ("SELECT v FROM /cpu.*/", "regular expression"),
            ("SELECT v FROM m WHERE a = 'x' OR b = 'y'", "OR in WHERE"),
            ("SELECT v FROM m WHERE v > 5", "conditions on field values"),
            ("SELECT mean(v), v FROM m", "mixing aggregates"),
            ("SELECT v + 1 FROM m", "arithmetic"),
            ("SELECT v FROM m GROUP BY time(1m)", "without an aggregate"),
            ("SELECT mean(v) FROM m GROUP BY time(1m, 5s)", "offset"),
            ("SELECT mean(v) FROM m GROUP BY time(1m) fill(linear)", "fill(linear)"),
            ("SELECT v FROM m tz('Europe/Paris')", "tz()"),
            ("DROP MEASUREMENT m", "DROP statements"),
            ("SHOW SERIES", "SHOW SERIES"),
            ("SELECT v INTO x FROM m", "INTO"),
        ] {
            let msg = unsupported_msg(q);
            assert!(msg.contains(what), "{q}: {msg}");
            assert!(msg.starts_with("unsupported InfluxQL"), "{msg}");
        }
    }

    #[test]
    fn windows_beyond_the_bound_are_refused_before_anything_runs() {
        let q = "SELECT count(v) FROM m WHERE time >= 0 GROUP BY time(1s)";
        let err = parse(q, NOW).unwrap_err();
        assert!(matches!(err, QueryError::TooLarge(_)), "{err}");
        assert!(err.to_string().contains("at most 100000"), "{err}");
        let q = "SELECT count(v) FROM m WHERE time >= now() - 1d GROUP BY time(1m)";
        assert!(parse(q, NOW).is_ok());
    }

    /// Found by review: 10,000 nested parentheses in WHERE overflowed the stack and aborted
    /// the node (`POST /query`). Deep nesting is now an error naming the bound.
    #[test]
    fn deeply_nested_where_is_refused_not_a_stack_overflow() {
        let nested =
            |depth: usize| format!("SELECT value FROM m WHERE {}a = 'b'{}", "(".repeat(depth), ")".repeat(depth));
        for depth in [MAX_WHERE_DEPTH + 1, 10_000, 100_000] {
            let err = parse(&nested(depth), 0).unwrap_err().to_string();
            assert!(err.contains("nests parentheses more than 32 deep"), "{depth}: {err}");
        }
        // 200,000 deep is 400,000 bytes: the size bound refuses it before the parser looks.
        let err = parse(&nested(200_000), 0).unwrap_err().to_string();
        assert!(err.contains("the limit is 262144"), "{err}");
        let ok =
            format!("SELECT value FROM m WHERE {}a = 'b'{}", "(".repeat(MAX_WHERE_DEPTH), ")".repeat(MAX_WHERE_DEPTH));
        assert!(parse(&ok, 0).is_ok());
        let huge = format!("SELECT value FROM m WHERE a = '{}'", "x".repeat(MAX_QUERY_BYTES));
        assert!(parse(&huge, 0).unwrap_err().to_string().contains("the limit is 262144"));
    }

    #[test]
    fn syntax_errors_say_what_was_expected() {
        for (q, what) in [
            ("", "empty"),
            ("SELECT", "expected a field"),
            ("SELECT v", "expected FROM"),
            ("SELECT v FROM m WHERE", "expected a tag or time"),
            ("SELECT v FROM m WHERE host = ", "expected a quoted tag value"),
            ("SELECT v FROM m LIMIT x", "LIMIT needs a number"),
            ("SELECT v FROM m extra", "unexpected extra"),
        ] {
            let err = parse(q, NOW).unwrap_err();
            assert!(matches!(err, QueryError::Syntax(_)) && err.to_string().contains(what), "{q}: {err}");
        }
    }
}
