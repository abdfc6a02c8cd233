//! The configuration file: one YAML document, collector style (DESIGN §7).
//!
//! Core: parsing and validation are pure (text in, [`Config`] or [`ConfigError`] out); the
//! only I/O is [`Config::load`], which reads the named file. Every key is checked at start-up,
//! before any port is bound: an unknown key or a bad value is an error that names the key.
//! The YAML parser is `serde_yaml_ng`, a maintained fork of the archived `serde_yaml` with the
//! same data model and error positions (line and column).

use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The configuration `refusal-gate` serves with when it is given no file, and what
/// `refusal-gate default-config` prints. Every key is shown with its default.
mod validate;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("../default-config.yaml");

/// The attributes read per span unless configured otherwise
/// (`receivers.otlp.max_attributes_per_span`): the OpenTelemetry SDKs' own default limit.
pub const DEFAULT_MAX_ATTRIBUTES: usize = 128;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file named.
        path: String,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The YAML is malformed, has an unknown key, or a value of the wrong type.
    #[error("{0}")]
    Syntax(String),
    /// A value parsed but is not allowed.
    #[error("{key}: {problem}")]
    Invalid {
        /// The dotted path of the key, e.g. `interfaces[1].url`.
        key: String,
        /// What is wrong with its value.
        problem: String,
    },
}

/// The whole configuration file. `Default` is the embedded defaults (a test keeps the
/// struct defaults and [`DEFAULT_CONFIG`] equal).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The OTLP receivers.
    pub receivers: Receivers,
    /// The admin endpoint: `/metrics`, `/healthz`, `/readyz`.
    pub admin: Admin,
    /// The interfaces whose contracts refusal-gate knows.
    pub interfaces: Vec<InterfaceConfig>,
    /// Globs of discovery documents, each of which becomes an interface of its own, named
    /// by the document and speaking the protocol of its kind.
    pub interfaces_from: Vec<String>,
    /// The tracker's limits and windows.
    pub tracker: TrackerConfig,
    /// Limits on Prometheus label values.
    pub metrics: MetricsConfig,
    /// The built-in alerter.
    pub alerting: AlertingConfig,
    /// Where the tagged spans go next.
    pub exporters: Exporters,
    /// The process itself: how long it may take to stop.
    pub service: ServiceConfig,
    /// The directory relative document paths and globs are resolved against: the
    /// configuration file's own, or the working directory.
    #[serde(skip)]
    pub base_dir: std::path::PathBuf,
}

/// `service:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Everything a stop does, in all: the receivers' drain, the last alerts, the export
    /// queue's drain, the state file, each with its share. The default fits Kubernetes'
    /// 30 s grace period with room to spare.
    #[serde(deserialize_with = "duration")]
    pub shutdown_timeout: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            shutdown_timeout: Duration::from_secs(20),
        }
    }
}

/// `receivers:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Receivers {
    /// `receivers.otlp`.
    pub otlp: OtlpReceivers,
}

/// `receivers.otlp`: both transports are always served.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpReceivers {
    /// OTLP/gRPC.
    pub grpc: GrpcReceiver,
    /// OTLP/HTTP.
    pub http: HttpReceiver,
    /// Bearer tokens both receivers require; none: no authentication.
    pub auth: AuthConfig,
    /// Attributes read per span (and per resource); the rest are skipped unread.
    pub max_attributes_per_span: usize,
}

impl Default for OtlpReceivers {
    fn default() -> Self {
        OtlpReceivers {
            grpc: GrpcReceiver::default(),
            http: HttpReceiver::default(),
            auth: AuthConfig::default(),
            max_attributes_per_span: DEFAULT_MAX_ATTRIBUTES,
        }
    }
}

/// `receivers.otlp.auth` and `admin.auth`: the bearer tokens accepted. With none,
/// authentication is off.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Tokens, inline.
    pub tokens: Vec<String>,
    /// Files holding one token each (surrounding whitespace ignored), relative to the
    /// configuration file; read at start and again on SIGHUP, so a token can be rotated
    /// without a restart.
    pub token_files: Vec<std::path::PathBuf>,
    /// Tokens that speak only for some clients, or (the admin endpoint's) only read.
    pub scoped: Vec<ScopedToken>,
}

