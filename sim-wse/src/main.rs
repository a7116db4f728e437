//! `sim-wse`: one simulated engine as a program, as it runs in an engine pod. Its arguments are the contract's
//! ([`crds::contract::EngineArgs`]), so whoever starts it renders them from the same type.

use crds::contract::{EngineArgs, RoleArgs};

/// Large buffers in huge pages: see [`runtime::process::HugePages`].
#[global_allocator]
static ALLOCATOR: runtime::process::HugePages = runtime::process::HugePages;

fn main() -> std::process::ExitCode {
    wire::program::exit(sim_wse::node::main(EngineArgs::parse()))
}
