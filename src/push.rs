//! The OTLP metrics exporter (`exporters.otlp_metrics`): every `interval`, the families of
//! `/metrics` pushed as one `ExportMetricsServiceRequest` over OTLP/gRPC or OTLP/HTTP, for a
//! backend that does not scrape (a Collector, Mimir, a vendor). Counters go as monotonic
//! cumulative sums, gauges as gauges, histograms as explicit-bucket histograms, labels as
//! attributes, the same exemplars as OpenMetrics' on their points; the resource says
//! `service.name = refusal-gate` and a `service.instance.id` of its own.
//!
//! The requests are built here from the `opentelemetry-proto` types, not through the
//! `opentelemetry` SDK's meter provider: the SDK would need every series registered again as
//! an observable instrument, has no observable histogram, and attaches no exemplar to an
//! observed value. A failed push is retried with backoff until the next one is due, which
//! carries the cumulative counts whole; it runs on its own task and never blocks ingest.
//!
//! [`request`] is pure; [`Pusher`] is the edge.

use crate::config::{ExportProtocol, OtlpMetricsConfig};
use crate::export::Refused;
use crate::openmetrics::Exemplar;
use crate::pipeline::Pipeline;
use crate::retry::{self, Answer, Backoff};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1 as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus::proto::{Metric, MetricFamily, MetricType};
use prost::Message;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The first wait after a failed push; it doubles up to [`RETRY_MAX`] (and never past the
/// next push).
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two tries of one push.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Who pushes: the resource of every request.
pub fn resource(instance: &str) -> Resource {
    Resource {
        attributes: vec![
            string("service.name", "refusal-gate"),
            string("service.instance.id", instance),
            string("service.version", env!("CARGO_PKG_VERSION")),
        ],
        ..Default::default()
    }
}

fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

/// The request of one push: `families` as OTLP metrics at `now` (Unix nanoseconds), their
/// cumulative counts since `start`, each point with the exemplar `exemplar` gives its series.
/// A family of a type OTLP has no counterpart for (untyped, summary: this registry makes
/// neither) is left out.
pub fn request(
    families: &[MetricFamily],
    exemplar: &dyn Fn(&MetricFamily, &Metric) -> Option<Exemplar>,
    resource: Resource,
    start: u64,
    now: u64,
) -> ExportMetricsServiceRequest {
    let metrics = families
        .iter()
        .filter_map(|family| {
            let points = family.get_metric();
            let number = |m: &Metric, value: f64| otlp::NumberDataPoint {
                attributes: attributes(m),
                start_time_unix_nano: start,
                time_unix_nano: now,
                exemplars: exemplar(family, m)
                    .map(point_exemplar)
                    .into_iter()
                    .collect(),
                value: Some(otlp::number_data_point::Value::AsDouble(value)),
                ..Default::default()
            };
            let data = match family.get_field_type() {
                MetricType::COUNTER => otlp::metric::Data::Sum(otlp::Sum {
                    data_points: points
                        .iter()
                        .map(|m| number(m, m.get_counter().get_value()))
                        .collect(),
                    aggregation_temporality: otlp::AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                }),
                MetricType::GAUGE => otlp::metric::Data::Gauge(otlp::Gauge {
                    data_points: points
                        .iter()
                        .map(|m| number(m, m.get_gauge().get_value()))
                        .collect(),
                }),
                MetricType::HISTOGRAM => otlp::metric::Data::Histogram(otlp::Histogram {
                    data_points: points.iter().map(|m| histogram(m, start, now)).collect(),
                    aggregation_temporality: otlp::AggregationTemporality::Cumulative as i32,
                }),
                MetricType::SUMMARY | MetricType::UNTYPED => return None,
            };
            Some(otlp::Metric {
                name: family.name().to_owned(),
                description: family.help().to_owned(),
                data: Some(data),
                ..Default::default()
            })
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![otlp::ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![otlp::ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "refusal-gate".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// A series' labels as attributes.
fn attributes(m: &Metric) -> Vec<KeyValue> {
    m.get_label()
        .iter()
        .map(|l| string(l.name(), l.value()))
        .collect()
}

/// A histogram point: the cumulative buckets of the Prometheus model made counts per bucket,
/// the last (+Inf) one implied by the bounds.
fn histogram(m: &Metric, start: u64, now: u64) -> otlp::HistogramDataPoint {
    let h = m.get_histogram();
    let finite: Vec<_> = h
        .get_bucket()
        .iter()
        .filter(|b| b.upper_bound().is_finite())
        .collect();
    let mut below = 0;
    let mut bucket_counts: Vec<u64> = finite
        .iter()
        .map(|b| {
            let count = b.cumulative_count().saturating_sub(below);
            below = b.cumulative_count();
            count
        })
        .collect();
    bucket_counts.push(h.get_sample_count().saturating_sub(below));
    otlp::HistogramDataPoint {
        attributes: attributes(m),
        start_time_unix_nano: start,
        time_unix_nano: now,
        count: h.get_sample_count(),
        sum: Some(h.get_sample_sum()),
        bucket_counts,
        explicit_bounds: finite.iter().map(|b| b.upper_bound()).collect(),
        ..Default::default()
    }
}

fn point_exemplar(e: Exemplar) -> otlp::Exemplar {
    otlp::Exemplar {
        time_unix_nano: e.at,
        trace_id: e.trace_id.to_vec(),
        span_id: e.span_id.to_vec(),
        value: Some(otlp::exemplar::Value::AsDouble(1.0)),
        ..Default::default()
    }
}

/// The gRPC path of `MetricsService/Export`.
const METRICS_EXPORT_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// Where pushes go: a gRPC channel with the compressor kept for it, or an HTTP client, its
/// URL and compressor.
enum Target {
    Grpc(tonic::transport::Channel, crate::export::Packer),
    Http(reqwest::Client, String, crate::export::Packer),
}

/// Why a push failed: to try again (after the server's hint, when it gave one), or not.
enum Failure {
    Retry(Option<Duration>, String),
    Final(String),
}

impl Target {
    fn new(config: &OtlpMetricsConfig, base_dir: &Path) -> anyhow::Result<Target> {
        let section = "exporters.otlp_metrics";
        let (endpoint, tls) = (config.endpoint.as_str(), config.tls.as_ref());
        Ok(match config.protocol {
            ExportProtocol::Grpc => Target::Grpc(
                crate::export::grpc_channel(endpoint, tls, section, config.timeout, base_dir)?,
                crate::export::Packer::new(config.compression)?,
            ),
            ExportProtocol::HttpProtobuf => Target::Http(
                crate::export::http_client(endpoint, tls, section, base_dir)?,
                crate::export::signal_url(endpoint, "/v1/metrics"),
                crate::export::Packer::new(config.compression)?,
            ),
        })
    }

    async fn push(
        &mut self,
        config: &OtlpMetricsConfig,
        request: &ExportMetricsServiceRequest,
    ) -> Result<(), Failure> {
        match self {
            Target::Grpc(channel, packer) => {
                // Framed and read by the exporter's own unary call: its answer read within
                // bounds (tonic's client drains every message a server sends after it).
                let call = crate::export::Unary {
                    path: METRICS_EXPORT_PATH,
                    headers: &config.headers,
                    timeout: config.timeout,
                };
                let message = vec![bytes::Bytes::from(request.encode_to_vec())];
                match call.send(channel, packer, message).await {
                    Ok(_) => Ok(()),
                    Err(Refused::TimedOut) => Err(Failure::Retry(
                        None,
                        format!("no answer within {:?}", config.timeout),
                    )),
                    Err(Refused::TooLarge(why) | Refused::Final(why)) => Err(Failure::Final(why)),
                    Err(Refused::Status(status)) => {
                        use tonic::Code;
                        use tonic_types::StatusExt;
                        let problem = format!("{:?}: {}", status.code(), status.message());
                        // The receiver's own delay (`RetryInfo`), as `Retry-After` over HTTP.
                        let hint = status.get_details_retry_info().and_then(|r| r.retry_delay);
                        // OTLP's retryable codes (RESOURCE_EXHAUSTED too: a server that sheds
                        // load says so with it).
                        match status.code() {
                            Code::Cancelled
                            | Code::DeadlineExceeded
                            | Code::Aborted
                            | Code::OutOfRange
                            | Code::Unavailable
                            | Code::DataLoss
                            | Code::ResourceExhausted
                            | Code::Unknown => Err(Failure::Retry(hint, problem)),
                            _ => Err(Failure::Final(problem)),
                        }
                    }
                }
            }
            Target::Http(client, url, packer) => {
                let body = vec![bytes::Bytes::from(request.encode_to_vec())];
                let body = packer
                    .pack(&body)
                    .map_err(|e| Failure::Final(format!("compressing the push failed: {e}")))?;
                let mut post = client
                    .post(url.as_str())
                    .timeout(config.timeout)
                    .header("content-type", "application/x-protobuf");
                if let Some(encoding) = packer.encoding() {
                    post = post.header("content-encoding", encoding);
                }
                for (name, value) in &config.headers {
                    post = post.header(name, value);
                }
                let response = match post.body(body).send().await {
                    Ok(response) => response,
                    // A connection error or a timeout: transient.
                    Err(e) => return Err(Failure::Retry(None, crate::export::error_chain(&e))),
                };
                let status = response.status().as_u16();
                let hint = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                match retry::judge(status, hint.as_deref(), crate::clock::now()) {
                    Answer::Success => Ok(()),
                    Answer::Retry(after) => Err(Failure::Retry(after, format!("HTTP {status}"))),
                    Answer::Final => Err(Failure::Final(format!("HTTP {status}"))),
                }
            }
        }
    }
}

/// A `service.instance.id` of this process: random, in the shape of a UUID.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(crate::clock::now());
        h.write_u32(std::process::id());
        h.finish()
    };
    let (a, b) = (word(), word());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// The exporter, set up: its target client (connecting lazily) and its configuration.
pub struct Pusher {
    target: Target,
    config: OtlpMetricsConfig,
}

impl Pusher {
    /// Sets up the pushes of `config` (TLS files read from `base_dir`), within the runtime
    /// (the gRPC channel connects lazily from it).
    ///
    /// # Errors
    /// When the endpoint is not a valid URI or a TLS file cannot be read or used.
    pub fn new(config: &OtlpMetricsConfig, base_dir: &Path) -> anyhow::Result<Pusher> {
        Ok(Pusher {
            target: Target::new(config, base_dir)?,
            config: config.clone(),
        })
    }

    /// Pushes every `interval` until `stop` turns true, then once more (within `timeout`,
    /// no retry), so that the last counts leave with the process.
    pub async fn run(mut self, pipeline: Arc<Pipeline>, mut stop: watch::Receiver<bool>) {
        let config = self.config.clone();
        let resource = resource(&instance_id());
        let start = crate::clock::now();
        let mut ticks = tokio::time::interval(config.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            // The stop signal first: stopped while pushing or waiting to retry, the last push
            // is made at once.
            let stopping = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => true,
                _ = ticks.tick() => false,
            };
            let now = crate::clock::now();
            // What a scrape reads: the pending verdicts settled first.
            pipeline.settle(true, now);
            let metrics = pipeline.metrics();
            metrics.set_tracker_keys(pipeline.tracker().keys());
            let request =
                metrics.with_exemplars(|f, e| self::request(f, e, resource.clone(), start, now));
            let due = tokio::time::Instant::now() + config.interval;
            let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
            loop {
                // The whole push within `timeout` (a handshake never finished and an answer's
                // body never ending too), and, before the last, given up at the stop signal:
                // the last push and the state file come after it.
                let pushed =
                    tokio::time::timeout(config.timeout, self.target.push(&config, &request));
                let outcome = tokio::select! {
                    outcome = pushed => outcome.unwrap_or_else(|_| {
                        Err(Failure::Retry(None, format!("no answer within {:?}", config.timeout)))
                    }),
                    _ = stop.wait_for(|s| *s), if !stopping => {
                        metrics.metric_push("failed");
                        break;
                    }
                };
                match outcome {
                    Ok(()) => {
                        metrics.metric_push("sent");
                        break;
                    }
                    Err(Failure::Final(problem)) => {
                        metrics.metric_push("failed");
                        tracing::warn!(%problem, "The OTLP metrics push was refused; not retried.");
                        break;
                    }
                    Err(Failure::Retry(hint, problem)) => {
                        let wait = backoff.wait(hint);
                        if stopping || tokio::time::Instant::now() + wait >= due {
                            // The next push carries the counts whole.
                            metrics.metric_push("failed");
                            tracing::warn!(
                                %problem,
                                "The OTLP metrics push failed; the next one carries its counts."
                            );
                            break;
                        }
                        metrics.metric_push("retried");
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = stop.wait_for(|s| *s) => break,
                        }
                    }
                }
            }
            if stopping {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{CounterVec, HistogramOpts, HistogramVec, IntGauge, Opts, Registry};

    /// The request of a registry of a counter with an exemplar, a gauge and a histogram,
    /// gathered between 10 and 20.
    fn three_families() -> ExportMetricsServiceRequest {
        let r = Registry::new();
        let violations = CounterVec::new(
            Opts::new("rg_violations_total", "Violations."),
            &["client", "violation"],
        )
        .expect("valid");
        r.register(Box::new(violations.clone())).expect("once");
        violations.with_label_values(&["a", "x"]).inc_by(4.0);
        let keys = IntGauge::new("rg_keys", "Keys.").expect("valid");
        r.register(Box::new(keys.clone())).expect("once");
        keys.set(7);
        let hist = HistogramVec::new(
            HistogramOpts::new("rg_seconds", "Latency.").buckets(vec![0.5, 1.0]),
            &["transport"],
        )
        .expect("valid");
        r.register(Box::new(hist.clone())).expect("once");
        for v in [0.25, 0.75, 0.8, 2.0] {
            hist.with_label_values(&["grpc"]).observe(v);
        }
        let e = Exemplar {
            trace_id: [1; 16],
            span_id: [2; 8],
            at: 99,
        };
        request(
            &r.gather(),
            &|family, _| (family.name() == "rg_violations_total").then_some(e),
            resource("i-1"),
            10,
            20,
        )
    }

    #[test]
    fn a_push_names_its_resource_and_each_family() {
        let request = three_families();
        let rm = &request.resource_metrics[0];
        let metrics = &rm.scope_metrics[0].metrics;
        let attrs: Vec<(&str, String)> = rm
            .resource
            .as_ref()
            .expect("a resource")
            .attributes
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    format!("{:?}", kv.value.as_ref().and_then(|v| v.value.as_ref())),
                )
            })
            .collect();
        assert!(attrs.contains(&("service.name", "Some(StringValue(\"refusal-gate\"))".into())));
        assert!(attrs.contains(&("service.instance.id", "Some(StringValue(\"i-1\"))".into())));
        assert!(attrs.contains(&(
            "service.version",
            format!("Some(StringValue({:?}))", env!("CARGO_PKG_VERSION"))
        )));
        let descriptions: Vec<(&str, &str)> = metrics
            .iter()
            .map(|m| (m.name.as_str(), m.description.as_str()))
            .collect();
        assert_eq!(
            descriptions,
            [
                ("rg_keys", "Keys."),
                ("rg_seconds", "Latency."),
                ("rg_violations_total", "Violations.")
            ]
        );
    }

    #[test]
    fn families_become_otlp_metrics_with_their_labels_and_exemplars() {
        let request = three_families();
        let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
        let by_name = |name: &str| {
            metrics
                .iter()
                .find(|m| m.name == name)
                .and_then(|m| m.data.clone())
                .unwrap_or_else(|| panic!("{name}"))
        };
        let otlp::metric::Data::Sum(sum) = by_name("rg_violations_total") else {
            panic!("a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            otlp::AggregationTemporality::Cumulative as i32
        );
        let point = &sum.data_points[0];
        assert_eq!(
            point.value,
            Some(otlp::number_data_point::Value::AsDouble(4.0))
        );
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (10, 20));
        assert_eq!(
            point.attributes,
            vec![string("client", "a"), string("violation", "x")]
        );
        assert_eq!(point.exemplars.len(), 1);
        assert_eq!(point.exemplars[0].trace_id, vec![1; 16]);
        assert_eq!(point.exemplars[0].span_id, vec![2; 8]);
        assert_eq!(point.exemplars[0].time_unix_nano, 99);
        assert_eq!(
            point.exemplars[0].value,
            Some(otlp::exemplar::Value::AsDouble(1.0)),
            "one attempt"
        );
        let otlp::metric::Data::Gauge(gauge) = by_name("rg_keys") else {
            panic!("a gauge")
        };
        assert_eq!(
            gauge.data_points[0].value,
            Some(otlp::number_data_point::Value::AsDouble(7.0))
        );
        assert!(gauge.data_points[0].exemplars.is_empty());
        assert_eq!(
            (
                gauge.data_points[0].start_time_unix_nano,
                gauge.data_points[0].time_unix_nano
            ),
            (10, 20)
        );
        let otlp::metric::Data::Histogram(h) = by_name("rg_seconds") else {
            panic!("a histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![0.5, 1.0]);
        assert_eq!(p.bucket_counts, vec![1, 2, 1], "per bucket, +Inf last");
        assert_eq!((p.count, p.sum), (4, Some(3.8)));
        assert_eq!(p.attributes, vec![string("transport", "grpc")]);
        assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (10, 20));
        assert_eq!(
            h.aggregation_temporality,
            otlp::AggregationTemporality::Cumulative as i32
        );
    }

    #[test]
    fn an_instance_id_is_a_fresh_uuid_shape() {
        let (a, b) = (instance_id(), instance_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4', "version 4: {a}");
        assert!(matches!(a.as_bytes()[19], b'8'..=b'b'), "variant: {a}");
    }
}
