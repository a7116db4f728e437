//! `swarmx`: one SwarmX node of the fabric, as a program, as it runs in a pod.

use clap::Parser;

/// The weightstream swarmx role.
#[derive(Parser)]
#[command(name = "swarmx", version, about)]
struct Cli {
    #[command(flatten)]
    args: runtime::swarmx::node::Args,
}

fn main() -> std::process::ExitCode {
    match runtime::swarmx::node::main(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
