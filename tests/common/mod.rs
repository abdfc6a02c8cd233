//! Test fixtures shared by the black-box tests: a real server on free loopback ports, a
//! scrape of its `/metrics`, and builders for spans sent by the OpenTelemetry SDK.
#![allow(dead_code)]

use refusal_gate::app::{Bound, Server};
use refusal_gate::config::Config;
use std::collections::BTreeMap;

/// The interfaces most tests use, on top of port-0 listeners.
pub const CONFIG: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0, max_request_body_size_mib: 1 }
admin:
  endpoint: 127.0.0.1:0
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
tracker:
  probe_window: 3s
";

/// Starts a server in this process on free ports.
pub async fn start(config: &str) -> Server {
    let config = Config::parse(config).expect("the test configuration is valid");
    Server::start(&config).await.expect("the server starts")
}

/// The text of `/metrics`.
pub async fn scrape(bound: &Bound) -> String {
    let response = reqwest::get(format!("http://{}/metrics", bound.admin))
        .await
        .expect("the admin endpoint answers");
    assert_eq!(response.status(), 200);
    response.text().await.expect("a text body")
}

/// Parses one exposition line into (name, labels, value).
fn parse_line(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.trim_end_matches('}')),
        None => (series, ""),
    };
    let mut map = BTreeMap::new();
    for pair in labels.split("\",").filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=')?;
        map.insert(k.to_owned(), v.trim_matches('"').to_owned());
    }
    Some((name, map, value))
}

/// The sum of the series of `name` whose labels include all of `labels`.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(parse_line)
        .filter(|(n, ls, _)| {
            *n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// Whether any series of `name` exists.
pub fn has_metric(text: &str, name: &str) -> bool {
    text.lines()
        .filter_map(parse_line)
        .any(|(n, _, _)| n == name)
}
