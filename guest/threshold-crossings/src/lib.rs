//! The points where a series crosses a threshold, found where the data lives.
//!
//! A point is "above" when its value is at least `threshold`. A crossing is a point whose side
//! differs from the previous point's; the result lists each crossing point with its `event`
//! field replaced by the direction: 1 upward, 2 downward. Values `crossings`, `up` and `down`
//! count them.
//!
//! `summarize` returns `numbers = [count]` and `points = [first, crossings inside..., last]`, so that
//! `merge` can also find the crossings that fall between two quanta (the last point of one and
//! the first of the next). Non-finite values are skipped.
//!
//! Parameters: `threshold` (required).

#![no_std]
extern crate alloc;

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "query-policy", path: "../../wit" });
policy_guest::guest_runtime!();

use exports::timeshard::policy::query::Guest;
use policy_guest::Row;
use timeshard::policy::types::{
    NamedValue, Partial, Points, QueryResult, Series, Setting, TimeRange,
};

const UP: u64 = 1;
const DOWN: u64 = 2;

fn threshold(params: &[Setting]) -> Result<f64, String> {
    let value = policy_guest::find(params.iter().map(|s| (&*s.name, &*s.value)), "threshold");
    policy_guest::number("threshold", value, None).map_err(|e| e.to_string())
}

fn crossing(prev: &Row, next: &Row, threshold: f64) -> Option<Row> {
    let (was, is) = (prev.value >= threshold, next.value >= threshold);
    (was != is).then_some(Row {
        event: if is { UP } else { DOWN },
        ..*next
    })
}

fn to_points(rows: &[Row]) -> Points {
    let (ts, value, event) = policy_guest::columns(rows);
    Points { ts, value, event }
}

struct Crossings;

impl Guest for Crossings {
    fn summarize(
        _: Series,
        range: TimeRange,
        params: Vec<Setting>,
        points: Points,
    ) -> Result<Partial, String> {
        let threshold = threshold(&params)?;
        let rows = policy_guest::rows(&points.ts, &points.value, &points.event);
        let mut finite = rows.iter().filter(|p| p.value.is_finite());
        let Some(first) = finite.next() else {
            return Ok(Partial {
                range,
                numbers: vec![0.0],
                points: to_points(&[]),
            });
        };
        let mut out = vec![*first];
        let (mut prev, mut count) = (first, 1u64);
        for p in finite {
            out.extend(crossing(prev, p, threshold));
            prev = p;
            count += 1;
        }
        out.push(*prev);
        Ok(Partial {
            range,
            numbers: vec![count as f64],
            points: to_points(&out),
        })
    }

    fn merge(params: Vec<Setting>, partials: Vec<Partial>) -> Result<QueryResult, String> {
        let threshold = threshold(&params)?;
        let mut found: Vec<Row> = Vec::new();
        let mut last: Option<Row> = None;
        for (i, p) in partials.iter().enumerate() {
            let rows = policy_guest::rows(&p.points.ts, &p.points.value, &p.points.event);
            if rows.is_empty() {
                continue;
            }
            if rows.len() < 2 {
                return Err(alloc::format!(
                    "partial {i} has 1 point; a non-empty partial has its first and last points"
                ));
            }
            let (first, rest) = (&rows[0], &rows[1..]);
            let (end, inside) = rest.split_last().expect("at least two points");
            if let Some(prev) = &last {
                found.extend(crossing(prev, first, threshold));
            }
            found.extend_from_slice(inside);
            last = Some(*end);
        }
        let up = found.iter().filter(|p| p.event == UP).count() as f64;
        let values = vec![
            NamedValue { name: "crossings".into(), value: found.len() as f64 },
            NamedValue { name: "up".into(), value: up },
            NamedValue { name: "down".into(), value: found.len() as f64 - up },
        ];
        Ok(QueryResult {
            values,
            points: to_points(&found),
        })
    }
}

export!(Crossings);
