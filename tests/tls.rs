//! TLS on the receivers and the admin endpoint, black-box: certificates made for the test
//! (rcgen), the OpenTelemetry SDK's own OTLP exporters configured for TLS and for mTLS,
//! plain text refused at a TLS port and counted, and certificates replaced on disk picked up
//! without a restart. And TLS on the way out: forwarding to an `https://` next hop (another
//! refusal-gate requiring client certificates) over both protocols.

mod common;

use common::{export, http_span, sdk_export, start, value};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use refusal_gate::app::Bound;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A CA, a server certificate for localhost and 127.0.0.1, and a client certificate, as
/// PEM files in `dir`.
struct Pki {
    ca: String,
    client_cert: String,
    client_key: String,
}

fn pki(dir: &Path) -> Pki {
    std::fs::create_dir_all(dir).expect("a temp dir");
    let ca_key = KeyPair::generate().expect("a key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "refusal-gate test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("a CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("a key");
    let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&server_key, &issuer)
        .expect("a server certificate");
    let client_key = KeyPair::generate().expect("a key");
    let mut client_params = CertificateParams::new(vec!["agent".to_owned()]).expect("params");
    client_params
        .distinguished_name
        .push(DnType::CommonName, "agent");
    let client = client_params
        .signed_by(&client_key, &issuer)
        .expect("a client certificate");
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("written");
    write("ca.pem", &ca_cert.pem());
    write("server.pem", &server.pem());
    write("server.key", &server_key.serialize_pem());
    write("client.pem", &client.pem());
    write("client.key", &client_key.serialize_pem());
    Pki {
        ca: ca_cert.pem(),
        client_cert: client.pem(),
        client_key: client_key.serialize_pem(),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rg-tls-{name}-{}", std::process::id()))
}

fn tls_block(dir: &Path, extra: &str) -> String {
    format!(
        "{{ cert_file: {0}/server.pem, key_file: {0}/server.key{extra} }}",
        dir.display()
    )
}

fn grpc_exporter(bound: &Bound, tls: ClientTlsConfig) -> opentelemetry_otlp::SpanExporter {
    opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("https://127.0.0.1:{}", bound.grpc.port()))
        .with_tls_config(tls)
        .with_timeout(Duration::from_secs(5))
        .build()
        .expect("the exporter builds")
}

/// A client that trusts `ca` and reaches the server as `localhost`.
fn https_client(ca: &str, bound: &Bound) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("a CA"))
        .resolve("localhost", bound.http)
        .build()
        .expect("a client")
}

async fn scrape_tls(client: &reqwest::Client, bound: &Bound) -> String {
    client
        .get(format!("https://localhost:{}/metrics", bound.admin.port()))
        .send()
        .await
        .expect("the admin endpoint answers over TLS")
        .text()
        .await
        .expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_exporters_send_over_tls_and_plain_text_is_refused() {
    let dir = temp_dir("roundtrip");
    let pki = pki(&dir);
    let tls = tls_block(&dir, "");
    let server = start(&format!(
        "
receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:0, tls: {tls} }}
    http: {{ endpoint: 127.0.0.1:0, tls: {tls} }}
admin:
  endpoint: 127.0.0.1:0
  tls: {tls}
"
    ))
    .await;
    let b = server.bound;

    let grpc_tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    assert!(sdk_export(grpc_exporter(&b, grpc_tls), "tls-grpc").await);

    // OTLP/HTTP over TLS. (The SDK's HTTP exporter is built on reqwest 0.13, whose TLS
    // needs another crypto provider; the gRPC one above is the SDK's TLS round trip.)
    let response = https_client(&pki.ca, &b)
        .post(format!("https://localhost:{}/v1/traces", b.http.port()))
        .header("content-type", "application/x-protobuf")
        .body(export(
            "tls-http",
            vec![http_span(1, "GET", "http://api.test/x", 200)],
        ))
        .send()
        .await
        .expect("answers over TLS");
    assert_eq!(response.status(), 200);

    // Plain text at a TLS port: no answer, and a counted handshake failure.
    let plain = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", b.http))
        .header("content-type", "application/x-protobuf")
        .body(export(
            "plain",
            vec![http_span(1, "GET", "http://a.test/", 200)],
        ))
        .send()
        .await;
    assert!(plain.is_err() || !plain.expect("answered").status().is_success());

    let m = scrape_tls(&https_client(&pki.ca, &b), &b).await;
    for (transport, client) in [("grpc", "tls-grpc"), ("http", "tls-http")] {
        assert_eq!(
            value(
                &m,
                "refusal_gate_receiver_accepted_spans_total",
                &[("transport", transport)]
            ),
            1.0,
            "{transport}"
        );
        assert_eq!(
            value(&m, "refusal_gate_attempts_total", &[("client", client)]),
            1.0
        );
    }
    assert!(
        value(
            &m,
            "refusal_gate_tls_handshake_failures_total",
            &[("listener", "http")]
        ) >= 1.0
    );
    server.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_admits_only_clients_with_a_certificate_from_the_ca() {
    let dir = temp_dir("mtls");
    let pki = pki(&dir);
    let tls = tls_block(&dir, &format!(", client_ca_file: {}/ca.pem", dir.display()));
    let server = start(&format!(
        "
receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:0, tls: {tls} }}
    http: {{ endpoint: 127.0.0.1:0 }}
admin:
  endpoint: 127.0.0.1:0
"
    ))
    .await;
    let b = server.bound;
    let base = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    let with_identity = base
        .clone()
        .identity(Identity::from_pem(&pki.client_cert, &pki.client_key));
    assert!(sdk_export(grpc_exporter(&b, with_identity), "mtls-agent").await);
    sdk_export(grpc_exporter(&b, base), "anonymous").await;

    let m = common::scrape(&b).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "mtls-agent")]
        ),
        1.0
    );
    assert!(!m.contains("anonymous"), "no certificate, no entry");
    assert!(
        value(
            &m,
            "refusal_gate_tls_handshake_failures_total",
            &[("listener", "grpc")]
        ) >= 1.0
    );
    server.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificates_are_picked_up_without_a_restart() {
    let dir = temp_dir("reload");
    let old = pki(&dir);
    let tls = tls_block(&dir, ", reload_interval: 1s");
    let server = start(&format!(
        "
receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:0 }}
    http: {{ endpoint: 127.0.0.1:0, tls: {tls} }}
admin:
  endpoint: 127.0.0.1:0
"
    ))
    .await;
    let b = server.bound;
    let post = |client: reqwest::Client| async move {
        client
            .post(format!("https://localhost:{}/v1/traces", b.http.port()))
            .header("content-type", "application/x-protobuf")
            .body(export(
                "r",
                vec![http_span(1, "GET", "http://a.test/", 200)],
            ))
            .send()
            .await
            .map(|r| r.status().as_u16())
    };
    assert_eq!(post(https_client(&old.ca, &b)).await.ok(), Some(200));

    // A new CA and server certificate replace the files (as cert-manager rotates them).
    let new = pki(&dir);
    assert!(
        post(https_client(&new.ca, &b)).await.is_err(),
        "until the files are checked again, the old certificate is served"
    );
    let mut served_new = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if post(https_client(&new.ca, &b)).await.ok() == Some(200) {
            served_new = true;
            break;
        }
    }
    assert!(
        served_new,
        "the new certificate is served without a restart"
    );
    assert!(
        post(https_client(&old.ca, &b)).await.is_err(),
        "and the old one no longer"
    );
    server.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// Waits until `name{labels}` reaches at least `at_least` in `bound`'s metrics; its value.