/// One of `auth.scoped`: a token (inline or in a file) and what it may do. A span, or a Gate
/// question with `observe: true`, about a client it may not speak for is refused and counted,
/// never judged (DESIGN §7).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopedToken {
    /// The token, inline.
    pub token: Option<String>,
    /// Or the file holding it, as `token_files`.
    pub token_file: Option<std::path::PathBuf>,
    /// The clients it may speak for: patterns of `service.name`, `*` standing for any run of
    /// characters; absent: any client.
    pub clients: Option<Vec<String>>,
    /// The admin endpoint's only: it reads, and asks the Gate without observing.
    #[serde(default)]
    pub read_only: bool,
}

/// `tls:` of a receiver or the admin endpoint (the Collector's names): serve TLS with this
/// certificate, and with `client_ca_file` require client certificates it signed (mTLS).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server certificate chain, PEM.
    pub cert_file: std::path::PathBuf,
    /// Its private key, PEM.
    pub key_file: std::path::PathBuf,
    /// CA certificates, PEM, that client certificates must chain to; absent: no client
    /// certificate is asked for.
    #[serde(default)]
    pub client_ca_file: Option<std::path::PathBuf>,
    /// How often the files are checked for change and reloaded (0s: only on SIGHUP).
    #[serde(default = "default_tls_reload", deserialize_with = "duration")]
    pub reload_interval: Duration,
}

fn default_tls_reload() -> Duration {
    Duration::from_secs(60)
}

/// The default concurrency limit of each receiver.
const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 64;
const DEFAULT_MAX_READING_MIB: u64 = 128;
/// The default connection cap of each receiver (the admin endpoint's is smaller).
const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The default time a client has to send a request's headers (HTTP/1).
const DEFAULT_READ_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default time a client has to send a request's body once its headers arrived: the
/// OpenTelemetry SDKs' own export timeout, past which no default client is still waiting.
const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The default time a connection with no request in flight is kept open.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `receivers.otlp.grpc`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcReceiver {
    /// Where to listen.
    #[serde(deserialize_with = "socket_addr")]
    pub endpoint: SocketAddr,
    /// The largest request message accepted, after decompression, in MiB: an OTLP export or
    /// a Gate API request.
    pub max_recv_msg_size_mib: u64,
    /// Requests handled at once, each from the moment its message has arrived; past it,
    /// `UNAVAILABLE` with a retry hint.
    pub max_concurrent_requests: usize,
    /// Bytes of messages still arriving, over all connections, in MiB; a message that would
    /// pass it is refused `UNAVAILABLE` with a retry hint. At least `max_recv_msg_size_mib`.
    pub max_reading_mib: u64,
    /// Open connections at once; past it a new one is accepted and closed (counted).
    pub max_connections: usize,
    /// Streams a client may open at once on one HTTP/2 connection (advertised in SETTINGS).
    pub max_concurrent_streams: u32,
    /// How long a request's message may take to arrive once its headers did; past it
    /// `DEADLINE_EXCEEDED` and its concurrency slot is freed (0s: no limit).
    #[serde(deserialize_with = "duration")]
    pub read_timeout: Duration,
    /// A connection with no stream open this long is sent GOAWAY and closed (0s: never).
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// How often the server pings a connection to check the client is still there
    /// (0s: never).
    #[serde(deserialize_with = "duration")]
    pub keepalive_time: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    #[serde(deserialize_with = "duration")]
    pub keepalive_timeout: Duration,
    /// Serve TLS (and mTLS); absent: plain TCP.
    pub tls: Option<TlsConfig>,
}

impl Default for GrpcReceiver {
    fn default() -> Self {
        GrpcReceiver {
            endpoint: SocketAddr::from(([127, 0, 0, 1], 4317)),
            max_recv_msg_size_mib: 4,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_reading_mib: DEFAULT_MAX_READING_MIB,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_streams: 100,
            read_timeout: DEFAULT_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            keepalive_time: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            tls: None,
        }
    }
}

