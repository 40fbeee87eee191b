//! The PromQL parser: recursive descent with precedence climbing, Prometheus' type checks, and
//! bounds on everything a hostile query could grow.
//!
//! Recursion goes through [`Parser::binary`] only, which counts its depth, and every node
//! records the depth of the tree below it (left-leaning chains such as `a + a + ...` are
//! built by a loop, yet make a deep tree that evaluation and drop would recurse through), so
//! both the parser's stack and the tree's height stay under [`Limits::max_depth`].

use super::ast::{
    AggOp, Aggregate, BinOp, Binary, Call, Cardinality, Expr, Func, Selector, UNSUPPORTED_AGGREGATORS,
    UNSUPPORTED_FUNCTIONS, ValueType, VectorMatching,
};
use super::labels::METRIC_NAME;
use super::lexer::{Tok, Token, lex};
use super::matcher::{MatchOp, Matcher};
use super::{Limits, ParseError};

/// Parses one PromQL expression within `limits`.
pub fn parse(input: &str, limits: &Limits) -> Result<Expr, ParseError> {
    if input.len() > limits.max_query_bytes {
        return Err(ParseError::at(
            input,
            0,
            format!("the query is {} bytes, more than the limit of {} bytes", input.len(), limits.max_query_bytes),
        ));
    }
    let toks = lex(input)?;
    let mut p = Parser { input, toks, i: 0, depth: 0, limits };
    let (e, _) = p.expr()?;
    if p.peek() != &Tok::Eof {
        return Err(p.unexpected("end of input"));
    }
    Ok(e)
}

/// An expression and the height of its tree.
type Node = (Expr, usize);

struct Parser<'a> {
    input: &'a str,
    toks: Vec<Token>,
    i: usize,
    depth: usize,
    limits: &'a Limits,
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

