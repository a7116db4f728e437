//! `memoryx`: MemoryX, the weight store and coordinator, as a program, as it runs in a pod.

use clap::Parser;

/// The weightstream memoryx role.
#[derive(Parser)]
#[command(name = "memoryx", version, about)]
struct Cli {
    #[command(flatten)]
    args: runtime::memoryx::node::Args,
}

fn main() -> std::process::ExitCode {
    match runtime::memoryx::node::main(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
