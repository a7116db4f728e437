//! `sim-wse`: one simulated engine as a program, as it runs in an engine pod.

use clap::Parser;

/// A simulated wafer-scale engine serving the weightstream Stage protocol.
#[derive(Parser)]
#[command(name = "sim-wse", version, about)]
struct Cli {
    #[command(flatten)]
    args: sim_wse::node::Args,
}

fn main() -> std::process::ExitCode {
    match sim_wse::node::main(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
