//! `wsctl checkpoint list|pull`: a running job's checkpoints, fetched from its MemoryX through the API server
//! (a [`Forward`] to MemoryX's HTTP port) over HTTPS with mutual TLS, presenting the job's own identity from
//! the Secret the operator made for it: MemoryX trusts that job's CA and nothing else, so reading the Secret
//! (RBAC on the namespace) is what grants access.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crds::contract::{HTTP_PORT, Role};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use runtime::identity::{CA_CERT, CERT, Identity, KEY};

use super::portforward::Forward;
use super::{Cluster, Error, JOB_LABEL, Namespace, ROLE_LABEL, progress};

/// `wsctl checkpoint …`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// The job's checkpoints on MemoryX's volume, newest first.
    List {
        /// The job.
        job: String,
        #[command(flatten)]
        ns: Namespace,
        /// Seconds the whole command may take.
        #[arg(long, default_value = "120")]
        timeout: u64,
    },
    /// Download a checkpoint (the newest, or the one of --step) into a folder, verified before it is kept.
    Pull {
        /// The job.
        job: String,
        #[command(flatten)]
        ns: Namespace,
        /// The step of the checkpoint (default: the newest).
        #[arg(long)]
        step: Option<u64>,
        /// The folder to write it into (created if missing).
        #[arg(short = 'o', long, default_value = ".")]
        out: PathBuf,
        /// Seconds the whole command may take.
        #[arg(long, default_value = "600")]
        timeout: u64,
    },
}

/// One checkpoint file as MemoryX lists it (`GET /checkpoints`).
#[derive(serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The optimizer step it holds.
    pub step: u64,
    /// Its file name on the volume.
    pub file: String,
    /// Its size.
    pub bytes: u64,
}

/// Runs a checkpoint command within its deadline.
pub async fn run(command: Command) -> Result<(), Error> {
    let (ns, timeout) = match &command {
        Command::List { ns, timeout, .. } | Command::Pull { ns, timeout, .. } => (ns.clone(), Duration::from_secs(*timeout)),
    };
    let cluster = Cluster::connect(ns).await?;
    let work = async {
        match &command {
            Command::List { job, .. } => {
                let (_forward, base, identity) = connect(&cluster, job).await?;
                print!("{}", table(&list(&base, &identity).await?));
                Ok(())
            }
            Command::Pull { job, step, out, .. } => {
                let (forward, base, identity) = connect(&cluster, job).await?;
                let pulled = pull(&base, &identity, *step, out).await.map_err(|e| explain(e, &forward))?;
                println!("{}", pulled.display());
                Ok(())
            }
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(Error::Timeout { after: timeout, what: "the checkpoint transfer".into(), last: None }))
}

/// The checkpoints as a table.
pub fn table(entries: &[Entry]) -> String {
    let mut out = format!("{:>10}   {:>12}   FILE\n", "STEP", "SIZE");
    for e in entries {
        out.push_str(&format!("{:>10}   {:>12}   {}\n", e.step, runtime::units::bytes(e.bytes), e.file));
    }
    out
}

/// Adds the port-forward's own failure (RBAC, a pod gone) to a transfer error, which alone would only say the
/// connection closed.
fn explain(e: Error, forward: &Forward) -> Error {
    match (e, forward.failure()) {
        (Error::Checkpoint { what, message }, Some(why)) => Error::Checkpoint { what, message: format!("{message} ({why})") },
        (e, _) => e,
    }
}

/// The job's running MemoryX pod, its identity, and a local forward to MemoryX's HTTP port: the base URL to
/// call (`https://127.0.0.1:PORT`; the job's certificate names 127.0.0.1 besides `job.weightstream.internal`).
async fn connect(cluster: &Cluster, name: &str) -> Result<(Forward, String, Identity), Error> {
    let ns = &cluster.namespace;
    let job = cluster.job(name).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let selector = format!("{JOB_LABEL}={name},{ROLE_LABEL}={}", Role::Memoryx);
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::other(format!("list the MemoryX pod of {ns}/{name}")))?;
    let pod = list
        .items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "TrainingJob {ns}/{name} ({}) has no running MemoryX pod: its checkpoints are served by MemoryX while the \
                 job holds its CS-2s (a finished or suspended job's MemoryX is scaled to zero)",
                progress::phase(&job)
            ))
        })?;
    let identity = identity(cluster, name).await?;
    let forward = Forward::start(pods, &pod, HTTP_PORT).await?;
    let base = format!("https://{}", forward.addr);
    Ok((forward, base, identity))
}

