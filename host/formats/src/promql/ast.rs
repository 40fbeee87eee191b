//! The parsed form of a PromQL expression, its value types, and the table of functions
//! (those the evaluator supports, and Prometheus' others, refused by name).

use std::fmt;

use super::matcher::Matcher;

/// The type an expression evaluates to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Scalar,
    Vector,
    Matrix,
    String,
}

impl ValueType {
    /// The name Prometheus' messages use.
    pub fn documented(self) -> &'static str {
        match self {
            ValueType::Scalar => "scalar",
            ValueType::Vector => "instant vector",
            ValueType::Matrix => "range vector",
            ValueType::String => "string",
        }
    }

    /// The `resultType` of an answer.
    pub fn result_type(self) -> &'static str {
        match self {
            ValueType::Scalar => "scalar",
            ValueType::Vector => "vector",
            ValueType::Matrix => "matrix",
            ValueType::String => "string",
        }
    }
}

/// An instant vector selector: `name{matchers} offset d`. The metric name, if given outside the
/// braces, is also among `matchers` (as `__name__="name"`).
#[derive(Debug, Clone)]
pub struct Selector {
    pub matchers: Vec<Matcher>,
    /// Milliseconds; positive looks back.
    pub offset_ms: i64,
}

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Atan2,
    Eql,
    Neq,
    Gtr,
    Lss,
    Gte,
    Lte,
    And,
    Or,
    Unless,
}

impl BinOp {
    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Eql | BinOp::Neq | BinOp::Gtr | BinOp::Lss | BinOp::Gte | BinOp::Lte)
    }

    pub fn is_set(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or | BinOp::Unless)
    }

    /// Arithmetic drops the metric name from its results; comparisons, set operators and (as
    /// in Prometheus 2.x) `atan2` keep it.
    pub fn drops_name(self) -> bool {
        matches!(self, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod | BinOp::Pow)
    }

    /// Binding strength: `or` < `and unless` < comparisons < `+ -` < `* / % atan2` < `^`.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And | BinOp::Unless => 2,
            BinOp::Eql | BinOp::Neq | BinOp::Gtr | BinOp::Lss | BinOp::Gte | BinOp::Lte => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Mod | BinOp::Atan2 => 5,
            BinOp::Pow => 6,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::Pow => "^",
            BinOp::Atan2 => "atan2",
            BinOp::Eql => "==",
            BinOp::Neq => "!=",
            BinOp::Gtr => ">",
            BinOp::Lss => "<",
            BinOp::Gte => ">=",
            BinOp::Lte => "<=",
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::Unless => "unless",
        }
    }
}

/// How the series of two vectors pair up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    OneToOne,
    /// `group_left`: many series on the left to one on the right.
    ManyToOne,
    /// `group_right`.
    OneToMany,
    /// Set operators.
    ManyToMany,
}

/// `on(...)`/`ignoring(...)` and `group_left(...)`/`group_right(...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorMatching {
    pub card: Cardinality,
    /// `true` for `on`, `false` for `ignoring` (or no clause: ignoring nothing).
    pub on: bool,
    pub labels: Vec<String>,
    /// Labels copied from the "one" side (`group_left(a, b)`).
    pub include: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Binary {
    pub op: BinOp,
    pub lhs: Expr,
    pub rhs: Expr,
    pub return_bool: bool,
    /// Present only when both sides are instant vectors.
    pub matching: Option<VectorMatching>,
}

/// An aggregation operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggOp {
    Sum,
    Avg,
    Min,
    Max,
    Count,
    Topk,
    Bottomk,
    Quantile,
}

impl AggOp {
    pub fn name(self) -> &'static str {
        match self {
            AggOp::Sum => "sum",
            AggOp::Avg => "avg",
            AggOp::Min => "min",
            AggOp::Max => "max",
            AggOp::Count => "count",
            AggOp::Topk => "topk",
            AggOp::Bottomk => "bottomk",
            AggOp::Quantile => "quantile",
        }
    }

    pub fn from_name(name: &str) -> Option<AggOp> {
        Some(match name {
            "sum" => AggOp::Sum,
            "avg" => AggOp::Avg,
            "min" => AggOp::Min,
            "max" => AggOp::Max,
            "count" => AggOp::Count,
            "topk" => AggOp::Topk,
            "bottomk" => AggOp::Bottomk,
            "quantile" => AggOp::Quantile,
            _ => return None,
        })
    }

    pub fn takes_param(self) -> bool {
        matches!(self, AggOp::Topk | AggOp::Bottomk | AggOp::Quantile)
    }
}

