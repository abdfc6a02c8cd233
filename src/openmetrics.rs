//! The OpenMetrics text format (1.0.0) of `/metrics`, with exemplars, and the choice between
//! it and the 0.0.4 text format by a scraper's `Accept` header (DESIGN §6). The `prometheus`
//! crate writes the 0.0.4 format only, and its data model has no exemplars: this writes the
//! families it gathers, asking the caller for each series' exemplar. Pure.

use prometheus::proto::{Metric, MetricFamily, MetricType};
use std::fmt::Write;

/// The 0.0.4 text format's content type: what a scraper that does not ask for OpenMetrics
/// gets.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A format `/metrics` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4: no exemplars.
    Text,
    /// OpenMetrics text, in the version the scraper asked for (`1.0.0` or `0.0.1`, which
    /// are written alike).
    OpenMetrics(&'static str),
}

impl Format {
    /// The `Content-Type` of a body in this format.
    pub fn content_type(self) -> String {
        match self {
            Format::Text => TEXT.to_owned(),
            Format::OpenMetrics(version) => {
                format!("application/openmetrics-text; version={version}; charset=utf-8")
            }
        }
    }
}

/// The format to answer a request with `accept` (its `Accept` header), as the Prometheus
/// clients choose: the media ranges by falling quality (`q`, 1 when absent; 0 is "not
/// acceptable"), the first one this writes wins — OpenMetrics text of version `1.0.0` or
/// `0.0.1` (or none given), or `text/plain` of version `0.0.4` (or none given). Anything
/// else, wildcards and no header included, gets the text format.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Text;
    };
    let mut ranges: Vec<(f32, Format)> = accept
        .split(',')
        .filter_map(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next()?.to_ascii_lowercase();
            let (mut version, mut q) = (None, 1.0_f32);
            for param in parts {
                let Some((name, value)) = param.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match name.trim().to_ascii_lowercase().as_str() {
                    "version" => version = Some(value),
                    "q" => {
                        q = value
                            .parse()
                            .ok()
                            .filter(|q: &f32| (0.0..=1.0).contains(q))?
                    }
                    _ => {}
                }
            }
            let format = match (media.as_str(), version) {
                ("application/openmetrics-text", None | Some("1.0.0")) => {
                    Format::OpenMetrics("1.0.0")
                }
                ("application/openmetrics-text", Some("0.0.1")) => Format::OpenMetrics("0.0.1"),
                ("text/plain", None | Some("0.0.4")) => Format::Text,
                _ => return None,
            };
            (q > 0.0).then_some((q, format))
        })
        .collect();
    // Stable: of equal quality, the one listed first.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranges.first().map_or(Format::Text, |&(_, format)| format)
}

/// The attempt a series last counted, shown beside its sample: which trace to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exemplar {
    /// The span's trace id.
    pub trace_id: [u8; 16],
    /// The span's id.
    pub span_id: [u8; 8],
    /// When the attempt ended, Unix nanoseconds.
    pub at: u64,
}

/// The suffix OpenMetrics gives a counter's samples (and not its family).
const TOTAL: &str = "_total";