/// `receivers.otlp.http`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpReceiver {
    /// Where to listen.
    #[serde(deserialize_with = "socket_addr")]
    pub endpoint: SocketAddr,
    /// The largest request body accepted, in MiB, both as sent and after gzip inflation.
    pub max_request_body_size_mib: u64,
    /// Requests handled at once, each from the moment its body has arrived; past it, 503
    /// with `Retry-After`.
    pub max_concurrent_requests: usize,
    /// Bytes of bodies still arriving, over all connections, in MiB; a body that would pass
    /// it is refused 503 with `Retry-After`. At least `max_request_body_size_mib`.
    pub max_reading_mib: u64,
    /// Open connections at once; past it a new one is accepted and closed (counted).
    pub max_connections: usize,
    /// How long a client has to send a request's headers, from its first byte (or from
    /// the connection's opening, for the first request); past it the connection is closed
    /// (0s: no limit).
    #[serde(deserialize_with = "duration")]
    pub read_header_timeout: Duration,
    /// How long a request's body may take to arrive once its headers did; past it 408 and
    /// its concurrency slot is freed (0s: no limit).
    #[serde(deserialize_with = "duration")]
    pub read_timeout: Duration,
    /// A kept-alive connection waiting this long for its next request is closed (0s: never).
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Serve TLS (and mTLS); absent: plain TCP.
    pub tls: Option<TlsConfig>,
}

impl Default for HttpReceiver {
    fn default() -> Self {
        HttpReceiver {
            endpoint: SocketAddr::from(([127, 0, 0, 1], 4318)),
            max_request_body_size_mib: 20,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_reading_mib: DEFAULT_MAX_READING_MIB,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            read_header_timeout: DEFAULT_READ_HEADER_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            tls: None,
        }
    }
}

/// `admin:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Where to listen.
    #[serde(deserialize_with = "socket_addr")]
    pub endpoint: SocketAddr,
    /// Bearer tokens the admin endpoint requires (except `/healthz` and `/readyz`); none:
    /// no authentication.
    pub auth: AuthConfig,
    /// Open connections at once; past it a new one is accepted and closed (counted).
    pub max_connections: usize,
    /// As `receivers.otlp.http.read_header_timeout`.
    #[serde(deserialize_with = "duration")]
    pub read_header_timeout: Duration,
    /// As `receivers.otlp.http.read_timeout`.
    #[serde(deserialize_with = "duration")]
    pub read_timeout: Duration,
    /// As `receivers.otlp.http.idle_timeout`.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Serve TLS (and mTLS); absent: plain TCP.
    pub tls: Option<TlsConfig>,
    /// The console on `/`.
    pub ui: UiConfig,
}

/// `admin.ui`: the console.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// A trace's page in your tracing UI, `{trace_id}` replaced by the hex trace id, e.g.
    /// `http://tempo:3200/trace/{trace_id}`: alerts and attempts link to it (http or https
    /// only: the console renders it as a link). None: no links.
    pub trace_url: Option<String>,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            endpoint: SocketAddr::from(([127, 0, 0, 1], 9464)),
            auth: AuthConfig::default(),
            max_connections: 1024,
            read_header_timeout: DEFAULT_READ_HEADER_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            tls: None,
            ui: UiConfig::default(),
        }
    }
}

/// The protocol an interface speaks (`interfaces[].protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Model Context Protocol over Streamable HTTP.
    Mcp,
    /// Agent2Agent.
    A2a,
    /// Plain HTTP.
    Http,
    /// gRPC.
    Grpc,
}

impl Protocol {
    /// Its configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Mcp => "mcp",
            Protocol::A2a => "a2a",
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// One `interfaces[]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceConfig {
    /// The name used as the `interface` label and on tagged spans.
    pub name: String,
    /// What it speaks.
    pub protocol: Protocol,
    /// Origin and base path, e.g. `http://mcp.test:8080/mcp`. Optional when a discovery
    /// document names it.
    #[serde(default)]
    pub url: Option<String>,
    /// The operations it declares.
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    /// Where its discovery documents live.
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    /// The interface observed from its own side: its SERVER spans are attempts too
    /// (DESIGN §9).
    #[serde(default)]
    pub server: Option<ServerViewConfig>,
}

