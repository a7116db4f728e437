//! `wsctl logs`: the logs of a job's pods, found by the labels the operator puts on them (job and role), so
//! the user names the job and the role rather than pod names.

use std::cmp::Ordering;
use std::io::Write;
use std::time::Duration;

use crds::Phase;
use crds::contract::Role;
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams};

use super::{Cluster, Error, progress};
use crds::contract::{JOB_LABEL, ROLE_LABEL};

/// What `wsctl logs` was asked for.
pub struct Options {
    /// The role's name, checked against [`Role::from_name`] (so a role added to the contract works here too).
    pub role: String,
    /// Only the pods whose name ends in this index.
    pub index: Option<u32>,
    /// Keep streaming until the pods end.
    pub follow: bool,
    /// Only the last lines.
    pub tail: Option<i64>,
    /// How long `follow` runs (and waits for pods) at most.
    pub timeout: Duration,
}

/// The role named `name`, or an error listing the roles there are.
pub fn role(name: &str) -> Result<Role, Error> {
    Role::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
        Error::Invalid(format!("unknown role {name:?}: --role takes one of {}", known.join(", ")))
    })
}

/// Orders names as people count: `engine-2` before `engine-10`.
pub fn natural(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(u64, String)> {
        let mut out: Vec<(u64, String)> = Vec::new();
        let mut cur = String::new();
        for c in s.chars() {
            if !cur.is_empty() && cur.chars().all(|d| d.is_ascii_digit()) != c.is_ascii_digit() {
                out.push((cur.parse().unwrap_or(u64::MAX), std::mem::take(&mut cur)));
            }
            cur.push(c);
        }
        if !cur.is_empty() {
            out.push((cur.parse().unwrap_or(u64::MAX), cur));
        }
        out
    }
    chunks(a).cmp(&chunks(b))
}

/// The pods of `names` (in natural order) that `index` selects: those whose name ends in `-INDEX` (engine N;
/// the SwarmX nodes numbered N at each level), every one without an index.
pub fn select(mut names: Vec<String>, index: Option<u32>) -> Vec<String> {
    names.sort_by(|a, b| natural(a, b));
    match index {
        Some(i) => names.into_iter().filter(|n| n.rsplit('-').next() == Some(i.to_string().as_str())).collect(),
        None => names,
    }
}

/// `wsctl logs JOB [--role R] [--index N] [-f]`.
///
/// With `-f` the command follows the job rather than a set of pods: it waits for pods that are not running yet
/// (the job is starting, or queued), streams them, and when they end while the job goes on (a suspend and its
/// resume, a restart) waits for the next ones, never printing a pod twice; it returns once the job is over.
pub async fn logs(cluster: &Cluster, job_name: &str, options: Options) -> Result<(), Error> {
    let role = role(&options.role)?;
    let job = cluster.job(job_name).await?;
    let which = format!("{role} pod{}", options.index.map(|i| format!(" with index {i}")).unwrap_or_default());
    let reading = Reading {
        cluster,
        pods: Api::namespaced(cluster.client.clone(), &cluster.namespace),
        job_name,
        selector: format!("{JOB_LABEL}={job_name},{ROLE_LABEL}={role}"),
        deadline: tokio::time::Instant::now() + options.timeout,
        which,
        options,
    };
    let mut streamed: std::collections::HashSet<String> = std::collections::HashSet::new();
    loop {
        let Some(names) = reading.running(&job, &streamed).await? else {
            return Ok(()); // Followed to the job's end.
        };
        let prefixed = names.len() > 1;
        let o = &reading.options;
        let params = LogParams { follow: o.follow, tail_lines: o.tail, ..LogParams::default() };
        if !o.follow {
            for (name, _) in &names {
                let text = reading
                    .pods
                    .logs(name, &params)
                    .await
                    .map_err(Error::other(format!("read the log of pod {name}")))?;
                print_lines(prefixed.then_some(name.as_str()), text.lines());
            }
            return Ok(());
        }
        let mut streams = Vec::new();
        for (name, uid) in &names {
            let reader = reading
                .pods
                .log_stream(name, &params)
                .await
                .map_err(Error::other(format!("follow the log of pod {name}")))?;
            streamed.insert(uid.clone());
            let tag = name.clone();
            streams.push(reader.lines().map(move |l| (tag.clone(), l)).boxed());
        }
        if reading.follow(futures::stream::select_all(streams), prefixed).await? {
            return Ok(());
        }
    }
}

/// What one `wsctl logs` reads: the job's pods of one role, with the options and the deadline they share.
struct Reading<'a> {
    cluster: &'a Cluster,
    pods: Api<Pod>,
    job_name: &'a str,
    /// The label selector of the job's pods of the role.
    selector: String,
    /// When `-f` gives up waiting or following.
    deadline: tokio::time::Instant,
    /// The pods asked for, in words ("engine pod with index 1").
    which: String,
    options: Options,
}

