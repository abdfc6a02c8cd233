//! Fuzz target: arbitrary bytes as a discovery document (A2A agent card, OpenAPI 3 in
//! JSON or YAML, MCP server card), with and without the URL it was fetched from. The
//! property: a contract or a clear error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = refusal_gate::discovery::document::parse(data, None);
    let _ = refusal_gate::discovery::document::parse(data, Some("https://agent.test/card.json"));
});
