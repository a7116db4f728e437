//! Compiles the wire protocol with `protox`, a protobuf compiler written in Rust, so a fresh machine builds
//! with cargo alone (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/weightstream/v1alpha1/stage.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
