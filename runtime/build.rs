//! Compiles the wire protocol with `protox`, a protobuf compiler written in Rust, so a fresh machine builds
//! with cargo alone (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/weightstream/v1alpha1/stage.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // Byte fields as `bytes::Bytes`: a chunk can be a slice of one buffer and handed to several children
    // without copying.
    tonic_prost_build::configure().bytes(".").compile_fds(descriptors)?;
    Ok(())
}