/// The job's identity from the Secret `<job>-identity` the operator created.
async fn identity(cluster: &Cluster, job: &str) -> Result<Identity, Error> {
    let name = format!("{job}-identity");
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let action = format!("read the job's identity Secret {}/{name} (MemoryX accepts only the job's certificate)", cluster.namespace);
    let secret = secrets.get(&name).await.map_err(Error::other(action))?;
    let file = |key: &str| -> Result<String, Error> {
        let bytes = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone()).unwrap_or_default();
        String::from_utf8(bytes)
            .ok()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::Invalid(format!("Secret {}/{name} has no PEM text under {key}", cluster.namespace)))
    };
    Ok(Identity::from_pem(&file(CA_CERT)?, &file(CERT)?, &file(KEY)?))
}

fn http_client(identity: &Identity) -> Result<reqwest::Client, Error> {
    let bad = |message: String| Error::Checkpoint { what: "client".into(), message };
    let tls = identity.client_config().map_err(|e| bad(e.to_string()))?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .https_only(true)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// `GET /checkpoints`: the files MemoryX has, newest first.
pub async fn list(base: &str, identity: &Identity) -> Result<Vec<Entry>, Error> {
    let url = format!("{base}/checkpoints");
    let failed = |message: String| Error::Checkpoint { what: format!("list ({url})"), message };
    let resp = http_client(identity)?.get(&url).send().await.map_err(|e| failed(format!("{e:#}")))?;
    let resp = resp.error_for_status().map_err(|e| failed(e.to_string()))?;
    let mut entries: Vec<Entry> = resp.json().await.map_err(|e| failed(e.to_string()))?;
    entries.sort_by(|a, b| b.step.cmp(&a.step));
    Ok(entries)
}

/// Downloads the checkpoint of `step` (else the newest) into `out`: written beside its final name, checked
/// (its size as listed, its checksum and step as the runtime reads checkpoints), then renamed, so `out` never
/// holds a partial or corrupt file under a checkpoint's name.
pub async fn pull(base: &str, identity: &Identity, step: Option<u64>, out: &Path) -> Result<PathBuf, Error> {
    let entries = list(base, identity).await?;
    let entry = match step {
        Some(s) => entries.iter().find(|e| e.step == s),
        None => entries.first(),
    };
    let Some(entry) = entry.cloned() else {
        let have: Vec<String> = entries.iter().map(|e| e.step.to_string()).collect();
        return Err(Error::Invalid(match step {
            Some(s) => format!("no checkpoint at step {s}; there are checkpoints at steps [{}]", have.join(", ")),
            None => "the job has no checkpoint yet (spec.checkpoint.intervalSteps sets how often it writes one)".into(),
        }));
    };
    if entry.file.contains('/') || entry.file.starts_with('.') {
        return Err(Error::Checkpoint { what: "list".into(), message: format!("MemoryX named a file {:?}", entry.file) });
    }
    std::fs::create_dir_all(out).map_err(Error::io(format!("creating {}", out.display())))?;
    let url = format!("{base}/checkpoints/{}", entry.file);
    let failed = |message: String| Error::Checkpoint { what: format!("download ({url})"), message };
    let mut resp = http_client(identity)?.get(&url).send().await.map_err(|e| failed(format!("{e:#}")))?;
    resp = resp.error_for_status().map_err(|e| failed(e.to_string()))?;
    let partial = out.join(format!(".{}.partial", entry.file));
    let dest = out.join(&entry.file);
    let mut file = std::fs::File::create(&partial).map_err(Error::io(format!("creating {}", partial.display())))?;
    let mut written = 0u64;
    let result: Result<(), Error> = async {
        while let Some(chunk) = resp.chunk().await.map_err(|e| failed(e.to_string()))? {
            written += chunk.len() as u64;
            if written > entry.bytes {
                return Err(failed(format!("more than the {} bytes listed", entry.bytes)));
            }
            std::io::Write::write_all(&mut file, &chunk).map_err(Error::io(format!("writing {}", partial.display())))?;
        }
        if written != entry.bytes {
            return Err(failed(format!("{written} bytes received of the {} listed", entry.bytes)));
        }
        file.sync_all().map_err(Error::io(format!("writing {}", partial.display())))?;
        let (at, _) = runtime::memoryx::checkpoint::read(&partial, entry.bytes)
            .map_err(|e| Error::Checkpoint { what: "verify".into(), message: e.to_string() })?;
        if at != entry.step {
            return Err(failed(format!("the file holds step {at}, not the {} listed", entry.step)));
        }
        std::fs::rename(&partial, &dest).map_err(Error::io(format!("renaming to {}", dest.display())))
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result.map(|()| dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_a_table_of_steps_sizes_and_files() {
        let e = Entry { step: 20, file: "step-00000020.safetensors".into(), bytes: 2048 };
        let t = table(&[e]);
        assert_eq!(t.lines().count(), 2);
        assert!(t.lines().nth(1).is_some_and(|l| l.trim_start().starts_with("20 ") && l.ends_with("step-00000020.safetensors")), "{t}");
    }
}
