//! Binary operators between scalars and vectors: arithmetic, comparisons (filtering, or 0/1
//! with `bool`) and the set operators, with Prometheus' vector matching (`on`, `ignoring`,
//! `group_left`, `group_right`) and its errors for ambiguous matches.

use std::collections::HashMap;

use super::{Collector, EvalError, Evaluator, Sample, Series, Val, by_step, merge_series};
use crate::promql::ast::{BinOp, Binary, Cardinality, VectorMatching};
use crate::promql::labels::{Labels, METRIC_NAME};

/// `lhs op rhs` on two numbers, and whether a comparison holds (always true for arithmetic).
fn apply(op: BinOp, l: f64, r: f64) -> (f64, bool) {
    match op {
        BinOp::Add => (l + r, true),
        BinOp::Sub => (l - r, true),
        BinOp::Mul => (l * r, true),
        BinOp::Div => (l / r, true),
        // Go's math.Mod and math.Pow agree with Rust's `%` and `powf`.
        BinOp::Mod => (l % r, true),
        BinOp::Pow => (l.powf(r), true),
        BinOp::Atan2 => (l.atan2(r), true),
        BinOp::Eql => (l, l == r),
        BinOp::Neq => (l, l != r),
        BinOp::Gtr => (l, l > r),
        BinOp::Lss => (l, l < r),
        BinOp::Gte => (l, l >= r),
        BinOp::Lte => (l, l <= r),
        BinOp::And | BinOp::Or | BinOp::Unless => (l, true),
    }
}

/// The key series are matched on: the `on` labels, or all but the `ignoring` ones and the
/// metric name.
fn signature(labels: &Labels, m: &VectorMatching) -> Labels {
    if m.on {
        labels.keep(&m.labels)
    } else {
        let mut drop = m.labels.clone();
        drop.push(METRIC_NAME.to_string());
        labels.drop(&drop)
    }
}

