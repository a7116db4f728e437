//! Waiting on one job through the API server's watch (no polling loop), always with a deadline: every change
//! of the job is handed to a callback that says whether the wait is over.

use std::time::Duration;

use crds::{Phase, TrainingJob};
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};

use super::{Cluster, Error, progress};

/// Watches job `name` until `seen` returns a result, or fails after `timeout` naming `what`. `seen` gets the job
/// at every change (`None` once it does not exist). Watch errors (a dropped connection, an API server restart)
/// are retried with backoff within the same deadline.
pub async fn until<T>(
    cluster: &Cluster,
    name: &str,
    timeout: Duration,
    what: &str,
    mut seen: impl FnMut(Option<&TrainingJob>) -> Option<Result<T, Error>>,
) -> Result<T, Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let stream = watcher::watch_object(cluster.jobs(), name).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut last: Option<String> = None;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return Err(Error::Timeout { after: timeout, what: what.into(), last }),
            Ok(None) => {
                return Err(Error::Unreachable { action: format!("watch {what}"), message: "the watch ended".into() });
            }
            Ok(Some(Err(e))) => last = Some(format!("watch error: {e}")),
            Ok(Some(Ok(job))) => {
                last = Some(job.as_ref().map_or_else(|| "the job does not exist".into(), progress::line));
                if let Some(done) = seen(job.as_ref()) {
                    return done;
                }
            }
        }
    }
}

/// Whether following job `name` of `namespace` is over, seen as `job`: Ok once it succeeded, its status's reason
/// once it failed, an error once it is gone; `None` while it goes on (a suspended job goes on).
pub fn outcome(job: Option<&TrainingJob>, namespace: &str, name: &str) -> Option<Result<(), Error>> {
    let Some(job) = job else {
        return Some(Err(Error::Deleted { namespace: namespace.into(), name: name.into() }));
    };
    match job.status.as_ref().and_then(|s| s.phase) {
        Some(Phase::Succeeded) => Some(Ok(())),
        Some(Phase::Failed) => Some(Err(Error::JobFailed {
            namespace: namespace.into(),
            name: name.into(),
            message: progress::failure(job),
        })),
        _ => None,
    }
}