async fn wait_for(bound: &Bound, name: &str, labels: &[(&str, &str)], at_least: f64) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let v = value(&common::scrape(bound).await, name, labels);
        if v >= at_least || std::time::Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_reaches_an_https_next_hop_with_its_ca_and_a_client_certificate() {
    let dir = temp_dir("forward");
    pki(&dir);
    let d = dir.display();
    let tls = tls_block(&dir, &format!(", client_ca_file: {d}/ca.pem"));
    let next = start(&format!(
        "
receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:0, tls: {tls} }}
    http: {{ endpoint: 127.0.0.1:0, tls: {tls} }}
admin:
  endpoint: 127.0.0.1:0
"
    ))
    .await;
    let nb = next.bound;
    let gate = |protocol: &str, port: u16, tls: &str| {
        format!(
            "
receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:0 }}
    http: {{ endpoint: 127.0.0.1:0 }}
admin:
  endpoint: 127.0.0.1:0
exporters:
  otlp: {{ endpoint: 'https://127.0.0.1:{port}', protocol: {protocol}, batch_interval: 50ms{tls} }}
"
        )
    };
    let with_files = format!(
        ", tls: {{ ca_file: {d}/ca.pem, cert_file: {d}/client.pem, key_file: {d}/client.key }}"
    );
    let mut delivered = 0.0;
    for (protocol, port) in [("grpc", nb.grpc.port()), ("http/protobuf", nb.http.port())] {
        let first = start(&gate(protocol, port, &with_files)).await;
        common::send(
            &first.bound,
            export(
                &format!("via-{protocol}"),
                vec![http_span(1, "GET", "http://api.test/x", 200)],
            ),
        )
        .await;
        let sent = wait_for(
            &first.bound,
            "refusal_gate_exporter_sent_spans_total",
            &[],
            1.0,
        )
        .await;
        assert_eq!(sent, 1.0, "{protocol}: forwarded and accepted over TLS");
        delivered += 1.0;
        let received = wait_for(
            &nb,
            "refusal_gate_receiver_accepted_spans_total",
            &[],
            delivered,
        )
        .await;
        assert_eq!(received, delivered, "{protocol}: the next hop has it");
        first.shutdown().await;
    }

    // The built-in roots do not know the test's CA: nothing is delivered, and each failed
    // try is counted as retried.
    for (protocol, port) in [("grpc", nb.grpc.port()), ("http/protobuf", nb.http.port())] {
        let first = start(&gate(protocol, port, "")).await;
        common::send(
            &first.bound,
            export(
                "untrusted",
                vec![http_span(1, "GET", "http://api.test/x", 200)],
            ),
        )
        .await;
        let retried = wait_for(
            &first.bound,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "retried")],
            1.0,
        )
        .await;
        assert!(retried >= 1.0, "{protocol}: an unknown CA fails the send");
        let m = common::scrape(&first.bound).await;
        assert_eq!(
            value(&m, "refusal_gate_exporter_sent_spans_total", &[]),
            0.0,
            "{protocol}"
        );
        first.shutdown().await;
    }
    assert_eq!(
        value(
            &common::scrape(&nb).await,
            "refusal_gate_receiver_accepted_spans_total",
            &[]
        ),
        delivered
    );
    next.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}