/// Prometheus' aggregators this subset refuses (named in the error).
pub const UNSUPPORTED_AGGREGATORS: [&str; 4] = ["group", "stddev", "stdvar", "count_values"];

#[derive(Debug, Clone)]
pub struct Aggregate {
    pub op: AggOp,
    pub expr: Expr,
    pub param: Option<Expr>,
    /// `true` for `without`, `false` for `by` (or no clause: by nothing).
    pub without: bool,
    /// Sorted and deduplicated.
    pub grouping: Vec<String>,
}

/// A function of the supported subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Rate,
    Irate,
    Increase,
    Delta,
    Deriv,
    AvgOverTime,
    MinOverTime,
    MaxOverTime,
    SumOverTime,
    CountOverTime,
    LastOverTime,
    StddevOverTime,
    StdvarOverTime,
    PresentOverTime,
    QuantileOverTime,
    HistogramQuantile,
    Abs,
    Ceil,
    Floor,
    Round,
    Clamp,
    ClampMin,
    ClampMax,
    Time,
    Vector,
    Scalar,
    LabelReplace,
}

use ValueType::{Matrix as M, Scalar as S, String as Str, Vector as V};

/// Name, argument types, how many trailing arguments are optional, return type.
const FUNCS: [(Func, &str, &[ValueType], usize, ValueType); 27] = [
    (Func::Rate, "rate", &[M], 0, V),
    (Func::Irate, "irate", &[M], 0, V),
    (Func::Increase, "increase", &[M], 0, V),
    (Func::Delta, "delta", &[M], 0, V),
    (Func::Deriv, "deriv", &[M], 0, V),
    (Func::AvgOverTime, "avg_over_time", &[M], 0, V),
    (Func::MinOverTime, "min_over_time", &[M], 0, V),
    (Func::MaxOverTime, "max_over_time", &[M], 0, V),
    (Func::SumOverTime, "sum_over_time", &[M], 0, V),
    (Func::CountOverTime, "count_over_time", &[M], 0, V),
    (Func::LastOverTime, "last_over_time", &[M], 0, V),
    (Func::StddevOverTime, "stddev_over_time", &[M], 0, V),
    (Func::StdvarOverTime, "stdvar_over_time", &[M], 0, V),
    (Func::PresentOverTime, "present_over_time", &[M], 0, V),
    (Func::QuantileOverTime, "quantile_over_time", &[S, M], 0, V),
    (Func::HistogramQuantile, "histogram_quantile", &[S, V], 0, V),
    (Func::Abs, "abs", &[V], 0, V),
    (Func::Ceil, "ceil", &[V], 0, V),
    (Func::Floor, "floor", &[V], 0, V),
    (Func::Round, "round", &[V, S], 1, V),
    (Func::Clamp, "clamp", &[V, S, S], 0, V),
    (Func::ClampMin, "clamp_min", &[V, S], 0, V),
    (Func::ClampMax, "clamp_max", &[V, S], 0, V),
    (Func::Time, "time", &[], 0, S),
    (Func::Vector, "vector", &[S], 0, V),
    (Func::Scalar, "scalar", &[V], 0, S),
    (Func::LabelReplace, "label_replace", &[V, Str, Str, Str, Str], 0, V),
];

/// Prometheus' other functions: known, refused by name.
pub const UNSUPPORTED_FUNCTIONS: [&str; 44] = [
    "absent",
    "absent_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "changes",
    "cos",
    "cosh",
    "days_in_month",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "deg",
    "exp",
    "histogram_count",
    "histogram_fraction",
    "histogram_sum",
    "holt_winters",
    "hour",
    "idelta",
    "label_join",
    "ln",
    "log10",
    "log2",
    "minute",
    "month",
    "pi",
    "predict_linear",
    "rad",
    "resets",
    "sgn",
    "sin",
    "sinh",
    "sort",
    "sort_desc",
    "sqrt",
    "tan",
    "tanh",
    "timestamp",
    "year",
    "mad_over_time",
];

