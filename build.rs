//! Generates the Gate API (`proto/refusal_gate/v1/gate.proto`) with tonic and prost. The
//! .proto is compiled by protox, a protobuf compiler written in Rust, so building needs no
//! `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/refusal_gate/v1/gate.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The HTTP mirror streams alerts as JSON.
        .type_attribute(
            "refusal_gate.v1.Alert",
            "#[derive(serde::Serialize)] #[serde(rename_all = \"camelCase\")]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