/// `interfaces[].server`: which resources' SERVER spans are attempts on the interface, and
/// where on such a span the client's identity is found.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerViewConfig {
    /// The `service.name` of every resource whose SERVER spans are attempts on it.
    pub service_names: Vec<String>,
    /// Span attributes naming the client, first present wins (each also read under its
    /// legacy name: `user_agent.original` as `http.user_agent`).
    #[serde(default = "default_client_from")]
    pub client_from: Vec<String>,
}

/// The default `client_from`: an authenticated user, then the user agent.
pub fn default_client_from() -> Vec<String> {
    ["enduser.id", "user.id", "user_agent.original"]
        .map(String::from)
        .to_vec()
}

/// One declared endpoint: a path (exact, or a template such as `/users/{id}`) and,
/// optionally, the methods it supports.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// The path, starting with `/`.
    pub path: String,
    /// The HTTP methods it supports; empty means any.
    #[serde(default)]
    pub methods: Vec<String>,
}

/// `interfaces[].discovery`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Discovery paths on top of the defaults of DESIGN §3.
    #[serde(default)]
    pub paths: Vec<String>,
    /// The interface's discovery document: an A2A agent card, an OpenAPI document or an MCP
    /// server card, whose declared paths join the inline `endpoints`.
    #[serde(default)]
    pub document: Option<DocumentSource>,
}

/// `interfaces[].discovery.document`: a file, or a URL fetched every `refresh`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentSource {
    /// A local file, relative to the configuration file's directory.
    #[serde(default)]
    pub file: Option<std::path::PathBuf>,
    /// An `http://` or `https://` URL.
    #[serde(default)]
    pub url: Option<String>,
    /// How often a URL document is fetched again (with `If-None-Match`).
    #[serde(default = "default_refresh", deserialize_with = "duration")]
    pub refresh: Duration,
    /// How long one fetch (or one read of a file) may take.
    #[serde(default = "default_fetch_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// The largest document read, in MiB; a larger one is refused (`too_large`).
    #[serde(default = "default_document_max_mib")]
    pub max_size_mib: u64,
}

/// The largest discovery document read unless configured otherwise, in MiB: real agent
/// cards and OpenAPI documents are kilobytes; a few MiB leaves room for the largest.
pub const DEFAULT_DOCUMENT_MAX_MIB: u64 = 4;

fn default_document_max_mib() -> u64 {
    DEFAULT_DOCUMENT_MAX_MIB
}