impl Parser<'_> {
    /// The token at the cursor; past the end, the final [`Tok::Eof`].
    fn peek(&self) -> &Tok {
        &self.toks[self.i.min(self.toks.len() - 1)].tok
    }

    fn pos(&self) -> usize {
        self.toks[self.i.min(self.toks.len() - 1)].pos
    }

    /// Takes the token at the cursor (`self.i -= 1` puts it back).
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.i += 1;
        t
    }

    fn err(&self, pos: usize, msg: impl Into<String>) -> ParseError {
        ParseError::at(self.input, pos, msg)
    }

    fn unexpected(&self, wanted: &str) -> ParseError {
        self.err(self.pos(), format!("unexpected {}, expected {wanted}", self.peek().describe()))
    }

    fn expect(&mut self, tok: Tok, wanted: &str) -> Result<(), ParseError> {
        if *self.peek() == tok {
            self.next();
            Ok(())
        } else {
            Err(self.unexpected(wanted))
        }
    }

    /// The keyword at the cursor, lowercased, if it is an identifier.
    fn keyword(&self) -> Option<String> {
        match self.peek() {
            Tok::Ident(s) => Some(s.to_ascii_lowercase()),
            _ => None,
        }
    }

    fn node(&self, pos: usize, e: Expr, depth: usize) -> Result<Node, ParseError> {
        if depth > self.limits.max_depth {
            return Err(self
                .err(pos, format!("the expression nests deeper than the limit of {} levels", self.limits.max_depth)));
        }
        Ok((e, depth))
    }

    fn expr(&mut self) -> Result<Node, ParseError> {
        self.binary(0)
    }

    fn binary_op(&self) -> Option<BinOp> {
        Some(match self.peek() {
            Tok::Add => BinOp::Add,
            Tok::Sub => BinOp::Sub,
            Tok::Mul => BinOp::Mul,
            Tok::Div => BinOp::Div,
            Tok::Mod => BinOp::Mod,
            Tok::Pow => BinOp::Pow,
            Tok::Eql => BinOp::Eql,
            Tok::Neq => BinOp::Neq,
            Tok::Gtr => BinOp::Gtr,
            Tok::Lss => BinOp::Lss,
            Tok::Gte => BinOp::Gte,
            Tok::Lte => BinOp::Lte,
            Tok::Ident(_) => match self.keyword()?.as_str() {
                "and" => BinOp::And,
                "or" => BinOp::Or,
                "unless" => BinOp::Unless,
                "atan2" => BinOp::Atan2,
                _ => return None,
            },
            _ => return None,
        })
    }

    /// Every recursion of the parser passes here (parentheses, arguments, operands of unary
    /// and right-associative operators), so this is where its depth is counted.
    fn binary(&mut self, min_prec: u8) -> Result<Node, ParseError> {
        self.depth += 1;
        if self.depth > self.limits.max_depth {
            return Err(self.err(
                self.pos(),
                format!("the expression nests deeper than the limit of {} levels", self.limits.max_depth),
            ));
        }
        let r = self.binary_inner(min_prec);
        self.depth -= 1;
        r
    }

    fn binary_inner(&mut self, min_prec: u8) -> Result<Node, ParseError> {
        let (mut lhs, mut lhs_depth) = self.unary()?;
        while let Some(op) = self.binary_op() {
            let prec = op.precedence();
            if prec < min_prec {
                break;
            }
            let op_pos = self.pos();
            self.next();
            let (return_bool, matching) = self.bin_modifiers()?;
            // `^` is right-associative, the others left-associative.
            let next_min = if op == BinOp::Pow { prec } else { prec + 1 };
            let (rhs, rhs_depth) = self.binary(next_min)?;
            let e = self.check_binary(op_pos, op, lhs, rhs, return_bool, matching)?;
            (lhs, lhs_depth) = self.node(op_pos, e, 1 + lhs_depth.max(rhs_depth))?;
        }
        Ok((lhs, lhs_depth))
    }

    fn bin_modifiers(&mut self) -> Result<(bool, Option<VectorMatching>), ParseError> {
        let mut return_bool = false;
        if self.keyword().as_deref() == Some("bool") {
            self.next();
            return_bool = true;
        }
        let on = match self.keyword().as_deref() {
            Some("on") => true,
            Some("ignoring") => false,
            Some("group_left" | "group_right") => {
                return Err(
                    self.err(self.pos(), "group_left and group_right need on(...) or ignoring(...) before them")
                );
            }
            _ => return Ok((return_bool, None)),
        };
        self.next();
        let labels = self.label_list()?;
        let mut matching = VectorMatching { card: Cardinality::OneToOne, on, labels, include: Vec::new() };
        if let Some(k @ ("group_left" | "group_right")) = self.keyword().as_deref() {
            matching.card = if k == "group_left" { Cardinality::ManyToOne } else { Cardinality::OneToMany };
            self.next();
            if *self.peek() == Tok::LParen {
                matching.include = self.label_list()?;
            }
        }
        Ok((return_bool, Some(matching)))
    }

    /// `(a, b, ...)` with an optional trailing comma; keywords are label names here too.
    fn label_list(&mut self) -> Result<Vec<String>, ParseError> {
        self.expect(Tok::LParen, "\"(\" before a list of label names")?;
        let mut out = Vec::new();
        loop {
            match self.next() {
                Tok::RParen => break,
                Tok::Ident(s) if is_label_name(&s) => {
                    out.push(s);
                    match self.next() {
                        Tok::Comma => {}
                        Tok::RParen => break,
                        _ => {
                            self.i -= 1;
                            return Err(self.unexpected("\",\" or \")\" in a list of label names"));
                        }
                    }
                }
                _ => {
                    self.i -= 1;
                    return Err(self.unexpected("a label name"));
                }
            }
        }
        Ok(out)
    }

    fn check_binary(
        &self,
        pos: usize,
        op: BinOp,
        lhs: Expr,
        rhs: Expr,
        return_bool: bool,
        matching: Option<VectorMatching>,
    ) -> Result<Expr, ParseError> {
        let (lt, rt) = (lhs.value_type(), rhs.value_type());
        if return_bool && !op.is_comparison() {
            return Err(self.err(pos, "bool modifier can only be used on comparison operators"));
        }
        if op.is_comparison() && !return_bool && lt == ValueType::Scalar && rt == ValueType::Scalar {
            return Err(self.err(pos, "comparisons between scalars must use BOOL modifier"));
        }
        for t in [lt, rt] {
            if t != ValueType::Scalar && t != ValueType::Vector {
                return Err(self.err(
                    pos,
                    format!("binary expression must contain only scalar and instant vector types, got {t}"),
                ));
            }
        }
        if op.is_set() && (lt == ValueType::Scalar || rt == ValueType::Scalar) {
            return Err(
                self.err(pos, format!("set operator {:?} not allowed in binary scalar expression", op.symbol()))
            );
        }
        let matching = if lt == ValueType::Vector && rt == ValueType::Vector {
            let mut m = matching.unwrap_or(VectorMatching {
                card: Cardinality::OneToOne,
                on: false,
                labels: Vec::new(),
                include: Vec::new(),
            });
            if m.on
                && let Some(l) = m.labels.iter().find(|l| m.include.contains(l))
            {
                return Err(self.err(pos, format!("label {l:?} must not occur in ON and GROUP clause at once")));
            }
            if op.is_set() {
                if m.card != Cardinality::OneToOne {
                    return Err(self.err(pos, format!("no grouping allowed for {:?} operation", op.symbol())));
                }
                m.card = Cardinality::ManyToMany;
            }
            Some(m)
        } else {
            if matching.as_ref().is_some_and(|m| !m.labels.is_empty() || !m.include.is_empty()) {
                return Err(self.err(pos, "vector matching only allowed between instant vectors"));
            }
            None
        };
        Ok(Expr::Binary(Box::new(Binary { op, lhs, rhs, return_bool, matching })))
    }

    /// Unary operators, then a primary expression with its postfixes.
    fn unary(&mut self) -> Result<Node, ParseError> {
        let pos = self.pos();
        match self.peek() {
            Tok::Sub | Tok::Add => {
                let negate = *self.peek() == Tok::Sub;
                self.next();
                // Unary operators bind like `*`: only `^` binds tighter.
                let (e, d) = self.binary(BinOp::Pow.precedence())?;
                let t = e.value_type();
                if t != ValueType::Scalar && t != ValueType::Vector {
                    return Err(self.err(
                        pos,
                        format!(
                            "unary expression only allowed on expressions of type scalar or instant vector, got {t:?}",
                            t = t.documented()
                        ),
                    ));
                }
                match (negate, e) {
                    (false, e) => Ok((e, d)),
                    (true, Expr::Number(n)) => Ok((Expr::Number(-n), d)),
                    (true, e) => self.node(pos, Expr::Neg(Box::new(e)), d + 1),
                }
            }
            _ => {
                let primary = self.primary()?;
                self.postfix(primary)
            }
        }
    }

    fn primary(&mut self) -> Result<Node, ParseError> {
        let pos = self.pos();
        match self.next() {
            Tok::Number(n) => Ok((Expr::Number(n), 1)),
            Tok::Str(s) => Ok((Expr::String(s), 1)),
            Tok::LParen => {
                let e = self.expr()?;
                self.expect(Tok::RParen, "\")\"")?;
                Ok(e)
            }
            Tok::LBrace => {
                self.i -= 1;
                let s = self.selector(None)?;
                Ok((Expr::Selector(s), 1))
            }
            Tok::At => Err(self.err(pos, "the @ modifier is not supported by timeshard's PromQL subset")),
            Tok::Ident(name) => {
                let lower = name.to_ascii_lowercase();
                let opens_call = *self.peek() == Tok::LParen;
                let grouping_follows = matches!(self.keyword().as_deref(), Some("by" | "without"));
                if let Some(op) = AggOp::from_name(&lower) {
                    return self.aggregate(pos, op);
                }
                if UNSUPPORTED_AGGREGATORS.contains(&lower.as_str()) && (opens_call || grouping_follows) {
                    return Err(self.err(pos, format!("aggregation {lower:?} is not supported by timeshard's PromQL subset (supported: sum, avg, min, max, count, topk, bottomk, quantile)")));
                }
                if opens_call {
                    return self.call(pos, &name);
                }
                if !name.bytes().next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || c == b':') {
                    return Err(self.err(pos, format!("invalid metric name {name:?}")));
                }
                let s = self.selector(Some(name))?;
                Ok((Expr::Selector(s), 1))
            }
            other => Err(self.err(pos, format!("unexpected {}, expected an expression", other.describe()))),
        }
    }

    fn selector(&mut self, name: Option<String>) -> Result<Selector, ParseError> {
        let pos = self.pos();
        let mut matchers = Vec::new();
        if *self.peek() == Tok::LBrace {
            self.next();
            loop {
                let label_pos = self.pos();
                let label = match self.next() {
                    Tok::RBrace => break,
                    Tok::Ident(s) if is_label_name(&s) => s,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("a label name or \"}\""));
                    }
                };
                let op = match self.next() {
                    Tok::Assign => MatchOp::Equal,
                    Tok::Neq => MatchOp::NotEqual,
                    Tok::EqlRegex => MatchOp::Regex,
                    Tok::NeqRegex => MatchOp::NotRegex,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("a label matching operator (=, !=, =~, !~)"));
                    }
                };
                let value = match self.next() {
                    Tok::Str(s) => s,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("a quoted label value"));
                    }
                };
                let m = Matcher::new(&label, op, &value, self.limits.max_regex_bytes)
                    .map_err(|e| self.err(label_pos, e.to_string()))?;
                if name.is_some() && label == METRIC_NAME {
                    return Err(self.err(
                        label_pos,
                        format!("metric name must not be set twice: {:?} or {value:?}", name.as_deref().unwrap_or("")),
                    ));
                }
                matchers.push(m);
                match self.next() {
                    Tok::Comma => {}
                    Tok::RBrace => break,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("\",\" or \"}\""));
                    }
                }
            }
        }
        if let Some(n) = name {
            matchers.push(Matcher::metric(&n));
        } else if !matchers.iter().any(|m| !m.matches("")) {
            return Err(self.err(pos, "vector selector must contain at least one non-empty matcher"));
        }
        if matchers.len() > self.limits.max_matchers {
            return Err(self.err(
                pos,
                format!(
                    "the selector has {} label matchers, more than the limit of {}",
                    matchers.len(),
                    self.limits.max_matchers
                ),
            ));
        }
        Ok(Selector { matchers, offset_ms: 0 })
    }

    fn postfix(&mut self, (mut e, d): Node) -> Result<Node, ParseError> {
        let mut offset_set = false;
        loop {
            let pos = self.pos();
            match self.peek() {
                Tok::LBracket => {
                    self.next();
                    let range = match self.next() {
                        Tok::Duration(ms) => ms,
                        _ => {
                            self.i -= 1;
                            return Err(self.unexpected("a duration such as 5m"));
                        }
                    };
                    if *self.peek() == Tok::Colon {
                        return Err(self
                            .err(pos, "subqueries (expr[range:step]) are not supported by timeshard's PromQL subset"));
                    }
                    self.expect(Tok::RBracket, "\"]\"")?;
                    e = match e {
                        Expr::Selector(_) if offset_set => {
                            return Err(self.err(pos, "no offset modifiers allowed before range"));
                        }
                        Expr::Selector(selector) if range > 0 => Expr::Matrix { selector, range_ms: range },
                        Expr::Selector(_) => return Err(self.err(pos, "range must be positive")),
                        Expr::Matrix { .. } => return Err(self.err(pos, "unexpected \"[\": the range is already set")),
                        _ => {
                            return Err(self.err(pos, "ranges only allowed for vector selectors (subqueries, expr[range:step], are not supported)"));
                        }
                    };
                }
                Tok::At => return Err(self.err(pos, "the @ modifier is not supported by timeshard's PromQL subset")),
                Tok::Ident(s) if s.eq_ignore_ascii_case("offset") => {
                    self.next();
                    let negative = *self.peek() == Tok::Sub;
                    if negative {
                        self.next();
                    }
                    let ms = match self.next() {
                        Tok::Duration(ms) => ms,
                        _ => {
                            self.i -= 1;
                            return Err(self.unexpected("a duration after offset"));
                        }
                    };
                    if offset_set {
                        return Err(self.err(pos, "offset may not be set multiple times"));
                    }
                    let sel = match &mut e {
                        Expr::Selector(s) => s,
                        Expr::Matrix { selector, .. } => selector,
                        _ => {
                            return Err(self.err(pos, "offset modifier must be preceded by an instant vector selector or range vector selector"));
                        }
                    };
                    sel.offset_ms = if negative { -ms } else { ms };
                    offset_set = true;
                }
                _ => return Ok((e, d)),
            }
        }
    }

    fn aggregate(&mut self, pos: usize, op: AggOp) -> Result<Node, ParseError> {
        let mut grouping = None;
        if let Some(k @ ("by" | "without")) = self.keyword().as_deref() {
            let without = k == "without";
            self.next();
            grouping = Some((without, self.label_list()?));
        }
        self.expect(Tok::LParen, &format!("\"(\" after {}", op.name()))?;
        let mut args = Vec::new();
        if *self.peek() != Tok::RParen {
            loop {
                args.push(self.expr()?);
                match self.next() {
                    Tok::Comma if *self.peek() != Tok::RParen => {}
                    Tok::Comma | Tok::RParen => break,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("\",\" or \")\""));
                    }
                }
            }
        } else {
            self.next();
        }
        if grouping.is_none()
            && let Some(k @ ("by" | "without")) = self.keyword().as_deref()
        {
            let without = k == "without";
            self.next();
            grouping = Some((without, self.label_list()?));
        }
        let want = if op.takes_param() { 2 } else { 1 };
        if args.is_empty() {
            return Err(self.err(pos, "no arguments for aggregate expression provided"));
        }
        if args.len() != want {
            return Err(self.err(
                pos,
                format!(
                    "wrong number of arguments for aggregate expression provided, expected {want}, got {}",
                    args.len()
                ),
            ));
        }
        let (expr, d) = args.pop().unwrap_or((Expr::Number(0.0), 0));
        if expr.value_type() != ValueType::Vector {
            return Err(self.err(
                pos,
                format!("expected type instant vector in aggregation expression, got {}", expr.value_type()),
            ));
        }
        let param = args.pop();
        if let Some((p, _)) = &param
            && p.value_type() != ValueType::Scalar
        {
            return Err(self.err(pos, format!("expected type scalar in aggregation parameter, got {}", p.value_type())));
        }
        let depth = 1 + d.max(param.as_ref().map_or(0, |p| p.1));
        let (without, mut grouping) = grouping.unwrap_or((false, Vec::new()));
        grouping.sort();
        grouping.dedup();
        let agg = Aggregate { op, expr, param: param.map(|p| p.0), without, grouping };
        self.node(pos, Expr::Aggregate(Box::new(agg)), depth)
    }

    fn call(&mut self, pos: usize, name: &str) -> Result<Node, ParseError> {
        let func = match Func::from_name(name) {
            Some(f) => f,
            None if UNSUPPORTED_FUNCTIONS.contains(&name) => {
                let supported: Vec<&str> = Func::supported_names().collect();
                return Err(self.err(
                    pos,
                    format!(
                        "function {name:?} is not supported by timeshard's PromQL subset (supported: {})",
                        supported.join(", ")
                    ),
                ));
            }
            None => return Err(self.err(pos, format!("unknown function with name {name:?}"))),
        };
        self.expect(Tok::LParen, "\"(\"")?;
        let mut args = Vec::new();
        let mut depth = 0;
        if *self.peek() == Tok::RParen {
            self.next();
        } else {
            loop {
                let (a, d) = self.expr()?;
                depth = depth.max(d);
                args.push(a);
                match self.next() {
                    Tok::Comma if *self.peek() != Tok::RParen => {}
                    Tok::Comma | Tok::RParen => break,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("\",\" or \")\""));
                    }
                }
            }
        }
        let types = func.arg_types();
        let min = types.len() - func.optional_args();
        if args.len() < min || args.len() > types.len() {
            let expected = if func.optional_args() == 0 {
                format!("expected {} argument(s)", types.len())
            } else if args.len() < min {
                format!("expected at least {min} argument(s)")
            } else {
                format!("expected at most {} argument(s)", types.len())
            };
            return Err(self.err(pos, format!("{expected} in call to {name:?}, got {}", args.len())));
        }
        for (a, want) in args.iter().zip(types) {
            if a.value_type() != *want {
                return Err(
                    self.err(pos, format!("expected type {want} in call to function {name:?}, got {}", a.value_type()))
                );
            }
        }
        if func == Func::LabelReplace {
            if let Some(Expr::String(dst)) = args.get(1)
                && !is_label_name(dst)
            {
                return Err(self.err(pos, format!("invalid destination label name in label_replace(): {dst}")));
            }
            if let Some(Expr::String(re)) = args.get(4) {
                super::matcher::anchored_regex(re, self.limits.max_regex_bytes)
                    .map_err(|e| self.err(pos, format!("invalid regular expression in label_replace(): {e}")))?;
            }
            if args[1..].iter().any(|a| !matches!(a, Expr::String(_))) {
                return Err(self.err(pos, "label_replace() takes string literals as its last four arguments"));
            }
        }
        self.node(pos, Expr::Call(Call { func, args }), depth + 1)
    }
}

#[cfg(test)]
#[path = "parser_tests.rs"]
mod tests;
