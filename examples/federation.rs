//! Records the federation of DESIGN §1 — three clients of one MCP server over one day — as
//! OTLP JSON lines, the way the Collector's file exporter writes them. The spans are made by
//! the OpenTelemetry SDK; a small JSON-lines `SpanExporter` writes each export as one
//! `ExportTraceServiceRequest` (opentelemetry-proto's own conversion and JSON mapping).
//!
//!     cargo run --example federation [OUT]          (default: examples/federation.jsonl)
//!     cargo run --release -- replay examples/federation.jsonl
//!
//! - `planner-agent` reads `-32601` as final and stops;
//! - `prober-agent` reads the server card, then sends 22 POSTs to three undeclared paths;
//! - `assistant-agent` retries a `tools/call` that failed with invalid params twice more.

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Writes each export as one OTLP JSON line.
#[derive(Debug)]
struct JsonLines {
    out: Arc<Mutex<std::fs::File>>,
    resource: ResourceAttributesWithSchema,
}

impl SpanExporter for JsonLines {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let line = serde_json::to_string(&request)
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        let mut out = self
            .out
            .lock()
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        writeln!(out, "{line}").map_err(|e| OTelSdkError::InternalFailure(e.to_string()))
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.into();
    }
}

const MCP: &str = "http://mcp.test:8080";

/// One client: its own provider (its own `service.name`) writing to the shared file.
struct Client {
    provider: SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

impl Client {
    fn new(name: &str, out: &Arc<Mutex<std::fs::File>>) -> Client {
        let provider = SdkTracerProvider::builder()
            .with_resource(
                Resource::builder()
                    .with_service_name(name.to_owned())
                    .with_attribute(KeyValue::new("service.instance.id", format!("{name}-0")))
                    .build(),
            )
            .with_simple_exporter(JsonLines {
                out: Arc::clone(out),
                resource: ResourceAttributesWithSchema::default(),
            })
            .build();
        let tracer = provider.tracer("federation");
        Client { provider, tracer }
    }

    /// One client span from `start` lasting `ms`, failed when `failed`.
    fn call(
        &self,
        name: String,
        start: SystemTime,
        ms: u64,
        attributes: Vec<KeyValue>,
        failed: bool,
    ) {
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes(attributes)
            .start(&self.tracer);
        if failed {
            span.set_status(Status::error("request failed"));
        }
        span.end_with_timestamp(start + Duration::from_millis(ms));
    }

    fn http(&self, start: SystemTime, method: &str, path: &str, status: i64) {
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("url.full", format!("{MCP}{path}")),
            KeyValue::new("server.address", "mcp.test"),
            KeyValue::new("server.port", 8080),
            KeyValue::new("http.response.status_code", status),
        ];
        if status >= 400 {
            attributes.push(KeyValue::new("error.type", status.to_string()));
        }
        self.call(method.to_owned(), start, 20, attributes, status >= 400);
    }

    fn mcp(&self, start: SystemTime, method: &str, tool: Option<&str>, code: Option<i64>) {
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", method.to_owned()),
            KeyValue::new("server.address", "mcp.test"),
            KeyValue::new("server.port", 8080),
            KeyValue::new("network.transport", "tcp"),
        ];
        if let Some(tool) = tool {
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
        }
        if let Some(code) = code {
            attributes.push(KeyValue::new("rpc.response.status_code", code.to_string()));
            attributes.push(KeyValue::new("error.type", code.to_string()));
        }
        let name = match tool {
            Some(t) => format!("MCP send {method} {t}"),
            None => format!("MCP send {method}"),
        };
        self.call(name, start, 40, attributes, code.is_some());
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/federation.jsonl".to_owned());
    let out = Arc::new(Mutex::new(std::fs::File::create(&path)?));
    // The window: one day, starting 2026-11-01T00:00:00Z.
    let day = UNIX_EPOCH + Duration::from_secs(1_793_491_200);
    let at = |h: u64, ms: u64| day + Duration::from_secs(h * 3600) + Duration::from_millis(ms);

    let planner = Client::new("planner-agent", &out);
    planner.mcp(at(2, 0), "initialize", None, None);
    planner.mcp(at(2, 500), "server/discover", None, Some(-32601));

    let prober = Client::new("prober-agent", &out);
    prober.http(at(9, 0), "GET", "/.well-known/mcp.json", 200);
    let paths = ["/mcp/mcp", "/mcp/sse", "/mcp/a2a/"];
    for i in 0..22u64 {
        prober.http(at(9, 1000 + 1500 * i), "POST", paths[(i % 3) as usize], 404);
    }

    let assistant = Client::new("assistant-agent", &out);
    assistant.mcp(at(17, 0), "initialize", None, None);
    for i in 0..3u64 {
        assistant.mcp(
            at(17, 1000 + 2000 * i),
            "tools/call",
            Some("weather.lookup-v0"),
            Some(-32602),
        );
    }

    for client in [planner, prober, assistant] {
        client.provider.shutdown()?;
    }
    eprintln!("wrote {path}");
    Ok(())
}
