//! The Prometheus text exposition format (version 0.0.4), written by hand: what `/metrics`
//! answers. One call per metric family writes its `# HELP`, `# TYPE` and samples, so adding a
//! metric is one line at the caller.
//!
//! Names follow Prometheus' rules (`timeshard_<subsystem>_<what>_<unit>`, base units, `_total`
//! on counters); they are checked in debug builds.

use std::fmt::Write;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label pairs of one sample.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// The buckets of a histogram at one moment: cumulative counts per upper bound (`le`), the sum
/// of the observations and their count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound, observations at or below it), bounds increasing; `+Inf` is added.
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// A text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(kind != "counter" || name.ends_with("_total"), "counter {name:?} must end in _total");
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: Labels<'_>, extra: Option<(&str, &str)>, value: &str) {
        self.out.push_str(name);
        let mut all = labels.iter().copied().chain(extra).peekable();
        if all.peek().is_some() {
            self.out.push('{');
            for (i, (k, v)) in all.enumerate() {
                debug_assert!(valid_name(k) && !k.starts_with("__"), "label name {k:?}");
                if i > 0 {
                    self.out.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, value: f64) {
        self.counters(name, help, [(&[][..], value)]);
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.gauges(name, help, [(&[][..], value)]);
    }

    /// A counter family, one sample per label set.
    pub fn counters<'a>(&mut self, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels<'a>, f64)>) {
        self.family(name, help, "counter", samples);
    }

    /// A gauge family, one sample per label set.
    pub fn gauges<'a>(&mut self, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels<'a>, f64)>) {
        self.family(name, help, "gauge", samples);
    }

    fn family<'a>(&mut self, name: &str, help: &str, kind: &str, samples: impl IntoIterator<Item = (Labels<'a>, f64)>) {
        self.header(name, help, kind);
        for (labels, value) in samples {
            self.sample(name, labels, None, &number(value));
        }
    }

    /// A histogram family (`name` ends in its unit, e.g. `_seconds`), one per label set.
    pub fn histograms<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels<'a>, HistogramSnapshot)>,
    ) {
        self.header(name, help, "histogram");
        let (bucket, sum, count) = (format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count"));
        for (labels, h) in samples {
            for (le, n) in &h.buckets {
                self.sample(&bucket, labels, Some(("le", &number(*le))), &n.to_string());
            }
            self.sample(&bucket, labels, Some(("le", "+Inf")), &h.count.to_string());
            self.sample(&sum, labels, None, &number(h.sum));
            self.sample(&count, labels, None, &h.count.to_string());
        }
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_written_in_the_text_format() {
        let mut e = Exposition::new();
        e.counter("timeshard_x_total", "Things.\nMore", 3.0);
        e.gauges("timeshard_y_bytes", "Size", [(&[("path", "a\"b\\c")][..], 1.5), (&[("path", "d")][..], f64::NAN)]);
        let h = HistogramSnapshot { buckets: vec![(0.1, 1), (1.0, 2)], sum: 1.25, count: 3 };
        e.histograms("timeshard_z_seconds", "Time", [(&[("kind", "read")][..], h)]);
        let text = e.finish();
        let want = "\
# HELP timeshard_x_total Things.\\nMore
# TYPE timeshard_x_total counter
timeshard_x_total 3
# HELP timeshard_y_bytes Size
# TYPE timeshard_y_bytes gauge
timeshard_y_bytes{path=\"a\\\"b\\\\c\"} 1.5
timeshard_y_bytes{path=\"d\"} NaN
# HELP timeshard_z_seconds Time
# TYPE timeshard_z_seconds histogram
timeshard_z_seconds_bucket{kind=\"read\",le=\"0.1\"} 1
timeshard_z_seconds_bucket{kind=\"read\",le=\"1\"} 2
timeshard_z_seconds_bucket{kind=\"read\",le=\"+Inf\"} 3
timeshard_z_seconds_sum{kind=\"read\"} 1.25
timeshard_z_seconds_count{kind=\"read\"} 3
";
        assert_eq!(text, want);
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("timeshard_a:b_total"));
        assert!(!valid_name("9lives"));
        assert!(!valid_name("a-b"));
        assert!(!valid_name(""));
    }
}
