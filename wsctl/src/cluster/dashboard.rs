//! `wsctl dashboard` on a cluster: the jobs of a namespace (or all) read with the user's kubeconfig, and for one
//! job its pods, Events, the tail of each role's log and, while its MemoryX runs, its records and checkpoints
//! fetched as `wsctl tensorboard pull` fetches them (a port-forward and the job's identity). Nothing is
//! created on the cluster: a job whose MemoryX is not running shows what its status keeps.

use anyhow::Result;
use crds::TrainingJob;
use crds::contract::{JOB_LABEL, ROLE_LABEL, Role};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams};
use plan::wiring::Component as Part;
use runtime::coordinator::records::{METRICS_FILE, SUMMARY_FILE};

use super::checkpoints::{live, running_memoryx};
use super::logs::natural;
use super::{Cluster, Error, progress};
use crate::dashboard::view::{Checkpoint, Component, Curve, Detail, Event, Listing, LogTail, Row, TREE_ORDER};
use crate::dashboard::{Source, records};

/// Most bytes of a running job's `metrics.jsonl` fetched at each refresh (~55,000 steps); a longer one is left
/// to `wsctl tensorboard pull`.
pub const MAX_LIVE_METRICS_BYTES: usize = 8 << 20;
/// Lines of each role's log shown, and most bytes of them.
const LOG_LINES: i64 = 40;
const LOG_BYTES: i64 = 8 << 10;
/// Most Events of the namespace read, and most shown for one job (the newest).
const EVENTS_READ: u32 = 1000;
const EVENTS_SHOWN: usize = 50;

/// The jobs of one namespace, or of every namespace.
pub struct ClusterJobs {
    cluster: Cluster,
    all: bool,
}

impl ClusterJobs {
    /// The jobs `cluster` reads (of every namespace when `all`).
    pub fn new(cluster: Cluster, all: bool) -> ClusterJobs {
        ClusterJobs { cluster, all }
    }
}

impl Source for ClusterJobs {
    async fn listing(&self) -> Result<Listing> {
        let c = &self.cluster;
        let (api, scope): (Api<TrainingJob>, String) = if self.all {
            (Api::all(c.client.clone()), "every namespace".into())
        } else {
            (c.jobs(), format!("namespace {}", c.namespace))
        };
        let action = format!("list TrainingJobs ({scope})");
        let mut jobs = api.list(&ListParams::default()).await.map_err(Error::api(action, &c.namespace, ""))?.items;
        jobs.sort_by_key(|j| (j.namespace(), j.name_any()));
        Ok(Listing { scope, namespaces: self.all, rows: jobs.iter().map(row).collect() })
    }

    async fn detail(&self, key: &str) -> Result<Option<Detail>> {
        let Some((ns, name)) =
            key.split_once('/').filter(|(ns, name)| crds::is_dns_subdomain(ns) && crds::is_dns_subdomain(name))
        else {
            return Ok(None);
        };
        if !self.all && ns != self.cluster.namespace {
            return Ok(None);
        }
        let cluster = Cluster { client: self.cluster.client.clone(), namespace: ns.to_string() };
        let action = format!("read TrainingJob {ns}/{name}");
        let Some(job) = cluster.jobs().get_opt(name).await.map_err(Error::api(action, ns, name))? else {
            return Ok(None);
        };
        Ok(Some(detail(&cluster, job).await?))
    }
}

/// The job's row, as `wsctl get` words it; a failed job's reason is its failure.
pub fn row(job: &TrainingJob) -> Row {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let phase = progress::phase(job);
    let held = job.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
    let failed = job.status.as_ref().and_then(|s| s.phase) == Some(crds::Phase::Failed);
    let reason = if failed { progress::failure(job) } else { dash(progress::waiting_for(job)) };
    let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
    Row {
        href: format!("jobs/{ns}/{name}"),
        namespace: ns,
        name,
        phase,
        cs2: format!("{held}/{}", job.spec.cs2),
        step: dash(progress::steps(job)),
        loss: dash(progress::loss(job)),
        throughput: dash(progress::throughput(job)),
        eta: dash(progress::eta(job)),
        queue: dash(progress::queue_position(job)),
        reason,
    }
}

async fn detail(cluster: &Cluster, job: TrainingJob) -> Result<Detail> {
    let name = job.name_any();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let selector = format!("{JOB_LABEL}={name}");
    let action = format!("list the pods of {}/{name}", cluster.namespace);
    let mut pods_of_job =
        pods.list(&ListParams::default().labels(&selector)).await.map_err(Error::other(action))?.items;
    pods_of_job.sort_by(|a, b| natural(&a.name_any(), &b.name_any()));
    let mut gaps = Vec::new();
    let live = match records_of(cluster, &job).await {
        Ok(live) => live,
        Err(e) => {
            gaps.push(format!("the job's records could not be read from its MemoryX: {e:#}"));
            Live::default()
        }
    };
    let row = row(&job);
    let finished =
        matches!(job.status.as_ref().and_then(|s| s.phase), Some(crds::Phase::Succeeded | crds::Phase::Failed));
    if live.curve.loss.is_empty() && live.summary.is_none() {
        gaps.push(records_gap(&row.phase, &cluster.namespace, &name));
    }
    Ok(Detail {
        facts: live.summary.as_ref().map(records::facts).unwrap_or_default(),
        appliance: appliance(&name, &pods_of_job, &live),
        events: events(cluster, &name, &pods_of_job).await.unwrap_or_else(|e| {
            gaps.push(format!("cannot read the Events: {e:#}"));
            Vec::new()
        }),
        logs: logs(&pods, &pods_of_job).await,
        curve: live.curve,
        checkpoints: live.checkpoints,
        gaps,
        finished,
        row,
    })
}

