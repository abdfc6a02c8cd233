//! Tests of the configuration: every key parsed, every refusal named with its path and
//! line, the embedded defaults and `default-config` in agreement.

use super::*;

#[test]
fn embedded_defaults_parse_and_match_the_contract() {
    let c = Config::parse(DEFAULT_CONFIG).expect("the embedded file is valid");
    assert_eq!(c.receivers.otlp.grpc.endpoint.to_string(), "127.0.0.1:4317");
    assert_eq!(c.receivers.otlp.http.endpoint.to_string(), "127.0.0.1:4318");
    assert_eq!(c.admin.endpoint.to_string(), "127.0.0.1:9464");
    assert_eq!(c.receivers.otlp.http.max_request_body_size_mib, 20);
    assert_eq!(c.tracker.max_retries, 3);
    assert_eq!(c.tracker.probe_window, Duration::from_secs(600));
    assert_eq!(c.tracker.key_ttl, Duration::from_secs(3600));
    assert_eq!(c.tracker.max_keys, 500_000);
    assert_eq!(c.tracker.max_pending, 1_500_000);
    assert_eq!(c.metrics.max_clients, 1000);
    assert_eq!(c.metrics.max_interfaces, 500);
    assert!(c.interfaces.is_empty());
}

#[test]
fn struct_defaults_equal_the_embedded_file() {
    // The file is what users read; the Default impls are what a partial file falls back to.
    let file = Config::parse(DEFAULT_CONFIG).expect("the embedded file is valid");
    let empty = Config::parse("").expect("an empty file is valid");
    assert_eq!(format!("{file:?}"), format!("{:?}", Config::default()));
    assert_eq!(format!("{empty:?}"), format!("{:?}", Config::default()));
}

#[test]
fn the_contract_example_parses() {
    let text = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:14317 }
    http: { endpoint: 127.0.0.1:14318, max_request_body_size_mib: 1 }
admin:
  endpoint: 127.0.0.1:19464
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
    discovery:
      paths: [/.well-known/mcp.json]
tracker:
  max_retries: 3
  probe_window: 3s
  key_ttl: 1h
  max_keys: 100
metrics:
  max_clients: 10
  max_interfaces: 5
";
    let c = Config::parse(text).expect("valid");
    assert_eq!(c.interfaces[0].protocol, Protocol::Mcp);
    assert_eq!(c.tracker.probe_window, Duration::from_secs(3));
    assert_eq!(c.tracker.max_keys, 100);
}

#[test]
fn bad_configurations_name_the_key() {
    let cases = [
            ("tracker: { max_retrys: 3 }", "max_retrys"),
            ("tracker: { probe_window: soon }", "probe_window"),
            ("admin: { endpoint: localhost }", "endpoint"),
            ("tracker: { max_keys: 0 }", "tracker.max_keys"),
            ("metrics: { max_clients: 0 }", "metrics.max_clients"),
            ("metrics: { max_label_bytes: 31 }", "metrics.max_label_bytes"),
            (
                "metrics: { max_label_bytes: 32 }\ninterfaces: [{ name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, protocol: http, url: 'http://x' }]",
                "interfaces[0].name",
            ),
            (
                "interfaces: [{ name: a, protocol: mcp, url: 'not a url' }]",
                "interfaces[0].url",
            ),
            (
                "interfaces: [{ name: a, protocol: soap, url: 'http://x' }]",
                "protocol",
            ),
            (
                "interfaces: [{ name: a, protocol: http, url: 'http://x', endpoints: [{ path: x }] }]",
                "interfaces[0].endpoints[0].path",
            ),
            (
                "interfaces: [{ name: a, protocol: http, url: 'http://x' }, { name: a, protocol: http, url: 'http://y' }]",
                "interfaces[1].name",
            ),
            ("receivers: { otlp: { http: { max_request_body_size_mib: 0 } } }", "max_request_body_size_mib"),
            ("receivers: { otlp: { http: { max_reading_mib: 19 } } }", "receivers.otlp.http.max_reading_mib"),
            ("receivers: { otlp: { auth: { scoped: [{ clients: [a] }] } } }", "receivers.otlp.auth.scoped[0]"),
            ("receivers: { otlp: { auth: { scoped: [{ token: ' ', clients: [a] }] } } }", "receivers.otlp.auth.scoped[0]"),
            ("admin: { auth: { scoped: [{ token: a, token_file: b }] } }", "admin.auth.scoped[0]: give token or token_file, not both"),
            ("admin: { auth: { scoped: [{ token: a, clients: [] }] } }", "admin.auth.scoped[0].clients"),
            ("admin: { auth: { scoped: [{ token: a, clients: [b, ''] }] } }", "admin.auth.scoped[0].clients"),
            ("receivers: { otlp: { auth: { scoped: [{ token: a, read_only: true }] } } }", "receivers.otlp.auth.scoped[0].read_only"),
            ("receivers: { otlp: { grpc: { max_reading_mib: 3 } } }", "receivers.otlp.grpc.max_reading_mib"),
            ("exporters: { otlp: { endpoint: 'localhost:4317' } }", "exporters.otlp.endpoint"),
            ("exporters: { otlp: { endpoint: 'http://x:1', protocol: thrift } }", "protocol"),
            ("exporters: { otlp: { endpoint: 'http://x:1', on_full: block } }", "on_full"),
            ("exporters: { zipkin: {} }", "zipkin"),
            (
                "exporters: { otlp: { endpoint: 'http://x:1', tls: { ca_file: ca.pem } } }",
                "exporters.otlp.tls",
            ),
            (
                "exporters: { otlp: { endpoint: 'https://x:1', tls: { cert_file: c.pem } } }",
                "exporters.otlp.tls",
            ),
            (
                "exporters: { otlp: { endpoint: 'https://x:1', tls: { insecure: true } } }",
                "insecure",
            ),
            ("alerting: { alertmanager: { url: localhost:9093 } }", "alerting.alertmanager.url"),
            ("alerting: { min_severity: debug }", "min_severity"),
            ("alerting: { resolve_after: 0s }", "alerting.resolve_after"),
        ];
    for text in [
        "receivers: { otlp: { http: { max_reading_mib: 20 } } }",
        "receivers: { otlp: { grpc: { max_reading_mib: 4 } } }",
        "receivers: { otlp: { auth: { scoped: [{ token: a, clients: [b, 'c-*'] }, { token_file: f }] } } }",
        "admin: { auth: { scoped: [{ token: a, read_only: true }] } }",
    ] {
        Config::parse(text).expect(text);
    }
    for (text, key) in cases {
        let err = Config::parse(text).expect_err(text).to_string();
        assert!(
            err.contains(key),
            "{text:?} gave {err:?}, which does not name {key}"
        );
    }
}
