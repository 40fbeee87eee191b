//! Answers in InfluxDB's JSON shape, computed from what the coordinator returned for each
//! series: `{"results": [{"statement_id": 0, "series": [{"name", "tags", "columns",
//! "values"}]}]}`.
//!
//! A SELECT's series are grouped as its `GROUP BY` says (all together without tags, as
//! InfluxDB merges them); in each group, window aggregates of several series are merged window
//! by window (counts and sums add, first and last by time), and raw points are joined into rows
//! by time. Empty windows are filled as `fill()` says.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use timeshard_proto::window::WindowStats;
use timeshard_proto::{Point, SeriesKey};

use super::time::Epoch;
use super::{Agg, Fill, GroupTags, Select, Statement, tags_match};
use crate::names;

/// The name `SHOW DATABASES` reports: a node has one namespace, whatever `db` or `bucket` a
/// client names.
pub const DATABASE: &str = "timeshard";

/// What the coordinator returned for one series of a SELECT.
#[derive(Clone, Debug)]
pub struct SeriesData {
    pub key: SeriesKey,
    /// The field (of the statement's measurement) the series holds.
    pub field: String,
    pub data: Data,
}

/// Window aggregates (for aggregate columns) or raw points.
#[derive(Clone, Debug)]
pub enum Data {
    Windows(Vec<WindowStats>),
    Points(Vec<Point>),
}

/// The statement's entry of `results`.
pub fn statement(id: usize, outcome: Result<Vec<Value>, String>) -> Value {
    match outcome {
        Ok(series) if series.is_empty() => json!({"statement_id": id}),
        Ok(series) => json!({"statement_id": id, "series": series}),
        Err(error) => json!({"statement_id": id, "error": error}),
    }
}

/// Rows a chunk of a chunked answer holds when the client does not say (InfluxDB's default).
pub const DEFAULT_CHUNK_SIZE: usize = 10_000;

/// The statements' entries of `results` as InfluxDB 1.x answers `chunked=true`: one document
/// per line, each `{"results": [one statement's entry]}` holding one series' rows, at most
/// `chunk_size` of them. A series continued in the next document says `"partial": true`, and
/// so does a statement's entry that is continued; errors and statements without series come
/// whole.
pub fn chunked(results: Vec<Value>, chunk_size: usize) -> Vec<Value> {
    let chunk_size = chunk_size.max(1);
    let mut out = Vec::new();
    for mut result in results {
        let series = match result.get_mut("series").map(Value::take) {
            Some(Value::Array(series)) if !series.is_empty() => series,
            _ => {
                out.push(json!({"results": [result]}));
                continue;
            }
        };
        let id = result["statement_id"].clone();
        // Every (series, rows) piece of the statement, in order.
        let mut pieces = Vec::new();
        for mut one in series {
            let values = match one.get_mut("values").map(Value::take) {
                Some(Value::Array(values)) => values,
                _ => Vec::new(),
            };
            let n = values.len().div_ceil(chunk_size).max(1);
            let mut rows = values.into_iter();
            for i in 0..n {
                let mut piece = one.clone();
                let chunk: Vec<Value> = rows.by_ref().take(chunk_size).collect();
                if !chunk.is_empty() {
                    piece["values"] = Value::Array(chunk);
                }
                if i + 1 < n {
                    piece["partial"] = Value::Bool(true);
                }
                pieces.push(piece);
            }
        }
        let last = pieces.len() - 1;
        for (i, piece) in pieces.into_iter().enumerate() {
            let mut entry = json!({"statement_id": id, "series": [piece]});
            if i < last {
                entry["partial"] = Value::Bool(true);
            }
            out.push(json!({"results": [entry]}));
        }
    }
    out
}

