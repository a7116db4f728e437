//! `wsctl submit`: a manifest checked by the same code the operator uses (one source of truth, so a bad
//! manifest gets one clear error before anything is sent), created on the cluster, and with `--watch` followed
//! to its end through its status.

use std::path::Path;
use std::time::Duration;

use crds::TrainingJob;
use kube::ResourceExt;
use kube::api::PostParams;

use super::progress::Reporter;
use super::{Cluster, Error, Namespace, watch};

/// Reads and validates the manifest, refusing a namespace in it that contradicts `--namespace` (as kubectl
/// does: the same manifest must not land somewhere the user did not expect).
pub fn load(path: &Path, flag: Option<&str>) -> Result<TrainingJob, Error> {
    let manifest = |message: String| Error::Manifest { label: crate::manifest::label(path), message };
    let text = crate::manifest::read(path).map_err(|e| manifest(format!("cannot read it: {e}")))?;
    let mut job = crds::parse_training_job(&text).map_err(|e| manifest(e.to_string()))?;
    if job.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(manifest("metadata.name is missing: every TrainingJob needs a name".into()));
    }
    if let (Some(flag), Some(own)) = (flag, job.metadata.namespace.as_deref())
        && flag != own
    {
        return Err(manifest(format!("its metadata.namespace is {own} but --namespace says {flag}: drop one of them")));
    }
    // What the server assigns is not the user's to send.
    (job.metadata.uid, job.metadata.resource_version, job.status) = (None, None, None);
    Ok(job)
}

/// `wsctl submit JOB.yaml [--watch]`.
pub async fn submit(path: &Path, mut ns: Namespace, follow: bool, timeout: Duration) -> Result<(), Error> {
    let job = load(path, ns.namespace.as_deref())?;
    if ns.namespace.is_none() {
        ns.namespace.clone_from(&job.metadata.namespace);
    }
    let cluster = Cluster::connect(ns).await?;
    let name = job.name_any();
    let action = format!("create TrainingJob {}/{name}", cluster.namespace);
    cluster.jobs().create(&PostParams::default(), &job).await.map_err(Error::api(action, &cluster.namespace, &name))?;
    println!("trainingjob {}/{name} created", cluster.namespace);
    if follow { follow_to_end(&cluster, &name, timeout).await } else { Ok(()) }
}

/// Shows the job's progress until it succeeds (Ok) or fails (its status's message), within `timeout`.
pub async fn follow_to_end(cluster: &Cluster, name: &str, timeout: Duration) -> Result<(), Error> {
    let mut reporter = Reporter::new();
    let mut last: Option<TrainingJob> = None;
    let what = format!("TrainingJob {}/{name} to finish", cluster.namespace);
    let ns = cluster.namespace.clone();
    let result = watch::until(cluster, name, timeout, &what, |job| {
        if let Some(job) = job {
            reporter.show(job);
            last = Some(job.clone());
        }
        watch::outcome(job, &ns, name)
    })
    .await;
    reporter.finish(last.as_ref());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("wsctl-submit-{}-{name}.yaml", std::process::id()));
        if let Err(e) = std::fs::write(&path, text) {
            panic!("{}: {e}", path.display());
        }
        path
    }

    #[test]
    fn a_valid_manifest_loads_without_server_fields() {
        let path = write("ok", crds::testing::MLP_YAML);
        let job = load(&path, Some("ml")).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!((job.name_any(), job.status.is_none()), ("small".to_string(), true));
    }

    #[test]
    fn an_invalid_manifest_is_one_error_naming_the_file() {
        let path = write("bad", &crds::testing::MLP_YAML.replace("batchSize: 64", "batchSize: 63"));
        let e = load(&path, None).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(e.starts_with(&path.display().to_string()) && e.contains("batchSize"), "{e}");
        assert!(e.ends_with("(nothing was sent to the cluster)"), "{e}");
        let path = write("ns", &crds::testing::MLP_YAML.replace("{name: small}", "{name: small, namespace: a}"));
        let e = load(&path, Some("b")).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(e.contains("metadata.namespace is a but --namespace says b"), "{e}");
    }
}
