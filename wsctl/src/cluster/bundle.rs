//! `wsctl logs export JOB -o FILE.tar.gz`: everything there is to know about a job after the fact, in one file
//! to attach to a ticket: the job (spec, status, plan), every pod's log (the previous container's too), the
//! Events, the post-mortems the operator kept (`crds::contract::postmortem`: the end of each pod's log, the
//! reason and the pod and line that failed it, which outlive the pods and the job), and the run's records
//! (`metrics.jsonl`, `summary.json`, TensorBoard event files, fetched as `wsctl tensorboard pull` fetches them).
//! It works on a running, failed or deleted job; what could not be had is said in the bundle's `bundle.txt`.
//! Every part is bounded before it is read, and the whole within [`MAX_BUNDLE_BYTES`] before compression.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crds::contract::JOB_LABEL;
use crds::contract::postmortem::{POSTMORTEM_LABEL, event_line, restarted};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams};

use super::checkpoints::within_deadline;
use super::logs::natural;
use super::{Cluster, Error, Namespace};

/// Most bytes of one pod's log kept (its end).
pub const MAX_LOG_BYTES: usize = 4 << 20;
/// Most bytes of the whole bundle before compression; what does not fit is named in `bundle.txt`.
pub const MAX_BUNDLE_BYTES: usize = 512 << 20;
/// Lines of each log asked for (then cut to [`MAX_LOG_BYTES`]).
const LOG_LINES: i64 = 100_000;

/// `wsctl logs …` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a post-mortem bundle of a job (running, failed or deleted) to a .tar.gz: its spec and status,
    /// every pod's log (previous containers too), its Events, the post-mortems the operator kept, and the run's
    /// records (metrics.jsonl, summary.json, TensorBoard files); at most 512 MiB before compression.
    Export {
        /// The job.
        job: String,
        #[command(flatten)]
        ns: Namespace,
        /// The file to write (default: JOB-postmortem.tar.gz).
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// Seconds the whole command may take.
        #[arg(long, default_value = "300")]
        timeout: u64,
    },
}

/// The files of the bundle, in order, with what could not be had.
#[derive(Default)]
pub struct Bundle {
    files: Vec<(String, Vec<u8>)>,
    missing: Vec<String>,
    left_out: Vec<String>,
    bytes: usize,
}

impl Bundle {
    /// Adds `path` with `bytes`, unless the bundle would pass [`MAX_BUNDLE_BYTES`] (then it is named as left out).
    pub fn add(&mut self, path: String, bytes: Vec<u8>) {
        if self.bytes + bytes.len() > MAX_BUNDLE_BYTES {
            self.left_out.push(format!("{path} ({} bytes)", bytes.len()));
            return;
        }
        self.bytes += bytes.len();
        self.files.push((path, bytes));
    }

    /// Notes a part that could not be had, and why.
    pub fn missing(&mut self, what: String) {
        self.missing.push(what);
    }

    /// `bundle.txt`: what the bundle holds and lacks.
    pub fn index(&self, job: &str, ns: &str) -> String {
        let mut text = format!(
            "Post-mortem bundle of TrainingJob {ns}/{job}, written by wsctl {} ({} files, {} bytes before \
             compression; at most {} MiB).\n\nFiles:\n",
            env!("CARGO_PKG_VERSION"),
            self.files.len(),
            self.bytes,
            MAX_BUNDLE_BYTES >> 20
        );
        for (path, bytes) in &self.files {
            text.push_str(&format!("  {path} ({} bytes)\n", bytes.len()));
        }
        for (title, list) in [("Not available", &self.missing), ("Left out (over the bound)", &self.left_out)] {
            if !list.is_empty() {
                text.push_str(&format!("\n{title}:\n"));
                list.iter().for_each(|m| text.push_str(&format!("  {m}\n")));
            }
        }
        text
    }