impl DocumentSource {
    /// `max_size_mib` in bytes.
    pub fn max_bytes(&self) -> usize {
        usize::try_from(self.max_size_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

fn default_refresh() -> Duration {
    Duration::from_secs(300)
}

fn default_fetch_timeout() -> Duration {
    Duration::from_secs(10)
}

/// `tracker:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrackerConfig {
    /// Retries of a transient or throttled failure a client may make before it exhausts
    /// its budget.
    pub max_retries: u32,
    /// How long after a refusal a request for another undeclared path counts as a probe, and
    /// how long without a retry makes a refusal honored.
    #[serde(deserialize_with = "duration")]
    pub probe_window: Duration,
    /// A key with no attempt for this long is forgotten.
    #[serde(deserialize_with = "duration")]
    pub key_ttl: Duration,
    /// The most keys kept; past it the least recently used are evicted.
    pub max_keys: usize,
    /// How long an attempt's verdict waits for late, out-of-order spans before it is counted
    /// (a read of `/metrics` counts what is pending at once).
    #[serde(deserialize_with = "duration")]
    pub reorder_window: Duration,
    /// The attempts all reorder windows may hold at once, about; past it the groups whose
    /// windows opened first are counted early, and the window shortens until they hold no
    /// more (`refusal_gate_tracker_settled_early_total`). 0: no bound, every window whole.
    pub max_pending: usize,
    /// Where the tracker's state is kept across restarts (relative to the configuration
    /// file): written on shutdown and every `state_interval`, read on start. None: not kept.
    pub state_file: Option<std::path::PathBuf>,
    /// How often the state file is written while serving (0s: only on shutdown).
    #[serde(deserialize_with = "duration")]
    pub state_interval: Duration,
    /// Spans of calls kept for the other spans of their call (DESIGN §9, §11): held until
    /// their parent arrives (at most `reorder_window`), or counted and remembered for the
    /// other side's spans (a minute). Past it the oldest call goes: a held one is counted at
    /// once (`refusal_gate_held_calls_forced_total{bound="max_held_spans"}`), a remembered
    /// one forgotten, its span ids kept a minute (four times this many at most) so that its
    /// late spans are not counted as calls of their own. Apart from those, as many spans of
    /// calls counted whole are kept `reorder_window` for a late part of their own (DESIGN
    /// §11: a child that ended after its parent), the oldest request forgotten first. 0:
    /// nothing is held or kept.
    pub max_held_spans: usize,
    /// The memory those spans' facts may take, in MiB (each keeps its extracted attempt and
    /// ids, its strings included, not the span); past it, as past `max_held_spans`. The calls
    /// kept for a late part may take as much again, their requests' bytes included.
    pub max_held_mib: u64,
    /// How far apart a refusal and a success of the same operation on one interface may be
    /// for the interface to have contradicted itself (DESIGN §13), and how long a
    /// contradiction is remembered before it is counted again.
    #[serde(deserialize_with = "duration")]
    pub honesty_window: Duration,
    /// What this replica does with the calls it joins: counts them (the default), or, as the
    /// first of two tiers of replicas, forwards each span stamped with its call's client and
    /// counts nothing ([`Role::Join`]).
    pub role: Role,
}

/// `tracker.role`: what a replica does with the calls it joins (docs/operations.md, "Running
/// several").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Counts every call, raises alerts and tags the spans it forwards with their verdicts.
    #[default]
    Count,
    /// Joins each call's spans (a first tier, routed by trace id) and forwards every span
    /// with `refusal_gate.client` (and `refusal_gate.client_instance`) naming its call's
    /// client — no trace's spans of two clients in one forwarded request — for a second tier
    /// routed by that client.
    /// Counts, alerts and tags nothing.
    Join,
}

impl TrackerConfig {
    /// `max_held_mib` in bytes.
    pub fn max_held_bytes(&self) -> usize {
        mib(self.max_held_mib)
    }
}

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            max_retries: 3,
            probe_window: Duration::from_secs(600),
            key_ttl: Duration::from_secs(3600),
            max_keys: 500_000,
            reorder_window: Duration::from_secs(5),
            max_pending: 1_500_000,
            state_file: None,
            state_interval: Duration::from_secs(60),
            max_held_spans: 10_000,
            max_held_mib: 16,
            honesty_window: Duration::from_secs(3600),
            role: Role::Count,
        }
    }
}

/// `metrics:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Distinct `client` label values; past the cap the value is `__overflow__`.
    pub max_clients: usize,
    /// Distinct `interface` label values; past the cap the value is `__overflow__`.
    pub max_interfaces: usize,
    /// Distinct (client, interface) pairs — the clients and interfaces caps alone allow
    /// their product; past it new pairs share the (`__overflow__`, `__overflow__`) one.
    pub max_series: usize,
    /// A (client, interface) pair with no attempt counted this long loses its series and
    /// frees its names' places under the caps; 0 keeps series forever.
    #[serde(deserialize_with = "duration")]
    pub series_ttl: Duration,
    /// The longest `client` or `interface` label value, in bytes: a longer one is cut and
    /// given a hash suffix (`~` and 16 hex digits), the same short value wherever the name is
    /// shown. At least 32.
    pub max_label_bytes: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            max_clients: 1000,
            max_interfaces: 500,
            max_series: 10_000,
            series_ttl: Duration::from_secs(3600),
            max_label_bytes: 128,
        }
    }
}

/// `exporters:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Exporters {
    /// Forward every span, attempts tagged, over OTLP. Off when absent.
    pub otlp: Option<OtlpExporterConfig>,
    /// Push the families of `/metrics` over OTLP every `interval`. Off when absent.
    pub otlp_metrics: Option<OtlpMetricsConfig>,
}

