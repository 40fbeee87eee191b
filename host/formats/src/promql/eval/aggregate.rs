//! Aggregations: `sum`, `avg`, `min`, `max`, `count`, `topk`, `bottomk` and `quantile`, by or
//! without labels, step by step, with Prometheus' arithmetic (running mean for `avg`, NaN
//! replaced by any number in `min`/`max`, NaN last in `topk`/`bottomk`).

use std::collections::HashMap;

use super::{Collector, EvalError, Evaluator, Val, by_step};
use crate::promql::ast::{AggOp, Aggregate};
use crate::promql::labels::{Labels, METRIC_NAME};
use crate::promql::window::quantile;

/// One group's running state at one step.
#[derive(Clone)]
struct Group {
    value: f64,
    mean: f64,
    count: usize,
    /// `(series, value)` for topk, bottomk and quantile.
    members: Vec<(usize, f64)>,
}

impl Evaluator<'_> {
    pub(super) fn aggregate(&mut self, a: &Aggregate) -> Result<Val, EvalError> {
        let param = match &a.param {
            Some(p) => Some(self.scalar_arg(p)?),
            None => None,
        };
        let series = self.vector_arg(&a.expr)?;
        // Each input series' group and the group's labels, computed once.
        let mut group_index: HashMap<Labels, usize> = HashMap::new();
        let mut group_labels: Vec<Labels> = Vec::new();
        let group_of: Vec<usize> = series
            .iter()
            .map(|s| {
                let key = if a.without {
                    let mut drop = a.grouping.clone();
                    drop.push(METRIC_NAME.to_string());
                    s.labels.drop(&drop)
                } else {
                    s.labels.keep(&a.grouping)
                };
                let next = group_labels.len();
                *group_index.entry(key).or_insert_with_key(|k| {
                    group_labels.push(k.clone());
                    next
                })
            })
            .collect();
        let mut out = Collector::default();
        let mut state: Vec<Option<Group>> = vec![None; group_labels.len()];
        let mut order: Vec<usize> = Vec::new();
        for (step, samples) in by_step(self, &series).into_iter().enumerate() {
            self.check_stop()?;
            let t = self.range.at(step);
            let p = param.as_ref().map_or(f64::NAN, |p| p[step]);
            let k = match a.op {
                AggOp::Topk | AggOp::Bottomk => {
                    if !(p >= i64::MIN as f64 && p <= i64::MAX as f64) {
                        return Err(EvalError::Execution(format!("Scalar value {p} overflows int64")));
                    }
                    let k = p as i64;
                    if k < 1 {
                        continue;
                    }
                    k as usize
                }
                _ => 0,
            };
            for (i, v) in samples {
                let g = group_of[i];
                match &mut state[g] {
                    slot @ None => {
                        order.push(g);
                        *slot = Some(Group { value: v, mean: v, count: 1, members: vec![(i, v)] });
                    }
                    Some(st) => add(a.op, st, i, v),
                }
            }
            for &g in &order {
                let Some(st) = state[g].take() else { continue };
                match a.op {
                    AggOp::Topk | AggOp::Bottomk => {
                        for (i, v) in select_k(st.members, k, a.op == AggOp::Topk) {
                            out.push(&series[i].labels, t, v)?;
                        }
                    }
                    _ => {
                        let v = match a.op {
                            AggOp::Avg => st.mean,
                            AggOp::Count => st.count as f64,
                            AggOp::Quantile => {
                                let mut values: Vec<f64> = st.members.iter().map(|m| m.1).collect();
                                quantile(p, &mut values)
                            }
                            _ => st.value,
                        };
                        out.push(&group_labels[g], t, v)?;
                    }
                }
            }
            order.clear();
        }
        Ok(Val::Vector(out.finish()))
    }
}

fn add(op: AggOp, st: &mut Group, i: usize, v: f64) {
    match op {
        AggOp::Sum => st.value += v,
        AggOp::Avg => {
            st.count += 1;
            if st.mean.is_infinite() {
                if v.is_infinite() && (st.mean > 0.0) == (v > 0.0) {
                    return;
                }
                if !v.is_infinite() && !v.is_nan() {
                    return;
                }
            }
            let n = st.count as f64;
            st.mean += v / n - st.mean / n;
        }
        AggOp::Min => {
            if st.value > v || st.value.is_nan() {
                st.value = v;
            }
        }
        AggOp::Max => {
            if st.value < v || st.value.is_nan() {
                st.value = v;
            }
        }
        AggOp::Count => st.count += 1,
        AggOp::Topk | AggOp::Bottomk | AggOp::Quantile => st.members.push((i, v)),
    }
}

/// The `k` largest (or smallest) members, in that order; NaN counts as the least wanted.
/// Among equal values the earlier series wins, as with Prometheus' heap on sorted input.
fn select_k(mut members: Vec<(usize, f64)>, k: usize, top: bool) -> Vec<(usize, f64)> {
    let rank = |v: f64| {
        if v.is_nan() {
            f64::NEG_INFINITY
        } else if top {
            v
        } else {
            -v
        }
    };
    members.sort_by(|a, b| {
        let (ra, rb) = (rank(a.1), rank(b.1));
        rb.partial_cmp(&ra)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(b.1.is_nan().cmp(&a.1.is_nan()).reverse())
            .then(a.0.cmp(&b.0))
    });
    members.truncate(k);
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_k_orders_and_puts_nan_last() {
        let m = vec![(0, 1.0), (1, f64::NAN), (2, 3.0), (3, 2.0), (4, 3.0)];
        let top: Vec<usize> = select_k(m.clone(), 3, true).into_iter().map(|x| x.0).collect();
        assert_eq!(top, vec![2, 4, 3]);
        let bottom: Vec<usize> = select_k(m.clone(), 2, false).into_iter().map(|x| x.0).collect();
        assert_eq!(bottom, vec![0, 3]);
        let all: Vec<usize> = select_k(m, 9, false).into_iter().map(|x| x.0).collect();
        assert_eq!(all, vec![0, 3, 2, 4, 1]);
    }
}