impl Func {
    pub fn from_name(name: &str) -> Option<Func> {
        FUNCS.iter().find(|f| f.1 == name).map(|f| f.0)
    }

    fn entry(self) -> &'static (Func, &'static str, &'static [ValueType], usize, ValueType) {
        FUNCS.iter().find(|f| f.0 == self).unwrap_or(&FUNCS[0])
    }

    pub fn name(self) -> &'static str {
        self.entry().1
    }

    pub fn arg_types(self) -> &'static [ValueType] {
        self.entry().2
    }

    pub fn optional_args(self) -> usize {
        self.entry().3
    }

    pub fn return_type(self) -> ValueType {
        self.entry().4
    }

    /// The supported functions' names, for error messages.
    pub fn supported_names() -> impl Iterator<Item = &'static str> {
        FUNCS.iter().map(|f| f.1)
    }
}

#[derive(Debug, Clone)]
pub struct Call {
    pub func: Func,
    pub args: Vec<Expr>,
}

/// A parsed expression. Parentheses leave no node.
#[derive(Debug, Clone)]
pub enum Expr {
    Number(f64),
    String(String),
    Selector(Selector),
    /// `selector[range]`.
    Matrix {
        selector: Selector,
        range_ms: i64,
    },
    /// Unary minus (unary plus leaves no node).
    Neg(Box<Expr>),
    Binary(Box<Binary>),
    Aggregate(Box<Aggregate>),
    Call(Call),
}

impl Expr {
    pub fn value_type(&self) -> ValueType {
        match self {
            Expr::Number(_) => ValueType::Scalar,
            Expr::String(_) => ValueType::String,
            Expr::Selector(_) => ValueType::Vector,
            Expr::Matrix { .. } => ValueType::Matrix,
            Expr::Neg(e) => e.value_type(),
            Expr::Binary(b) => {
                if b.lhs.value_type() == ValueType::Scalar && b.rhs.value_type() == ValueType::Scalar {
                    ValueType::Scalar
                } else {
                    ValueType::Vector
                }
            }
            Expr::Aggregate(_) => ValueType::Vector,
            Expr::Call(c) => c.func.return_type(),
        }
    }

    /// The selectors the expression reads, each once, in order.
    pub fn selectors(&self) -> Vec<(&Selector, Option<i64>)> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                Expr::Number(_) | Expr::String(_) => {}
                Expr::Selector(s) => out.push((s, None)),
                Expr::Matrix { selector, range_ms } => out.push((selector, Some(*range_ms))),
                Expr::Neg(e) => stack.push(e),
                Expr::Binary(b) => {
                    stack.push(&b.rhs);
                    stack.push(&b.lhs);
                }
                Expr::Aggregate(a) => {
                    stack.push(&a.expr);
                    if let Some(p) = &a.param {
                        stack.push(p);
                    }
                }
                Expr::Call(c) => stack.extend(c.args.iter().rev()),
            }
        }
        out
    }
}

/// A duration as Prometheus prints it (`1h30m`, `5m`, `0s`).
pub fn format_duration(ms: i64) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let (sign, mut rest) = if ms < 0 { ("-", -(ms as i128)) } else { ("", ms as i128) };
    out.push_str(sign);
    for (unit, size) in [
        ("y", 31_536_000_000i128),
        ("w", 604_800_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if rest >= size {
            out.push_str(&(rest / size).to_string());
            out.push_str(unit);
            rest %= size;
        }
    }
    out
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.documented())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_table_is_consistent() {
        for name in Func::supported_names() {
            let f = Func::from_name(name).unwrap();
            assert_eq!(f.name(), name);
            assert!(!UNSUPPORTED_FUNCTIONS.contains(&name), "{name}");
        }
        assert_eq!(Func::Round.optional_args(), 1);
        assert_eq!(Func::Time.return_type(), ValueType::Scalar);
        assert_eq!(format_duration(5_400_000), "1h30m");
        assert_eq!(format_duration(250), "250ms");
    }
}