/// Writes `families` in the OpenMetrics text format, each sample followed by the exemplar
/// `exemplar` gives for it (counters only: an exemplar counts 1, the one attempt), and the
/// closing `# EOF`. A counter whose name does not end in `_total` is written as `unknown`
/// under its own name, so that no series is named differently in the two formats.
pub fn encode(
    families: &[MetricFamily],
    exemplar: &dyn Fn(&MetricFamily, &Metric) -> Option<Exemplar>,
) -> String {
    let mut out = String::with_capacity(families.len() * 256);
    for family in families {
        let name = family.name();
        let (meta, kind) = match family.get_field_type() {
            MetricType::COUNTER => match name.strip_suffix(TOTAL) {
                Some(meta) => (meta, "counter"),
                None => (name, "unknown"),
            },
            MetricType::GAUGE => (name, "gauge"),
            MetricType::HISTOGRAM => (name, "histogram"),
            MetricType::SUMMARY => (name, "summary"),
            // The `prometheus` crate's registry makes no untyped metric (its model deprecates
            // the type), and OpenMetrics has none.
            MetricType::UNTYPED => continue,
        };
        out.push_str("# HELP ");
        out.push_str(meta);
        out.push(' ');
        escape(&mut out, family.help());
        out.push('\n');
        let _ = writeln!(out, "# TYPE {meta} {kind}");
        for m in family.get_metric() {
            match family.get_field_type() {
                MetricType::COUNTER => {
                    let value = m.get_counter().get_value();
                    sample(&mut out, name, m, None, value);
                    if kind == "counter" {
                        if let Some(e) = exemplar(family, m) {
                            write_exemplar(&mut out, &e);
                        }
                    }
                    out.push('\n');
                }
                MetricType::GAUGE => line(&mut out, name, m, None, m.get_gauge().get_value()),
                MetricType::UNTYPED => {}
                MetricType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let bucket = format!("{name}_bucket");
                    for b in h.get_bucket() {
                        let le = number(b.upper_bound());
                        let count = b.cumulative_count() as f64;
                        line(&mut out, &bucket, m, Some(("le", &le)), count);
                    }
                    if h.get_bucket()
                        .last()
                        .is_none_or(|b| b.upper_bound() != f64::INFINITY)
                    {
                        let count = h.get_sample_count() as f64;
                        line(&mut out, &bucket, m, Some(("le", "+Inf")), count);
                    }
                    line(
                        &mut out,
                        &format!("{name}_sum"),
                        m,
                        None,
                        h.get_sample_sum(),
                    );
                    let count = h.get_sample_count() as f64;
                    line(&mut out, &format!("{name}_count"), m, None, count);
                }
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        let at = number(q.quantile());
                        line(&mut out, name, m, Some(("quantile", &at)), q.value());
                    }
                    line(&mut out, &format!("{name}_sum"), m, None, s.sample_sum());
                    let count = s.sample_count() as f64;
                    line(&mut out, &format!("{name}_count"), m, None, count);
                }
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// One sample and its line's end.
fn line(out: &mut String, name: &str, m: &Metric, extra: Option<(&str, &str)>, value: f64) {
    sample(out, name, m, extra, value);
    out.push('\n');
}

/// `name{labels} value`, the series' labels in their order and `extra` last.
fn sample(out: &mut String, name: &str, m: &Metric, extra: Option<(&str, &str)>, value: f64) {
    out.push_str(name);
    let labels = m.get_label();
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        let pairs = labels.iter().map(|l| (l.name(), l.value())).chain(extra);
        for (i, (label, value)) in pairs.enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape(out, value);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    push_number(out, value);
}

/// ` # {trace_id="…",span_id="…"} 1 <seconds>`: the ids in lowercase hex, as OTLP's JSON and
/// Tempo write them, and the time to the millisecond.
fn write_exemplar(out: &mut String, e: &Exemplar) {
    out.push_str(" # {trace_id=\"");
    hex(out, &e.trace_id);
    out.push_str("\",span_id=\"");
    hex(out, &e.span_id);
    let _ = write!(
        out,
        "\"}} 1 {}.{:03}",
        e.at / 1_000_000_000,
        e.at % 1_000_000_000 / 1_000_000
    );
}

fn hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

/// A value as OpenMetrics writes numbers: `+Inf`, `-Inf`, `NaN`, else the shortest decimal
/// that reads back as the same `f64`.
fn number(v: f64) -> String {
    let mut out = String::new();
    push_number(&mut out, v);
    out
}

/// [`number`], written at the end of `out`.
fn push_number(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Escapes a label value or help text: backslash, double quote and line feed.
fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{CounterVec, Gauge, Histogram, HistogramOpts, IntCounter, Opts, Registry};

    #[test]
    fn the_format_is_the_first_of_the_highest_quality_that_is_written() {
        let om = Format::OpenMetrics("1.0.0");
        // What Prometheus 2.42 sends: no space after the `;`.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, format) in [
            (Some(prometheus), om),
            (None, Format::Text),
            (Some(""), Format::Text),
            (Some("*/*"), Format::Text),
            (Some("application/json"), Format::Text),
            (Some("text/plain"), Format::Text),
            (Some("text/plain; version=0.0.4"), Format::Text),
            (Some("application/openmetrics-text"), om),
            (Some("Application/OpenMetrics-Text; Version=\"1.0.0\""), om),
            (
                Some("application/openmetrics-text; version=0.0.1"),
                Format::OpenMetrics("0.0.1"),
            ),
            (
                Some("application/openmetrics-text;version=2.0.0"),
                Format::Text,
            ),
            (
                Some("text/plain;version=0.0.5,application/openmetrics-text;q=0.1"),
                om,
            ),
            (
                Some("application/openmetrics-text;q=0.5,text/plain;q=0.9"),
                Format::Text,
            ),
            (
                Some("text/plain;q=0.5,application/openmetrics-text;q=0.9"),
                om,
            ),
            (
                Some("text/plain,application/openmetrics-text"),
                Format::Text,
            ),
            (Some("application/openmetrics-text,text/plain"), om),
            (Some("application/openmetrics-text;q=0"), Format::Text),
            (
                Some("application/openmetrics-text;q=2,text/plain;q=0.1"),
                Format::Text,
            ),
            (Some("application/openmetrics-text;q=x"), Format::Text),
            (Some("application/openmetrics-text;charset"), om),
        ] {
            assert_eq!(negotiate(accept), format, "Accept: {accept:?}");
        }
        assert_eq!(
            om.content_type(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(Format::Text.content_type(), TEXT);
    }

    #[test]
    fn families_are_written_as_openmetrics_with_exemplars_on_counters() {
        let r = Registry::new();
        let refusals = CounterVec::new(
            Opts::new("rg_refusals_total", "Refusals, \"quoted\" \\ and\nsplit."),
            &["client", "violation"],
        )
        .expect("valid");
        r.register(Box::new(refusals.clone())).expect("once");
        refusals.with_label_values(&["a\"b\\c\nd", "x"]).inc_by(3.0);
        refusals.with_label_values(&["b", "y"]).inc();
        let plain = IntCounter::new("rg_plain", "A counter not named _total.").expect("valid");
        r.register(Box::new(plain.clone())).expect("once");
        plain.inc();
        let gauge = Gauge::new("rg_gauge", "A gauge.").expect("valid");
        r.register(Box::new(gauge.clone())).expect("once");
        gauge.set(f64::NEG_INFINITY);
        let hist = Histogram::with_opts(
            HistogramOpts::new("rg_seconds", "A histogram.").buckets(vec![0.5, 1.0]),
        )
        .expect("valid");
        r.register(Box::new(hist.clone())).expect("once");
        hist.observe(0.25);
        hist.observe(2.0);
        let text = encode(&r.gather(), &|family, metric| {
            let y = metric.get_label().iter().any(|l| l.value() == "y");
            (family.name() == "rg_refusals_total" && y).then_some(Exemplar {
                trace_id: [0xab; 16],
                span_id: [0x01; 8],
                at: 1_700_000_000_123_456_789,
            })
        });
        assert_eq!(
            text,
            "# HELP rg_gauge A gauge.\n\
             # TYPE rg_gauge gauge\n\
             rg_gauge -Inf\n\
             # HELP rg_plain A counter not named _total.\n\
             # TYPE rg_plain unknown\n\
             rg_plain 1\n\
             # HELP rg_refusals Refusals, \\\"quoted\\\" \\\\ and\\nsplit.\n\
             # TYPE rg_refusals counter\n\
             rg_refusals_total{client=\"a\\\"b\\\\c\\nd\",violation=\"x\"} 3\n\
             rg_refusals_total{client=\"b\",violation=\"y\"} 1 # {trace_id=\"abababababababababababababababab\",span_id=\"0101010101010101\"} 1 1700000000.123\n\
             # HELP rg_seconds A histogram.\n\
             # TYPE rg_seconds histogram\n\
             rg_seconds_bucket{le=\"0.5\"} 1\n\
             rg_seconds_bucket{le=\"1\"} 1\n\
             rg_seconds_bucket{le=\"+Inf\"} 2\n\
             rg_seconds_sum 2.25\n\
             rg_seconds_count 2\n\
             # EOF\n"
        );
    }

    #[test]
    fn numbers_are_written_as_openmetrics_reads_them() {
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(0.1), "0.1");
        assert_eq!(number(-3.0), "-3");
        assert_eq!(number(1e21), "1000000000000000000000");
    }
}
