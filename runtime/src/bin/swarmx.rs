//! `swarmx`: the weightstream swarmx role as a program, as it runs in a pod. Its arguments are the contract's
//! ([`crds::contract::SwarmxArgs`]), so whoever starts it renders them from the same type.

use crds::contract::{RoleArgs, SwarmxArgs};

/// Large buffers in huge pages: see [`runtime::process::HugePages`].
#[global_allocator]
static ALLOCATOR: runtime::process::HugePages = runtime::process::HugePages;

fn main() -> std::process::ExitCode {
    wire::program::exit(runtime::swarmx::node::main(SwarmxArgs::parse()))
}
