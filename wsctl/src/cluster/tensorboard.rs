//! `wsctl tensorboard pull JOB`: a cluster job's records (TensorBoard event files, `metrics.jsonl`,
//! `summary.json`), which its coordinator writes to the `run` folder of its checkpoint volume, fetched as
//! `wsctl checkpoint pull` fetches checkpoints: from the running MemoryX through a port-forward with the job's
//! identity, or from the claim a deleted, suspended or failed job left through a reader pod. The transfer is
//! [`crate::tensorboard`]'s (bounded, verified, renamed into place). Then `tensorboard --logdir runs`.

use std::path::PathBuf;
use std::time::Duration;

use super::checkpoints::{Source, within_deadline};
use super::{Cluster, Error};

/// `wsctl tensorboard …`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Fetch a job's TensorBoard event files, metrics.jsonl and summary.json, then `tensorboard --logdir runs`.
    Pull {
        #[command(flatten)]
        from: Source,
        /// The folder to write them into (default: runs/JOB, beside the local runs).
        #[arg(short, long, required_unless_present = "name")]
        out: Option<PathBuf>,
        /// Seconds the whole command may take (for a cluster job).
        #[arg(long, default_value = "300")]
        timeout: u64,
    },
}

/// The `--url` form, which needs no cluster: `None` for the cluster form.
pub fn direct(command: &Command) -> Option<anyhow::Result<()>> {
    match command {
        Command::Pull { from: Source { url: Some(url), identity: Some(id), .. }, out: Some(out), .. } => {
            Some(crate::tensorboard::pull_command(url, id, out))
        }
        _ => None,
    }
}

/// Runs the cluster form within its deadline.
pub async fn run(command: Command) -> Result<(), Error> {
    let Command::Pull { from, out, timeout } = command;
    let (name, timeout) = (from.name.clone().unwrap_or_default(), Duration::from_secs(timeout));
    let out = out.unwrap_or_else(|| PathBuf::from("runs").join(&name));
    let cluster = Cluster::connect(from.ns.clone()).await?;
    let ns = cluster.namespace.clone();
    let written = within_deadline(&cluster, &name, timeout, "the records' transfer", async |source| {
        let pulled = crate::tensorboard::pull(&source.base, &source.identity, &out).await;
        pulled.map_err(|e| source.failed(format!("tensorboard pull of {ns}/{name}"), e))
    })
    .await?;
    for path in &written {
        println!("{}", path.display());
    }
    if written.is_empty() {
        eprintln!("wsctl: {ns}/{name} has recorded nothing yet (its first step writes the first records)");
    }
    Ok(())
}