impl Evaluator<'_> {
    pub(super) fn binary(&mut self, b: &Binary) -> Result<Val, EvalError> {
        let lhs = self.eval(&b.lhs)?;
        let rhs = self.eval(&b.rhs)?;
        match (lhs, rhs) {
            (Val::Scalar(l), Val::Scalar(r)) => Ok(Val::Scalar(
                l.iter()
                    .zip(&r)
                    .map(|(&l, &r)| {
                        let (v, keep) = apply(b.op, l, r);
                        if b.op.is_comparison() { f64::from(u8::from(keep)) } else { v }
                    })
                    .collect(),
            )),
            (Val::Vector(v), Val::Scalar(s)) => self.vector_scalar(b, v, &s, false),
            (Val::Scalar(s), Val::Vector(v)) => self.vector_scalar(b, v, &s, true),
            (Val::Vector(l), Val::Vector(r)) => {
                let m = b.matching.clone().unwrap_or(VectorMatching {
                    card: Cardinality::OneToOne,
                    on: false,
                    labels: Vec::new(),
                    include: Vec::new(),
                });
                if b.op.is_set() { self.set_op(b.op, &m, l, r) } else { self.vector_vector(b, &m, l, r) }
            }
            _ => Err(EvalError::BadData("binary expression must contain only scalar and instant vector types".into())),
        }
    }

    /// A vector and a scalar; `swapped` when the scalar is on the left.
    fn vector_scalar(&mut self, b: &Binary, v: Vec<Series>, s: &[f64], swapped: bool) -> Result<Val, EvalError> {
        let drop_name = b.op.drops_name() || b.return_bool;
        let mapped = v
            .into_iter()
            .map(|series| {
                let samples = series
                    .samples
                    .iter()
                    .filter_map(|p| {
                        let k = s[self.step_of(p.t)];
                        let (l, r) = if swapped { (k, p.v) } else { (p.v, k) };
                        let (mut value, keep) = apply(b.op, l, r);
                        // A comparison keeps the vector's value, whichever side it is on.
                        if b.op.is_comparison() && swapped {
                            value = r;
                        }
                        if b.return_bool {
                            return Some(Sample { t: p.t, v: f64::from(u8::from(keep)) });
                        }
                        keep.then_some(Sample { t: p.t, v: value })
                    })
                    .collect();
                let labels = if drop_name { series.labels.without_name() } else { series.labels };
                Series { labels, samples }
            })
            .collect();
        Ok(Val::Vector(merge_series(mapped)?))
    }

    fn vector_vector(
        &mut self,
        b: &Binary,
        m: &VectorMatching,
        l: Vec<Series>,
        r: Vec<Series>,
    ) -> Result<Val, EvalError> {
        // The "many" side is walked, the "one" side looked up: swap for group_right.
        let swapped = m.card == Cardinality::OneToMany;
        let (many, one) = if swapped { (r, l) } else { (l, r) };
        let many_sig: Vec<Labels> = many.iter().map(|s| signature(&s.labels, m)).collect();
        let one_sig: Vec<Labels> = one.iter().map(|s| signature(&s.labels, m)).collect();
        let many_steps = by_step(self, &many);
        let one_steps = by_step(self, &one);
        let mut result_labels: HashMap<(usize, usize), Labels> = HashMap::new();
        let mut out = Collector::default();
        let mut lookup: HashMap<&Labels, (usize, f64)> = HashMap::new();
        let mut matched: HashMap<&Labels, Vec<Labels>> = HashMap::new();
        for step in 0..self.steps {
            self.check_stop()?;
            let (ms, os) = (&many_steps[step], &one_steps[step]);
            if ms.is_empty() || os.is_empty() {
                continue;
            }
            let t = self.range.at(step);
            lookup.clear();
            matched.clear();
            for &(j, v) in os {
                if let Some(&(prev, _)) = lookup.get(&one_sig[j]) {
                    let side = if swapped { "left" } else { "right" };
                    return Err(EvalError::Execution(format!(
                        "found duplicate series for the match group {} on the {side} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                        one_sig[j], one[j].labels, one[prev].labels
                    )));
                }
                lookup.insert(&one_sig[j], (j, v));
            }
            for &(i, v) in ms {
                let Some(&(j, ov)) = lookup.get(&many_sig[i]) else { continue };
                let (lv, rv) = if swapped { (ov, v) } else { (v, ov) };
                let (mut value, keep) = apply(b.op, lv, rv);
                if b.return_bool {
                    value = f64::from(u8::from(keep));
                } else if !keep {
                    continue;
                }
                let labels = result_labels
                    .entry((i, j))
                    .or_insert_with(|| result_metric(&many[i].labels, &one[j].labels, b, m))
                    .clone();
                let seen = matched.entry(&many_sig[i]).or_default();
                if m.card == Cardinality::OneToOne {
                    if !seen.is_empty() {
                        return Err(EvalError::Execution(
                            "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)".into(),
                        ));
                    }
                } else if seen.contains(&labels) {
                    return Err(EvalError::Execution(
                        "multiple matches for labels: grouping labels must ensure unique matches".into(),
                    ));
                }
                seen.push(labels.clone());
                out.push(&labels, t, value)?;
            }
        }
        Ok(Val::Vector(out.finish()))
    }

    fn set_op(&mut self, op: BinOp, m: &VectorMatching, l: Vec<Series>, r: Vec<Series>) -> Result<Val, EvalError> {
        let l_sig: Vec<Labels> = l.iter().map(|s| signature(&s.labels, m)).collect();
        let r_sig: Vec<Labels> = r.iter().map(|s| signature(&s.labels, m)).collect();
        let (ls, rs) = (by_step(self, &l), by_step(self, &r));
        let mut out = Collector::default();
        let mut sigs = std::collections::HashSet::new();
        for step in 0..self.steps {
            let t = self.range.at(step);
            sigs.clear();
            match op {
                BinOp::And => {
                    sigs.extend(rs[step].iter().map(|&(j, _)| &r_sig[j]));
                    for &(i, v) in &ls[step] {
                        if sigs.contains(&l_sig[i]) {
                            out.push(&l[i].labels, t, v)?;
                        }
                    }
                }
                BinOp::Or => {
                    for &(i, v) in &ls[step] {
                        sigs.insert(&l_sig[i]);
                        out.push(&l[i].labels, t, v)?;
                    }
                    for &(j, v) in &rs[step] {
                        if !sigs.contains(&r_sig[j]) {
                            out.push(&r[j].labels, t, v)?;
                        }
                    }
                }
                _ => {
                    sigs.extend(rs[step].iter().map(|&(j, _)| &r_sig[j]));
                    for &(i, v) in &ls[step] {
                        if !sigs.contains(&l_sig[i]) {
                            out.push(&l[i].labels, t, v)?;
                        }
                    }
                }
            }
        }
        Ok(Val::Vector(out.finish()))
    }
}

/// The labels of a matched pair: the "many" side's, without the name for arithmetic (and for
/// `bool`), reduced to the `on` labels (or without the `ignoring` ones) for one-to-one
/// matching, plus the `group_*` labels taken from the "one" side.
fn result_metric(many: &Labels, one: &Labels, b: &Binary, m: &VectorMatching) -> Labels {
    let mut l = many.clone();
    if b.op.drops_name() || b.return_bool {
        l.remove(METRIC_NAME);
    }
    if m.card == Cardinality::OneToOne {
        l = if m.on { l.keep(&m.labels) } else { l.drop(&m.labels) };
    }
    for name in &m.include {
        l.set(name, one.value(name));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_keep_the_left_value_and_arithmetic_computes() {
        assert_eq!(apply(BinOp::Gtr, 3.0, 1.0), (3.0, true));
        assert!(!apply(BinOp::Lss, 3.0, 1.0).1);
        assert!(!apply(BinOp::Eql, f64::NAN, f64::NAN).1);
        assert!(apply(BinOp::Neq, f64::NAN, f64::NAN).1);
        assert_eq!(apply(BinOp::Mod, -7.0, 3.0).0, -1.0, "Go's math.Mod keeps the dividend's sign");
        assert_eq!(apply(BinOp::Pow, f64::NAN, 0.0).0, 1.0, "Go's math.Pow(x, 0) is 1 for any x");
    }
}