/// `exporters.otlp_metrics`: the families of `/metrics` pushed as OTLP metrics, for a
/// backend that does not scrape. Speaks like `exporters.otlp`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpMetricsConfig {
    /// `http://host:port` (gRPC), or the base URL for `http/protobuf` (`/v1/metrics` added).
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    #[serde(default = "default_export_protocol")]
    pub protocol: ExportProtocol,
    /// Headers (gRPC metadata) sent with every request.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// `gzip`, `zstd` or `none`.
    #[serde(default = "default_compression")]
    pub compression: Compression,
    /// TLS towards an `https://` endpoint, as for `exporters.otlp`.
    #[serde(default)]
    pub tls: Option<ExporterTlsConfig>,
    /// How long one push may take.
    #[serde(default = "default_export_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// How often the counters are pushed (a failed push is retried until the next is due,
    /// which carries the counts whole).
    #[serde(default = "default_push_interval", deserialize_with = "duration")]
    pub interval: Duration,
}

/// How the exporter speaks OTLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ExportProtocol {
    /// OTLP/gRPC.
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, to `<endpoint>/v1/traces`.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// What the receivers do when the export queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFull {
    /// Refuse with OTLP's retryable answer (503 / `UNAVAILABLE` with a retry hint).
    Backpressure,
    /// Accept, drop the forward, count it.
    Drop,
}

/// Compression of exported requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
    /// None.
    None,
}

/// `exporters.otlp`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpExporterConfig {
    /// `http://host:port` (gRPC), or the base URL for `http/protobuf`.
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    #[serde(default = "default_export_protocol")]
    pub protocol: ExportProtocol,
    /// Headers (gRPC metadata) sent with every request.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// `gzip`, `zstd` or `none`.
    #[serde(default = "default_compression")]
    pub compression: Compression,
    /// TLS towards an `https://` endpoint: whom to trust, and the certificate to present.
    /// Absent: the built-in (Mozilla) roots, no client certificate.
    #[serde(default)]
    pub tls: Option<ExporterTlsConfig>,
    /// How long one send may take.
    #[serde(default = "default_export_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// Spans held for sending; past it, `on_full` applies.
    #[serde(default = "default_queue_size")]
    pub queue_size: usize,
    /// Bytes held for sending, in MiB; past it, `on_full` applies too.
    #[serde(default = "default_queue_size_mib")]
    pub queue_size_mib: u64,
    /// The most spans in one request downstream.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// The most bytes in one request downstream, in MiB (before compression): below the
    /// 4 MiB a Collector (and refusal-gate) receives over gRPC by default.
    #[serde(default = "default_batch_size_mib")]
    pub batch_size_mib: u64,
    /// How long a batch waits to fill.
    #[serde(default = "default_batch_interval", deserialize_with = "duration")]
    pub batch_interval: Duration,
    /// `backpressure` (refuse senders with a retry hint) or `drop`.
    #[serde(default = "default_on_full")]
    pub on_full: OnFull,
    /// At shutdown, how long the queue may take to drain.
    #[serde(default = "default_drain_timeout", deserialize_with = "duration")]
    pub drain_timeout: Duration,
}

/// `exporters.otlp.tls`: files (PEM, relative to the configuration file) for TLS towards
/// an `https://` next hop, as the Collector's exporters take them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExporterTlsConfig {
    /// CA certificates the next hop's certificate must chain to, instead of the built-in
    /// roots.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate chain to present (mTLS), with `key_file`.
    #[serde(default)]
    pub cert_file: Option<std::path::PathBuf>,
    /// The client certificate's private key.
    #[serde(default)]
    pub key_file: Option<std::path::PathBuf>,
}

impl OtlpExporterConfig {
    /// `queue_size_mib` in bytes.
    pub fn queue_bytes(&self) -> usize {
        mib(self.queue_size_mib)
    }

    /// `batch_size_mib` in bytes.
    pub fn batch_bytes(&self) -> usize {
        mib(self.batch_size_mib)
    }
}

