//! Compiles the kubelet's device-plugin API with `protox`, a protobuf compiler written in Rust, so a fresh
//! machine builds the CS-2 device plugin with cargo alone (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
