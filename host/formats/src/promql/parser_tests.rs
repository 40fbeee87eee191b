//! The parser's tests: shapes, Prometheus' type errors, refusals, and bounds.

use proptest::prelude::*;

use super::*;

fn p(s: &str) -> Expr {
    parse(s, &Limits::default()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn err(s: &str) -> String {
    match parse(s, &Limits::default()) {
        Ok(e) => panic!("{s} parsed as {e:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn precedence_and_associativity() {
    // 1 + 2 * 3 ^ 2 ^ 0.5 - 4: `^` right-associative and tightest, then `*`, then `+ -`.
    let Expr::Binary(b) = p("a + b * c ^ d ^ e - f") else { panic!() };
    assert_eq!(b.op, BinOp::Sub);
    let Expr::Binary(l) = &b.lhs else { panic!() };
    assert_eq!(l.op, BinOp::Add);
    let Expr::Binary(m) = &l.rhs else { panic!() };
    assert_eq!(m.op, BinOp::Mul);
    let Expr::Binary(pw) = &m.rhs else { panic!() };
    assert_eq!(pw.op, BinOp::Pow);
    assert!(matches!(&pw.rhs, Expr::Binary(x) if x.op == BinOp::Pow));
    // Unary minus binds like `*`: -a ^ b is -(a ^ b), -a * b is (-a) * b.
    assert!(matches!(p("-a ^ b"), Expr::Neg(e) if matches!(*e, Expr::Binary(_))));
    assert!(matches!(p("-a * b"), Expr::Binary(b) if matches!(b.lhs, Expr::Neg(_))));
    assert!(matches!(p("-2"), Expr::Number(n) if n == -2.0));
    assert!(matches!(p("a or b and c"), Expr::Binary(b) if b.op == BinOp::Or));
    assert!(matches!(p("a > bool b + 1"), Expr::Binary(b) if b.op == BinOp::Gtr && b.return_bool));
}

#[test]
fn selectors_ranges_and_offsets() {
    let Expr::Matrix { selector, range_ms } = p(r#"http_requests_total{job="api", code=~"5..",}[5m] offset 1h"#) else {
        panic!()
    };
    assert_eq!(range_ms, 300_000);
    assert_eq!(selector.offset_ms, 3_600_000);
    assert_eq!(selector.matchers.len(), 3);
    assert_eq!(selector.matchers[2], Matcher::metric("http_requests_total"));
    let Expr::Selector(s) = p(r#"{__name__="up"} offset -5m"#) else { panic!() };
    assert_eq!(s.offset_ms, -300_000);
    assert!(matches!(p("x:y_z"), Expr::Selector(_)));
}

#[test]
fn aggregations_calls_and_matching() {
    let Expr::Aggregate(a) = p("sum by (job, le) (rate(x[5m]))") else { panic!() };
    assert_eq!((a.op, a.without, a.grouping.clone()), (AggOp::Sum, false, vec!["job".to_string(), "le".to_string()]));
    let Expr::Aggregate(a) = p("topk(3, x) without (instance)") else { panic!() };
    assert!(a.without && a.param.is_some());
    let Expr::Aggregate(a) = p("SUM(x) BY (a)") else { panic!() };
    assert_eq!(a.grouping, vec!["a".to_string()]);
    let Expr::Binary(b) = p("a * on(job) group_left(team) b") else { panic!() };
    let m = b.matching.unwrap();
    assert_eq!(
        (m.card, m.on, m.labels, m.include),
        (Cardinality::ManyToOne, true, vec!["job".into()], vec!["team".into()])
    );
    let Expr::Binary(b) = p("a / ignoring(code) group_right b") else { panic!() };
    assert_eq!(b.matching.unwrap().card, Cardinality::OneToMany);
    let Expr::Binary(b) = p("a and b") else { panic!() };
    assert_eq!(b.matching.unwrap().card, Cardinality::ManyToMany);
    assert!(p("1 + 2").value_type() == ValueType::Scalar);
    assert!(matches!(p("time()"), Expr::Call(c) if c.func == Func::Time));
    assert!(matches!(p("round(x)"), Expr::Call(c) if c.args.len() == 1));
    assert!(matches!(p(r#"label_replace(up, "dst", "$1", "src", "(.*)")"#), Expr::Call(_)));
    assert!(matches!(p("histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m])))"), Expr::Call(_)));
}

#[test]
fn prometheus_type_errors() {
    for (q, want) in [
        ("rate(x)", r#"expected type range vector in call to function "rate", got instant vector"#),
        ("sum(x[5m])", "expected type instant vector in aggregation expression, got range vector"),
        ("1 > 2", "comparisons between scalars must use BOOL modifier"),
        ("a + bool b", "bool modifier can only be used on comparison operators"),
        ("1 and x", "set operator \"and\" not allowed in binary scalar expression"),
        ("a and on(x) group_left b", "no grouping allowed for \"and\" operation"),
        ("a * on(x) group_left(x) b", "must not occur in ON and GROUP clause at once"),
        ("1 + on(x) b", "vector matching only allowed between instant vectors"),
        ("x[5m] + 1", "binary expression must contain only scalar and instant vector types"),
        ("{}", "vector selector must contain at least one non-empty matcher"),
        (r#"{a=~".*"}"#, "at least one non-empty matcher"),
        (r#"x{__name__="y"}"#, "metric name must not be set twice"),
        ("topk(x)", "wrong number of arguments for aggregate expression provided, expected 2, got 1"),
        ("clamp(x, 1)", r#"expected 3 argument(s) in call to "clamp", got 2"#),
        ("round(x, 1, 2)", r#"expected at most 2 argument(s) in call to "round", got 3"#),
        ("foo(x)", r#"unknown function with name "foo""#),
        ("sum(x) by (a) by (b)", "unexpected identifier \"by\""),
        ("(x + 1)[5m]", "ranges only allowed for vector selectors"),
        ("sum(x) offset 5m", "offset modifier must be preceded by"),
        ("x offset 5m offset 5m", "offset may not be set multiple times"),
        ("x offset 5m [5m]", "no offset modifiers allowed before range"),
        (r#"label_replace(x, "1a", "", "b", "")"#, "invalid destination label name"),
        (r#"label_replace(x, "a", "", "b", "(")"#, "invalid regular expression in label_replace()"),
        ("x{a=b}", "expected a quoted label value"),
        ("x +", "unexpected end of input, expected an expression"),
        ("(x", "unexpected end of input, expected \")\""),
        ("x y", "unexpected identifier \"y\", expected end of input"),
        ("-x[5m]", "unary expression only allowed on expressions of type scalar or instant vector"),
    ] {
        let e = err(q);
        assert!(e.contains(want), "{q}: {e}");
    }
    assert_eq!(err("x +\n  )"), "2:3: parse error: unexpected \")\", expected an expression");
}

#[test]
fn what_is_outside_the_subset_is_named() {
    for (q, want) in [
        ("predict_linear(x[5m], 60)", "function \"predict_linear\" is not supported"),
        ("sort(x)", "function \"sort\" is not supported"),
        ("stddev(x)", "aggregation \"stddev\" is not supported"),
        ("count_values(\"v\", x)", "aggregation \"count_values\" is not supported"),
        ("rate(x[5m:1m])", "subqueries (expr[range:step]) are not supported"),
        ("x @ 100", "the @ modifier is not supported"),
    ] {
        let e = err(q);
        assert!(e.contains(want), "{q}: {e}");
    }
}

#[test]
fn depth_and_length_are_bounded_without_overflowing_the_stack() {
    let limits = Limits::default();
    let ok = format!("{}x{}", "(".repeat(limits.max_depth - 1), ")".repeat(limits.max_depth - 1));
    assert!(parse(&ok, &limits).is_ok());
    for hostile in [
        format!("{}x{}", "(".repeat(100_000), ")".repeat(100_000)),
        "-".repeat(50_000) + "x",
        format!("x{}", " + x".repeat(10_000)),
        format!("x{}", " ^ x".repeat(10_000)),
        format!("{}x{}", "abs(".repeat(10_000), ")".repeat(10_000)),
        format!("{}x{}", "sum(".repeat(10_000), ")".repeat(10_000)),
    ] {
        let short = Limits { max_query_bytes: 1 << 20, ..Limits::default() };
        let e = parse(&hostile, &short).unwrap_err().to_string();
        assert!(e.contains("nests deeper than the limit of 128 levels"), "{e}");
    }
    let long = "x".repeat(70_000);
    let e = parse(&long, &limits).unwrap_err().to_string();
    assert!(e.contains("70000 bytes, more than the limit of 65536 bytes"), "{e}");
    let e = parse(&format!("x{{{}}}", "a=\"b\",".repeat(65)), &limits).unwrap_err().to_string();
    assert!(e.contains("66 label matchers, more than the limit of 64"), "{e}");
}

fn arb_query() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("x".to_string()),
        Just("y{a=\"b\"}".to_string()),
        Just("1".to_string()),
        Just("rate(x[5m])".to_string()),
    ];
    leaf.prop_recursive(6, 64, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone(), prop_oneof![Just("+"), Just("*"), Just("/"), Just("^"), Just("-")])
                .prop_map(|(a, b, op)| format!("{a} {op} {b}")),
            inner.clone().prop_map(|a| format!("({a})")),
            inner.clone().prop_map(|a| format!("-{a}")),
            inner.clone().prop_map(|a| format!("abs(x + ({a}))")),
        ]
    })
}

proptest! {
    /// Any bytes: an answer or an error, never a panic.
    #[test]
    fn arbitrary_input_never_panics(s in "\\PC{0,64}") {
        let _ = parse(&s, &Limits::default());
    }

    /// Any byte soup of PromQL's own tokens, too.
    #[test]
    fn token_soup_never_panics(parts in proptest::collection::vec(prop_oneof![
        Just("("), Just(")"), Just("{"), Just("}"), Just("["), Just("]"), Just(","), Just("x"),
        Just("sum"), Just("by"), Just("rate"), Just("5m"), Just("\"a\""), Just("="), Just("=~"),
        Just("offset"), Just("+"), Just("-"), Just("bool"), Just("on"), Just("group_left"), Just("1"),
        Just(":"), Just("@"), Just("topk"), Just(" "),
    ], 0..40)) {
        let _ = parse(&parts.concat(), &Limits::default());
    }

    /// Generated expressions of the subset parse, and to a type a query may have.
    #[test]
    fn generated_expressions_parse(q in arb_query()) {
        let e = parse(&q, &Limits::default());
        prop_assert!(e.is_ok(), "{}: {:?}", q, e);
    }
}