impl Reading<'_> {
    /// The running pods not streamed yet, as (name, uid), in natural order: with `-f` waited for up to the
    /// deadline, `None` once the job is over (or gone) while waiting; without, an error saying why there are none.
    async fn running(
        &self,
        job: &crds::TrainingJob,
        streamed: &std::collections::HashSet<String>,
    ) -> Result<Option<Vec<(String, String)>>, Error> {
        let (o, job_name, which) = (&self.options, self.job_name, &self.which);
        loop {
            let action = format!("list the pods of {}/{job_name}", self.cluster.namespace);
            let list =
                self.pods.list(&ListParams::default().labels(&self.selector)).await.map_err(Error::other(action))?;
            let started = |p: &Pod| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, None | Some("Pending"))
                    && p.metadata.deletion_timestamp.is_none()
                    && !p.metadata.uid.as_ref().is_some_and(|u| streamed.contains(u))
            };
            let uids: std::collections::HashMap<String, String> = list
                .items
                .iter()
                .filter(|p| started(p))
                .map(|p| (p.name_any(), p.metadata.uid.clone().unwrap_or_default()))
                .collect();
            let names = select(uids.keys().cloned().collect(), o.index);
            if !names.is_empty() {
                let with_uid = |n: String| {
                    let uid = uids.get(&n).cloned().unwrap_or_default();
                    (n, uid)
                };
                return Ok(Some(names.into_iter().map(with_uid).collect()));
            }
            if !o.follow {
                let phase = progress::phase(job);
                let released = matches!(
                    job.status.as_ref().and_then(|s| s.phase),
                    Some(Phase::Succeeded | Phase::Failed | Phase::Suspended)
                );
                let hint = if released {
                    "a job's pods exist only while it holds CS-2s; follow them with -f while it runs"
                } else {
                    "it may still be starting: -f waits for its pods"
                };
                return Err(Error::Invalid(format!(
                    "TrainingJob {}/{job_name} ({phase}) has no running {which}: {hint}",
                    self.cluster.namespace
                )));
            }
            if self.over().await {
                return Ok(None);
            }
            if tokio::time::Instant::now() >= self.deadline {
                return Err(Error::Timeout {
                    after: o.timeout,
                    what: format!("a running {which} of {job_name}"),
                    last: None,
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Whether the job is over: Succeeded, Failed, or gone.
    async fn over(&self) -> bool {
        match self.cluster.job(self.job_name).await {
            Ok(j) => j.status.as_ref().and_then(|s| s.phase).is_some_and(Phase::is_terminal),
            Err(Error::NotFound { .. }) => true,
            Err(_) => false,
        }
    }

    /// Prints the streams' lines until they all end (`false`: the job may go on with new pods) or the job is
    /// over (`true`, after what is still in flight: a finished job's MemoryX stays to serve the checkpoints, so
    /// following ends with the job, not the pod).
    async fn follow(
        &self,
        mut all: futures::stream::SelectAll<futures::stream::BoxStream<'static, (String, std::io::Result<String>)>>,
        prefixed: bool,
    ) -> Result<bool, Error> {
        let mut check = tokio::time::interval(Duration::from_secs(2));
        let mut over_at: Option<tokio::time::Instant> = None;
        loop {
            let until = over_at.map_or(self.deadline, |t| t.min(self.deadline));
            tokio::select! {
                next = tokio::time::timeout_at(until, all.next()) => match next {
                    Err(_) if over_at.is_some() => return Ok(true),
                    Err(_) => {
                        let what = format!("the {}s of {} to end", self.which, self.job_name);
                        return Err(Error::Timeout { after: self.options.timeout, what, last: None });
                    }
                    Ok(None) => return Ok(over_at.is_some() || self.over().await),
                    Ok(Some((name, Ok(line)))) => print_lines(prefixed.then_some(name.as_str()), std::iter::once(line.as_str())),
                    Ok(Some((name, Err(e)))) => {
                        return Err(Error::Io { what: format!("reading the log of pod {name}"), source: e });
                    }
                },
                _ = check.tick(), if over_at.is_none() => {
                    if self.over().await {
                        over_at = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                    }
                }
            }
        }
    }
}

fn print_lines<'a>(pod: Option<&str>, lines: impl Iterator<Item = &'a str>) {
    let mut out = std::io::stdout().lock();
    for l in lines {
        let written = match pod {
            Some(p) => writeln!(out, "[{p}] {l}"),
            None => writeln!(out, "{l}"),
        };
        if written.is_err() {
            return; // A closed pipe (`| head`): nobody is reading.
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_the_contracts_and_a_typo_lists_them() {
        assert_eq!(role("engine").unwrap(), Role::Engine);
        let e = role("engines").unwrap_err().to_string();
        assert!(e.contains("\"engines\"") && e.contains("memoryx") && e.contains("swarmx"), "{e}");
    }

    #[test]
    fn pods_are_in_natural_order_and_an_index_picks_by_suffix() {
        let names = ["j-engine-10", "j-engine-2", "j-engine-0", "j-engine-1"].map(String::from).to_vec();
        assert_eq!(select(names.clone(), None), ["j-engine-0", "j-engine-1", "j-engine-2", "j-engine-10"]);
        assert_eq!(select(names, Some(1)), ["j-engine-1"]);
        let swarm = ["j-swarmx-1-0", "j-swarmx-0-0", "j-swarmx-1-1"].map(String::from).to_vec();
        assert_eq!(select(swarm, Some(0)), ["j-swarmx-0-0", "j-swarmx-1-0"]);
    }
}