fn records_gap(phase: &str, ns: &str, name: &str) -> String {
    format!(
        "no step recorded here ({phase}): the curves come from the job's running MemoryX; a finished job's records \
         stay on its checkpoint volume (`wsctl tensorboard pull {name} -n {ns}`)"
    )
}

/// What a running MemoryX says: the curves, the summary once written, the checkpoints.
#[derive(Default)]
struct Live {
    curve: Curve,
    last_bytes: Option<u64>,
    summary: Option<runtime::coordinator::train::Summary>,
    checkpoints: Vec<Checkpoint>,
}

/// The job's records and checkpoints from its running MemoryX; nothing when none runs.
async fn records_of(cluster: &Cluster, job: &TrainingJob) -> Result<Live> {
    let Some(pod) = running_memoryx(cluster, &job.name_any()).await? else { return Ok(Live::default()) };
    let origin = live(cluster, job.clone(), &pod).await?;
    let (base, id) = (&origin.base, &origin.identity);
    let files = crate::tensorboard::list(base, id).await?;
    let fetch = async |file: &str, max: usize| -> Result<Option<Vec<u8>>> {
        if !files.iter().any(|f| f.file == file) {
            return Ok(None);
        }
        Ok(Some(crate::checkpoint::get_bounded(base, id, &format!("run/{file}"), max).await?))
    };
    let metrics = fetch(METRICS_FILE, MAX_LIVE_METRICS_BYTES).await?.unwrap_or_default();
    let summary = fetch(SUMMARY_FILE, records::MAX_SUMMARY_BYTES as usize).await?;
    let summary = summary.map(|b| records::summary(&b)).transpose().map_err(anyhow::Error::msg)?;
    let steps = records::steps(&metrics);
    let checkpoints = crate::checkpoint::list(base, id).await?;
    Ok(Live {
        curve: records::curve(&steps, summary.as_ref()),
        last_bytes: steps.last().map(|s| s.bytes_streamed),
        summary,
        checkpoints: checkpoints.into_iter().map(|e| Checkpoint { step: e.step, bytes: e.bytes }).collect(),
    })
}

/// The job's pods as the appliance's components.
fn appliance(job: &str, pods: &[Pod], live: &Live) -> Vec<Component> {
    let busy = live.summary.as_ref().map(records::busy).unwrap_or_default();
    pods.iter()
        .filter_map(|p| {
            let role = p.labels().get(ROLE_LABEL).and_then(|r| Role::from_name(r))?;
            let name = p.name_any();
            let part = name.strip_prefix(job).and_then(|n| n.strip_prefix('-')).and_then(Part::from_name);
            let status = p.status.as_ref();
            let restarts = status
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count.max(0) as u32).sum());
            let phase = if p.metadata.deletion_timestamp.is_some() { Some("Terminating".to_string()) } else { None };
            Some(Component {
                role,
                node: p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "-".into()),
                phase: phase.or_else(|| status.and_then(|s| s.phase.clone())).unwrap_or_else(|| "-".into()),
                restarts,
                busy: match part {
                    Some(Part::Engine(i)) => busy.get(i as usize).copied(),
                    _ => None,
                },
                bytes_per_step: (part == Some(Part::WeightServer(0))).then_some(live.last_bytes).flatten(),
                name,
            })
        })
        .collect()
}

/// The newest Events of the job and its objects, oldest first.
async fn events(cluster: &Cluster, job: &str, pods: &[Pod]) -> Result<Vec<Event>> {
    let all = super::events::of_job(cluster, job, pods, EVENTS_READ).await?;
    let skip = all.len().saturating_sub(EVENTS_SHOWN);
    let shown = all.into_iter().skip(skip).map(|e| {
        let time = super::events::when(&e);
        let o = &e.involved_object;
        let object = format!("{}/{}", o.kind.as_deref().unwrap_or("?"), o.name.as_deref().unwrap_or("?"));
        let count = e.count.filter(|&c| c > 1).map(|c| format!(" (×{c})")).unwrap_or_default();
        Event {
            time,
            kind: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            object,
            message: format!("{}{count}", e.message.unwrap_or_default()),
        }
    });
    Ok(shown.collect())
}

/// The tail of the first pod of each role, MemoryX's first; a pod without a log yet says so.
async fn logs(api: &Api<Pod>, pods: &[Pod]) -> Vec<LogTail> {
    let mut tails = Vec::new();
    for role in TREE_ORDER {
        let Some(pod) = pods.iter().find(|p| p.labels().get(ROLE_LABEL).map(String::as_str) == Some(role.as_str()))
        else {
            continue;
        };
        let name = pod.name_any();
        let params = LogParams { tail_lines: Some(LOG_LINES), limit_bytes: Some(LOG_BYTES), ..LogParams::default() };
        let text = api.logs(&name, &params).await.unwrap_or_else(|e| format!("(no log: {e})"));
        tails.push(LogTail { name, text });
    }
    tails
}
