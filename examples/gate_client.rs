//! Asks a running refusal-gate, through the Gate API, whether to retry a call that failed:
//! an MCP `tools/call` answered with JSON-RPC -32601 (method not found), then an HTTP POST
//! answered 503. Prints each answer.
//!
//!     cargo run --example gate_client -- [http://127.0.0.1:4317]

use refusal_gate::gate::proto::refusal_gate_client::RefusalGateClient;
use refusal_gate::gate::proto::{Client, DecideRequest, LastResponse, Protocol};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:4317".into());
    let mut gate = RefusalGateClient::connect(endpoint).await?;
    let me = Client {
        service_name: "example-agent".into(),
        service_instance_id: "pod-1".into(),
    };
    let questions = [
        DecideRequest {
            client: Some(me.clone()),
            protocol: Protocol::Mcp as i32,
            url: "http://mcp.test:8080/mcp".into(),
            method: "tools/call".into(),
            tool: "lookup".into(),
            last_response: Some(LastResponse {
                jsonrpc_code: -32601,
                attempt: 1,
                ..Default::default()
            }),
            ..Default::default()
        },
        DecideRequest {
            client: Some(me),
            protocol: Protocol::Http as i32,
            url: "http://api.test/v1/orders".into(),
            http_method: "POST".into(),
            last_response: Some(LastResponse {
                http_status: 503,
                attempt: 1,
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    for q in questions {
        let a = gate.decide(q).await?.into_inner();
        println!(
            "{} ({} / {}): {}{}{}",
            a.decision,
            a.class,
            a.kind,
            a.rule,
            if a.backoff_ms > 0 {
                format!(
                    "; wait {} ms, {} retries left after",
                    a.backoff_ms, a.retries_left
                )
            } else {
                String::new()
            },
            if a.discovery_url.is_empty() {
                String::new()
            } else {
                format!("; read {} first", a.discovery_url)
            },
        );
    }
    Ok(())
}