    /// Writes the bundle as a .tar.gz to `out`: to a temporary file beside it, renamed into place once complete.
    pub fn write(&self, out: &Path, index: String) -> std::io::Result<u64> {
        let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.{}.part", std::process::id()));
        let written = (|| {
            let file = std::fs::File::create(&tmp)?;
            let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::default()));
            let index = index.into_bytes();
            for (path, bytes) in
                std::iter::once(("bundle.txt", &index)).chain(self.files.iter().map(|(p, b)| (p.as_str(), b)))
            {
                let mut header = tar::Header::new_gnu();
                header.set_size(bytes.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                tar.append_data(&mut header, path, &bytes[..])?;
            }
            let mut gz = tar.into_inner()?;
            gz.flush()?;
            let file = gz.finish()?;
            file.sync_all()?;
            std::fs::rename(&tmp, out)?;
            std::fs::metadata(out).map(|m| m.len())
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// The end of `text` within [`MAX_LOG_BYTES`].
fn log_end(text: String) -> Vec<u8> {
    let cut = text.len().saturating_sub(MAX_LOG_BYTES);
    let start = (cut..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    text.into_bytes().split_off(start)
}

/// `wsctl logs export JOB [-o FILE]`: gathers within `timeout` and writes the bundle.
pub async fn export(command: Command) -> Result<(), Error> {
    let Command::Export { job, ns, out, timeout } = command;
    let out = out.unwrap_or_else(|| PathBuf::from(format!("{job}-postmortem.tar.gz")));
    let cluster = Cluster::connect(ns).await?;
    let timeout = Duration::from_secs(timeout);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bundle = Bundle::default();
    let gathered = tokio::time::timeout(timeout, gather(&cluster, &job, &mut bundle)).await;
    gathered.map_err(|_| Error::Timeout {
        after: timeout,
        what: format!("the post-mortem of {job}"),
        last: None,
    })??;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now()).max(Duration::from_secs(30));
    records(&cluster, &job, left, &mut bundle).await;
    let index = bundle.index(&job, &cluster.namespace);
    let bytes = bundle.write(&out, index).map_err(Error::io("writing the bundle"))?;
    println!("{} ({bytes} bytes, {} files)", out.display(), bundle.files.len() + 1);
    for m in &bundle.missing {
        eprintln!("wsctl: not in the bundle: {m}");
    }
    Ok(())
}

/// The job, its pods' logs, its Events and its post-mortems.
async fn gather(cluster: &Cluster, job: &str, bundle: &mut Bundle) -> Result<(), Error> {
    let ns = &cluster.namespace;
    let action = format!("read TrainingJob {ns}/{job}");
    let found = cluster.jobs().get_opt(job).await.map_err(Error::api(action, ns, job))?;
    let postmortems = postmortems(cluster, job).await?;
    match &found {
        Some(j) => {
            let mut j = j.clone();
            j.metadata.managed_fields = None;
            let yaml = serde_yaml::to_string(&j).unwrap_or_default();
            bundle.add("job.yaml".into(), yaml.into_bytes());
        }
        None if postmortems.is_empty() => {
            return Err(Error::Invalid(format!(
                "no TrainingJob {job} in namespace {ns}, and no post-mortem left by a deleted one (label \
                 {POSTMORTEM_LABEL}={job}): `wsctl get -n {ns}` lists the jobs"
            )));
        }
        None => {
            bundle.missing(format!("job.yaml: TrainingJob {ns}/{job} is deleted; its post-mortem holds its status"))
        }
    }
    for cm in &postmortems {
        let uid = cm.labels().get(crds::contract::JOB_UID_LABEL).cloned().unwrap_or_default();
        for (key, value) in cm.data.clone().unwrap_or_default() {
            bundle.add(format!("postmortem/{uid}/{key}"), value.into_bytes());
        }
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let selector = format!("{JOB_LABEL}={job}");
    let action = format!("list the pods of {ns}/{job}");
    let mut list = pods.list(&ListParams::default().labels(&selector)).await.map_err(Error::other(action))?.items;
    list.sort_by(|a, b| natural(&a.name_any(), &b.name_any()));
    if list.is_empty() {
        bundle.missing("logs/: the job has no pods now (the post-mortem holds the end of their logs)".into());
    }
    for pod in &list {
        pod_logs(&pods, pod, bundle).await;
    }
    bundle.add("events.txt".into(), events(cluster, job, &list).await.into_bytes());
    Ok(())
}

/// The job's post-mortems, newest first.
async fn postmortems(cluster: &Cluster, job: &str) -> Result<Vec<ConfigMap>, Error> {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let selector = format!("{POSTMORTEM_LABEL}={job}");
    let action = format!("list the post-mortems of {}/{job}", cluster.namespace);
    let mut found = api.list(&ListParams::default().labels(&selector)).await.map_err(Error::other(action))?.items;
    found.sort_by(|a, b| b.creation_timestamp().map(|t| t.0).cmp(&a.creation_timestamp().map(|t| t.0)));
    Ok(found)
}

/// A pod's log, and its previous container's if it restarted.
async fn pod_logs(pods: &Api<Pod>, pod: &Pod, bundle: &mut Bundle) {
    let name = pod.name_any();
    let restarted = restarted(pod);
    for previous in [false, true].into_iter().filter(|&p| !p || restarted) {
        let params = LogParams {
            tail_lines: Some(LOG_LINES),
            limit_bytes: Some(4 * MAX_LOG_BYTES as i64),
            previous,
            ..LogParams::default()
        };
        let path = format!("logs/{name}{}.log", if previous { ".previous" } else { "" });
        match pods.logs(&name, &params).await {
            Ok(text) => bundle.add(path, log_end(text)),
            Err(e) => bundle.missing(format!("{path}: {e}")),
        }
    }
}

/// The Events of the job and its objects, oldest first, one a line.
async fn events(cluster: &Cluster, job: &str, pods: &[Pod]) -> String {
    match super::events::of_job(cluster, job, pods, 5000).await {
        Ok(all) => all.into_iter().map(|e| event_line(e) + "\n").collect(),
        Err(e) => format!("(the Events could not be read: {e})\n"),
    }
}

/// The run's records, from the live MemoryX or the claim a stopped or deleted job left.
async fn records(cluster: &Cluster, job: &str, timeout: Duration, bundle: &mut Bundle) {
    let dir = std::env::temp_dir().join(format!("wsctl-bundle-{}-{job}", std::process::id()));
    let pulled = within_deadline(cluster, job, timeout, "the run's records", async |source| {
        let pulled = crate::tensorboard::pull(&source.base, &source.identity, &dir).await;
        pulled.map_err(|e| source.failed(format!("the records of {job}"), e))
    })
    .await;
    match pulled {
        Ok(files) if files.is_empty() => bundle.missing("run/: the job recorded nothing (no step ran)".into()),
        Ok(files) => {
            for path in files {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                match std::fs::read(&path) {
                    Ok(bytes) => bundle.add(format!("run/{name}"), bytes),
                    Err(e) => bundle.missing(format!("run/{name}: {e}")),
                }
            }
        }
        Err(e) => bundle.missing(format!("run/: {e}")),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bundle is a .tar.gz with bundle.txt first; over the bound a file is named, not kept; a log keeps its end.
    #[test]
    fn the_bundle_is_a_tar_gz_within_its_bound() {
        let mut b = Bundle::default();
        b.add("logs/a.log".into(), b"hello\n".to_vec());
        b.add("big".into(), vec![0; MAX_BUNDLE_BYTES]);
        b.missing("run/: no claim".into());
        let index = b.index("j", "ml");
        assert!(index.contains("logs/a.log (6 bytes)") && index.contains("big (") && index.contains("run/: no claim"));
        let out = std::env::temp_dir().join(format!("ws-bundle-test-{}.tar.gz", std::process::id()));
        b.write(&out, index).unwrap();
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap());
        let names: Vec<String> = tar::Archive::new(gz)
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["bundle.txt", "logs/a.log"]);
        std::fs::remove_file(&out).unwrap();
        let long = "x".repeat(MAX_LOG_BYTES + 10);
        assert_eq!(log_end(long).len(), MAX_LOG_BYTES);
    }
}