fn number(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

/// Merged statistics of one window across series.
#[derive(Clone, Copy, Debug)]
struct Acc {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    first: (i64, f64),
    last: (i64, f64),
}

impl Acc {
    fn of(w: &WindowStats) -> Acc {
        Acc {
            count: w.count,
            sum: w.sum,
            min: w.min,
            max: w.max,
            first: (w.first_ts, w.first),
            last: (w.last_ts, w.last),
        }
    }

    fn absorb(&mut self, o: &Acc) {
        self.count += o.count;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        if o.first.0 < self.first.0 {
            self.first = o.first;
        }
        if o.last.0 > self.last.0 {
            self.last = o.last;
        }
    }

    fn value(&self, agg: Agg) -> Value {
        match agg {
            Agg::Count => Value::from(self.count),
            Agg::Mean => number(self.sum / self.count as f64),
            Agg::Min => number(self.min),
            Agg::Max => number(self.max),
            Agg::Sum => number(self.sum),
            Agg::First => number(self.first.1),
            Agg::Last => number(self.last.1),
        }
    }
}

/// The group a series falls into: the values of the grouping tags.
fn group_of(select: &Select, key: &SeriesKey) -> Vec<(String, String)> {
    match &select.group_tags {
        GroupTags::None => Vec::new(),
        GroupTags::All => names::decoded_tags(key),
        GroupTags::Keys(keys) => {
            let tags = names::decoded_tags(key);
            keys.iter()
                .map(|k| (k.clone(), tags.iter().find(|(t, _)| t == k).map(|(_, v)| v.clone()).unwrap_or_default()))
                .collect()
        }
    }
}

/// The `series` of a SELECT's answer.
pub fn select(select: &Select, data: Vec<SeriesData>, epoch: Epoch) -> Vec<Value> {
    let mut groups: BTreeMap<Vec<(String, String)>, Vec<SeriesData>> = BTreeMap::new();
    for d in data {
        groups.entry(group_of(select, &d.key)).or_default().push(d);
    }
    let mut out = Vec::new();
    for (tags, series) in groups.into_iter().skip(select.soffset).take(select.slimit.unwrap_or(usize::MAX)) {
        let mut rows =
            if select.aggregates() { aggregate_rows(select, &series, epoch) } else { raw_rows(select, &series, epoch) };
        if rows.is_empty() {
            continue;
        }
        if select.descending {
            rows.reverse();
        }
        let rows: Vec<Value> =
            rows.into_iter().skip(select.offset).take(select.limit.unwrap_or(usize::MAX)).map(Value::Array).collect();
        let mut columns = vec![Value::from("time")];
        columns.extend(select.columns.iter().map(|c| Value::from(c.name.clone())));
        let mut s = json!({"name": select.measurement, "columns": columns, "values": rows});
        if select.group_tags != GroupTags::None {
            s["tags"] = tags.into_iter().map(|(k, v)| (k, Value::from(v))).collect::<serde_json::Map<_, _>>().into();
        }
        out.push(s);
    }
    out
}

fn aggregate_rows(select: &Select, series: &[SeriesData], epoch: Epoch) -> Vec<Vec<Value>> {
    let width = select.interval;
    let index = |ts: i64| width.map_or(0, |w| ts.div_euclid(w));
    // Per column: window index -> statistics merged across the group's series.
    let merged: Vec<BTreeMap<i64, Acc>> = select
        .columns
        .iter()
        .map(|c| {
            let mut windows: BTreeMap<i64, Acc> = BTreeMap::new();
            for s in series.iter().filter(|s| s.field == c.field) {
                let Data::Windows(ws) = &s.data else { continue };
                for w in ws.iter().filter(|w| w.count > 0) {
                    let acc = Acc::of(w);
                    windows.entry(index(w.start)).and_modify(|a| a.absorb(&acc)).or_insert(acc);
                }
            }
            windows
        })
        .collect();
    if merged.iter().all(BTreeMap::is_empty) {
        return Vec::new();
    }
    let (first, last) = match width {
        Some(w) => (select.start.div_euclid(w), (select.end - 1).div_euclid(w)),
        None => (0, 0),
    };
    let mut previous: Vec<Value> = vec![Value::Null; select.columns.len()];
    let mut rows = Vec::new();
    for i in first..=last {
        let time = width.map_or(select.start, |w| i * w);
        let mut row = vec![epoch.json(time)];
        let mut any = false;
        for (c, (column, windows)) in select.columns.iter().zip(&merged).enumerate() {
            let agg = column.agg.unwrap_or(Agg::Last);
            let value = match windows.get(&i) {
                Some(acc) => {
                    any = true;
                    acc.value(agg)
                }
                None => match select.fill {
                    Fill::Null | Fill::None if agg == Agg::Count => Value::from(0),
                    Fill::Null | Fill::None => Value::Null,
                    Fill::Value(v) => number(v),
                    Fill::Previous => previous[c].clone(),
                },
            };
            if !value.is_null() {
                previous[c] = value.clone();
            }
            row.push(value);
        }
        if any || select.fill != Fill::None {
            rows.push(row);
        }
    }
    rows
}

fn raw_rows(select: &Select, series: &[SeriesData], epoch: Epoch) -> Vec<Vec<Value>> {
    // Points of one tag set at one time (and event) share a row; other tag sets get their own.
    let tag_sets: BTreeSet<String> = series.iter().map(|s| tags_text(&s.key)).collect();
    let tag_index: BTreeMap<String, usize> = tag_sets.into_iter().enumerate().map(|(i, t)| (t, i)).collect();
    let mut rows: BTreeMap<(i64, usize, u64), Vec<Value>> = BTreeMap::new();
    for (c, column) in select.columns.iter().enumerate() {
        for s in series.iter().filter(|s| s.field == column.field) {
            let Data::Points(points) = &s.data else { continue };
            let t = tag_index[&tags_text(&s.key)];
            for p in points {
                let row = rows.entry((p.ts, t, p.event)).or_insert_with(|| vec![Value::Null; select.columns.len()]);
                row[c] = number(p.value);
            }
        }
    }
    rows.into_iter()
        .map(|((ts, _, _), values)| {
            let mut row = Vec::with_capacity(values.len() + 1);
            row.push(epoch.json(ts));
            row.extend(values);
            row
        })
        .collect()
}

fn tags_text(key: &SeriesKey) -> String {
    key.as_str()[key.metric().len()..].to_string()
}

/// The `series` of a SHOW statement's answer, from the series listed for it.
pub fn show(statement: &Statement, listed: &[SeriesKey]) -> Vec<Value> {
    // A series belongs to the measurement the statement names, or to the one its metric reads
    // as; with the field it holds there.
    let place = |m: &Option<String>, key: &SeriesKey| match m {
        Some(m) => names::field_in(key.metric(), &names::encode_name(m)).map(|f| (m.clone(), f)),
        None => Some(names::measurement_and_field(key.metric())),
    };
    // measurement -> what the statement collects for it.
    let mut per: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    let columns: &[&str] = match statement {
        Statement::ShowDatabases => {
            return vec![json!({"name": "databases", "columns": ["name"], "values": [[DATABASE]]})];
        }
        Statement::ShowRetentionPolicies => {
            return vec![json!({"columns": ["name", "duration", "shardGroupDuration", "replicaN", "default"],
                "values": [["autogen", "0s", "168h0m0s", 1, true]]})];
        }
        Statement::Select(_) | Statement::Create => return Vec::new(),
        Statement::ShowMeasurements { limit, offset } => {
            let names: BTreeSet<String> = listed.iter().map(|k| names::measurement_and_field(k.metric()).0).collect();
            let values: Vec<Value> =
                names.into_iter().skip(*offset).take(limit.unwrap_or(usize::MAX)).map(|n| json!([n])).collect();
            if values.is_empty() {
                return Vec::new();
            }
            return vec![json!({"name": "measurements", "columns": ["name"], "values": values})];
        }
        Statement::ShowTagKeys { measurement } => {
            for key in listed {
                if let Some((m, _)) = place(measurement, key) {
                    per.entry(m).or_default().extend(names::decoded_tags(key).into_iter().map(|(k, _)| vec![k]));
                }
            }
            &["tagKey"]
        }
        Statement::ShowFieldKeys { measurement } => {
            for key in listed {
                if let Some((m, field)) = place(measurement, key) {
                    per.entry(m).or_default().insert(vec![field, "float".into()]);
                }
            }
            &["fieldKey", "fieldType"]
        }
        Statement::ShowTagValues { measurement, keys, tags } => {
            for key in listed.iter().filter(|k| tags_match(k, tags)) {
                if let Some((m, _)) = place(measurement, key) {
                    let rows =
                        names::decoded_tags(key).into_iter().filter(|(k, _)| keys.contains(k)).map(|(k, v)| vec![k, v]);
                    per.entry(m).or_default().extend(rows);
                }
            }
            &["key", "value"]
        }
    };
    per.into_iter()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(name, rows)| json!({"name": name, "columns": columns, "values": rows.into_iter().collect::<Vec<_>>()}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::influxql::parse;

    /// A whole minute: windows align to the epoch.
    const T: i64 = 1_699_999_980_000_000_000;
    const MIN: i64 = 60_000_000_000;

    fn parse_select(q: &str) -> Select {
        match parse(q, T + 10 * MIN).unwrap().remove(0) {
            Statement::Select(s) => s,
            other => panic!("{other:?}"),
        }
    }

    fn window(start: i64, values: &[(i64, f64)]) -> WindowStats {
        let vs: Vec<f64> = values.iter().map(|v| v.1).collect();
        WindowStats {
            start,
            end: start + MIN,
            count: values.len() as u64,
            min: vs.iter().copied().fold(f64::INFINITY, f64::min),
            max: vs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            sum: vs.iter().sum(),
            first: values[0].1,
            first_ts: values[0].0,
            last: values[values.len() - 1].1,
            last_ts: values[values.len() - 1].0,
            digest: 0,
        }
    }

    fn key(s: &str) -> SeriesKey {
        s.parse().unwrap()
    }

    #[test]
    fn windows_of_several_series_merge_and_empty_ones_fill() {
        let s = parse_select(&format!(
            "SELECT mean(v), count(v), first(v), last(v) FROM cpu WHERE time >= {T} AND time < {} GROUP BY time(1m)",
            T + 3 * MIN
        ));
        let a = SeriesData {
            key: key("cpu.v{host=a}"),
            field: "v".into(),
            data: Data::Windows(vec![window(T, &[(T + 5, 1.0), (T + 7, 3.0)])]),
        };
        let b = SeriesData {
            key: key("cpu.v{host=b}"),
            field: "v".into(),
            data: Data::Windows(vec![window(T, &[(T + 1, 8.0)]), window(T + 2 * MIN, &[(T + 2 * MIN, 5.0)])]),
        };
        let out = select(&s, vec![a.clone(), b.clone()], Epoch::Unit(1_000_000_000));
        assert_eq!(
            out,
            vec![json!({"name": "cpu", "columns": ["time", "mean", "count", "first", "last"], "values": [
                [1_699_999_980, 4.0, 3, 8.0, 3.0],
                [1_700_000_040, null, 0, null, null],
                [1_700_000_100, 5.0, 1, 5.0, 5.0],
            ]})]
        );

        let mut s2 = s.clone();
        s2.fill = Fill::None;
        s2.group_tags = GroupTags::Keys(vec!["host".into()]);
        s2.descending = true;
        let out = select(&s2, vec![a, b], Epoch::Rfc3339);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["tags"], json!({"host": "a"}));
        assert_eq!(
            out[1]["values"],
            json!([["2023-11-14T22:15:00Z", 5.0, 1, 5.0, 5.0], ["2023-11-14T22:13:00Z", 8.0, 1, 8.0, 8.0],])
        );
    }

    #[test]
    fn fill_previous_and_value() {
        let mut s = parse_select(&format!(
            "SELECT max(v) FROM m WHERE time >= {T} AND time < {} GROUP BY time(1m)",
            T + 3 * MIN
        ));
        let d = SeriesData { key: key("m.v"), field: "v".into(), data: Data::Windows(vec![window(T, &[(T, 2.0)])]) };
        s.fill = Fill::Previous;
        assert_eq!(
            select(&s, vec![d.clone()], Epoch::Unit(MIN))[0]["values"],
            json!([[28333333, 2.0], [28333334, 2.0], [28333335, 2.0]])
        );
        s.fill = Fill::Value(-1.0);
        s.limit = Some(2);
        s.offset = 1;
        assert_eq!(select(&s, vec![d], Epoch::Unit(MIN))[0]["values"], json!([[28333334, -1.0], [28333335, -1.0]]));
    }

    #[test]
    fn raw_points_join_into_rows() {
        let s = parse_select("SELECT a, b FROM m WHERE host = 'x'");
        let data = vec![
            SeriesData {
                key: key("m.a{host=x}"),
                field: "a".into(),
                data: Data::Points(vec![Point::new(1, 1.0), Point::new(2, 2.0)]),
            },
            SeriesData { key: key("m.b{host=x}"), field: "b".into(), data: Data::Points(vec![Point::new(2, 20.0)]) },
        ];
        let out = select(&s, data, Epoch::Unit(1));
        assert_eq!(out[0]["values"], json!([[1, 1.0, null], [2, 2.0, 20.0]]));
        assert!(out[0].get("tags").is_none());
        // No data: no series, and the statement's entry has none.
        assert_eq!(select(&s, vec![], Epoch::Unit(1)), Vec::<Value>::new());
        assert_eq!(statement(0, Ok(vec![])), json!({"statement_id": 0}));
        assert_eq!(statement(1, Err("bad".into())), json!({"statement_id": 1, "error": "bad"}));
    }

    #[test]
    fn show_answers_come_from_the_series_list() {
        let listed =
            [key("cpu.idle{host=a}"), key("cpu.user{host=b,dc=eu}"), key("pmu.phase{bus=7}"), key("up{job=x}")];
        let q = |text: &str| show(&parse(text, T).unwrap()[0], &listed);
        assert_eq!(
            q("SHOW MEASUREMENTS"),
            vec![json!({"name": "measurements", "columns": ["name"], "values": [["cpu"], ["pmu"], ["up"]]})]
        );
        assert_eq!(q("SHOW TAG KEYS FROM cpu")[0]["values"], json!([["dc"], ["host"]]));
        assert_eq!(q("SHOW FIELD KEYS")[0]["values"], json!([["idle", "float"], ["user", "float"]]));
        assert_eq!(
            q("SHOW TAG VALUES WITH KEY = host WHERE dc = 'eu'"),
            vec![json!({"name": "cpu", "columns": ["key", "value"], "values": [["host", "b"]]})]
        );
        assert_eq!(q("SHOW DATABASES")[0]["values"], json!([["timeshard"]]));
        assert_eq!(q("SHOW MEASUREMENTS LIMIT 1 OFFSET 2")[0]["values"], json!([["up"]]));
        // Named in FROM, a measurement holds the metric itself (field value) and its fields.
        let listed = [key("pmu.phase{bus=7}"), key("pmu.phase.ok{bus=7}"), key("pmu.phasex{bus=8}")];
        let q = |text: &str| show(&parse(text, T).unwrap()[0], &listed);
        assert_eq!(
            q("SHOW FIELD KEYS FROM \"pmu.phase\""),
            vec![
                json!({"name": "pmu.phase", "columns": ["fieldKey", "fieldType"], "values": [["ok", "float"], ["value", "float"]]})
            ]
        );
        assert_eq!(q("SHOW TAG VALUES FROM \"pmu.phase\" WITH KEY = bus")[0]["values"], json!([["bus", "7"]]));
    }

    #[test]
    fn chunked_answers_split_each_series_rows_and_mark_what_continues() {
        let rows = |from: i64, n: i64| (from..from + n).map(|t| json!([t, t as f64])).collect::<Vec<_>>();
        let results = vec![
            json!({"statement_id": 0, "series": [
                {"name": "m", "tags": {"a": "1"}, "columns": ["time", "v"], "values": rows(0, 5)},
                {"name": "m", "tags": {"a": "2"}, "columns": ["time", "v"], "values": rows(10, 2)},
            ]}),
            json!({"statement_id": 1, "error": "no"}),
            json!({"statement_id": 2}),
        ];
        let docs = chunked(results, 2);
        let entries: Vec<&Value> = docs.iter().map(|d| &d["results"][0]).collect();
        assert_eq!(docs.len(), 6, "{docs:?}");
        // Series a=1 in chunks of 2, 2, 1; a=2 whole; the statement continues until its last.
        let sizes: Vec<usize> =
            entries[..4].iter().map(|e| e["series"][0]["values"].as_array().unwrap().len()).collect();
        assert_eq!(sizes, [2, 2, 1, 2]);
        let series_partial: Vec<bool> = entries[..4].iter().map(|e| e["series"][0]["partial"] == true).collect();
        assert_eq!(series_partial, [true, true, false, false]);
        let statement_partial: Vec<bool> = entries[..4].iter().map(|e| e["partial"] == true).collect();
        assert_eq!(statement_partial, [true, true, true, false]);
        assert!(entries[..4].iter().all(|e| e["statement_id"] == 0));
        assert_eq!(entries[2]["series"][0]["values"], json!([[4, 4.0]]));
        assert_eq!(entries[3]["series"][0]["tags"], json!({"a": "2"}));
        assert_eq!(*entries[4], json!({"statement_id": 1, "error": "no"}));
        assert_eq!(*entries[5], json!({"statement_id": 2}));
        // Joined again, the rows are the statement's.
        let joined: Vec<Value> =
            entries[..3].iter().flat_map(|e| e["series"][0]["values"].as_array().unwrap().clone()).collect();
        assert_eq!(joined, rows(0, 5));
    }
}