fn mib(n: u64) -> usize {
    usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

fn default_queue_size_mib() -> u64 {
    256
}

fn default_batch_size_mib() -> u64 {
    3
}

fn default_export_protocol() -> ExportProtocol {
    ExportProtocol::Grpc
}
fn default_compression() -> Compression {
    Compression::Gzip
}
fn default_export_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_push_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_queue_size() -> usize {
    100_000
}
fn default_batch_size() -> usize {
    8192
}
fn default_batch_interval() -> Duration {
    Duration::from_millis(200)
}
fn default_on_full() -> OnFull {
    OnFull::Backpressure
}
fn default_drain_timeout() -> Duration {
    Duration::from_secs(10)
}

/// How urgent an alert is (`alerting.min_severity`; which violation raises which is the
/// alert rules' business, `crate::alert`). Ordered: `Info < Warning < Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing: an interface at odds with its discovery document (DESIGN §13).
    Info,
    /// Worth a look.
    Warning,
    /// A client retried after an authoritative refusal.
    Critical,
}

impl Severity {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// `alerting:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertingConfig {
    /// Where to push alerts; none means log lines and `/api/v1/alerts` only.
    pub alertmanager: Option<AlertmanagerConfig>,
    /// An alert resolves this long after its last violation.
    #[serde(deserialize_with = "duration")]
    pub resolve_after: Duration,
    /// Alerts below this severity are not raised (`warning` or `critical`).
    pub min_severity: Severity,
    /// The most distinct alerts held (firing or waiting for delivery); past it new ones
    /// are dropped and counted.
    pub queue_size: usize,
    /// The most alert watchers at once (`WatchAlerts` streams and `/v1/alerts/stream`
    /// subscribers together); past it new ones are refused and counted.
    pub max_watchers: usize,
}

impl Default for AlertingConfig {
    fn default() -> Self {
        AlertingConfig {
            alertmanager: None,
            resolve_after: Duration::from_secs(300),
            min_severity: Severity::Warning,
            queue_size: 10_000,
            max_watchers: 100,
        }
    }
}

/// `alerting.alertmanager`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    /// Alertmanager's base URL, e.g. `http://127.0.0.1:9093`.
    pub url: String,
    /// How long one push may take.
    #[serde(default = "default_push_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
}

fn default_push_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Config {
    /// Parses and validates a configuration text.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] for malformed YAML, unknown keys and wrong types (the message
    /// names the key and the line); [`ConfigError::Invalid`] for values out of range.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        // An empty file is an empty mapping: every default applies.
        let text = if text.trim().is_empty() { "{}" } else { text };
        // serde_path_to_error names the key (`tracker.probe_window`) even for errors raised
        // inside a field's own parser, where the YAML error alone would name only its parent.
        let config: Config = serde_path_to_error::deserialize(
            serde_yaml_ng::Deserializer::from_str(text),
        )
        .map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            ConfigError::Syntax(if path == "." {
                inner
            } else {
                format!("{path}: {}", strip_parent_path(&path, &inner))
            })
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates the file at `path`.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read; otherwise as [`Config::parse`],
    /// with the file's name in front of the message.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let parsed = Config::parse(&text).map(|mut c| {
            c.base_dir = path
                .parent()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default();
            c
        });
        parsed.map_err(|e| match e {
            ConfigError::Syntax(m) => ConfigError::Syntax(format!("{}: {m}", path.display())),
            ConfigError::Invalid { key, problem } => ConfigError::Invalid {
                key: format!("{}: {key}", path.display()),
                problem,
            },
            other => other,
        })
    }
}

/// The YAML error repeats the parent of the key (`tracker: ...`); drop it once the full
/// path stands in front.
fn strip_parent_path<'a>(path: &str, message: &'a str) -> &'a str {
    let mut parent = path;
    while let Some(cut) = parent.rfind(['.', '[']) {
        parent = &parent[..cut];
        if let Some(rest) = message
            .strip_prefix(parent)
            .and_then(|m| m.strip_prefix(": "))
        {
            return rest;
        }
    }
    message
}

fn socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(|_| {
        de::Error::custom(format!(
            "`{text}` is not an address and port such as 127.0.0.1:4317"
        ))
    })
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        de::Error::custom(format!(
            "`{text}` is not a duration such as 500ms, 3s, 10m or 1h ({e})"
        ))
    })
}

#[cfg(test)]
mod tests;
