//! The controller: for each `TrainingJob`, observe (pods, MemoryX, the pool), decide (`status::decide`), then
//! act (apply or release the children, ask for a checkpoint, write the status). Every pass starts from what
//! the API server holds, so a pass can be repeated, interrupted or run by a freshly started replica.
//!
//! Jobs are watched and listed as stored and decoded one by one (kube's `DeserializeGuard` for the watch,
//! `decode::decode` for the lists): an object the type cannot hold is reported on itself (`Ready=False`,
//! `InvalidSpec`, a Warning Event) and never fails the watch or the list every other job depends on.

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::conditions::{ConditionType, Reason};
use crds::contract::exit::Exit;
use crds::contract::{MemoryxStatus, Role};
use crds::{Phase, RetainPolicy, TrainingJob, TrainingJobStatus};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event as CoreEvent, Node, ObjectReference, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DeserializeGuard, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::admission::{self, PriorityClasses, Verdict};
use crate::applied::{self, Applications};
use crate::children::checkpoints;
use crate::children::desired::{self, Desired};
use crate::children::pods::SPEC_HASH_ANNOTATION;
use crate::children::settings::Settings;
use crate::children::{identity, names};
use crate::config::{Config, Preemption};
use crate::coordinator::Coordinator;
use crate::decode::{self, Stored};
use crate::kueue::{self, api::workloads::Workload, seen::Seen, workload::queue_of};
use crate::metrics::Shared;
use crate::nodes;
use crate::postmortem;
use crate::slow_start::in_batches;
use crate::status::{self, Children, Eviction, Observed, Refusal, Unready};
use crate::{Error, FINALIZER, MANAGER, job_key};
use crds::contract::postmortem::POSTMORTEM_LABEL;
use crds::contract::{JOB_LABEL, JOB_UID_LABEL, ROLE_LABEL};

/// What every reconcile pass needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// How the operator runs.
    pub config: Config,
    /// Where progress comes from.
    pub coordinator: Arc<dyn Coordinator>,
    /// Held only while a pass claims CS-2s: one list of the jobs and one compare-and-swap of the claiming job's
    /// status, so two jobs never both take the last free CS-2s. (A lock, not state: nothing in it survives or
    /// needs to survive a restart, and only the leader reconciles.)
    pub admission: tokio::sync::Mutex<()>,
    /// Metrics and readiness.
    pub shared: Shared,
    /// Failed passes in a row per job (by uid), for the error policy's backoff; cleared by a good pass.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Publishes Events on phase changes.
    pub recorder: Recorder,
    /// Whether the cluster serves Kueue's Workloads (asked at start): jobs labelled for Kueue wait for it.
    pub kueue: bool,
    /// What each job's children were last applied as: an unchanged job's are not applied on every poll.
    pub applied: Applications,
}

/// A watched job: decoded, or the metadata and the error of one that does not decode.
pub type Watched = DeserializeGuard<TrainingJob>;

/// The jobs as stored, undecoded, in the watched namespace or all of them: lists decode each on its own.
fn stored_jobs(client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<TrainingJob>(&());
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Runs the controller until `shutdown` resolves. The binary calls it once it leads; tests call it directly.
pub async fn run(
    client: Client,
    config: Config,
    coordinator: Arc<dyn Coordinator>,
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let jobs: Api<Watched> = match config.namespace.as_deref() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pods: Api<Pod> = match config.namespace.as_deref() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let sets: Api<StatefulSet> = match config.namespace.as_deref() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let reporter = Reporter { controller: MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
    let recorder = Recorder::new(client.clone(), reporter);
    let kueue = kueue::cluster::installed(&client).await;
    let ctx = Arc::new(Context {
        client: client.clone(),
        config,
        coordinator,
        admission: tokio::sync::Mutex::new(()),
        shared: shared.clone(),
        recorder,
        failures: Default::default(),
        kueue,
        applied: Applications::default(),
    });
    let children = watcher::Config::default().labels(JOB_LABEL);
    let mut controller = Controller::new(jobs, watcher::Config::default());
    if kueue {
        // Kueue's admission (or eviction) of a job's Workload wakes the job's pass at once.
        let workloads: Api<Workload> = match ctx.config.namespace.as_deref() {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        controller = controller.owns(workloads, children.clone());
    }
    let store = controller.store();
    let census = {
        let shared = shared.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let mut counts: Vec<(String, i64)> = Vec::new();
                for job in store.state() {
                    let phase = match &job.0 {
                        Ok(job) => job.status.as_ref().and_then(|s| s.phase).map_or("Pending", Phase::as_str),
                        Err(_) => Reason::InvalidSpec.as_str(),
                    }
                    .to_string();
                    match counts.iter_mut().find(|(p, _)| *p == phase) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((phase, 1)),
                    }
                }
                shared.metrics.census(&counts);
            }
        }
    };
    let census = tokio::spawn(census);
    shared.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    controller
        .owns(pods, children.clone())
        .owns(sets, children)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(job = %obj.name, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
    census.abort();
    shared.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// One pass for one job: adds the cleanup finalizer, then either brings the job's world in line with its spec
/// or, when it is being deleted, removes its children. A job that does not decode is reported and left alone
/// (no finalizer is added to what the operator cannot manage), but still cleaned up if it is deleted while it
/// carries the finalizer from when it did decode.
pub async fn reconcile(obj: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let uid = obj.uid();
    let ns = obj.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let deleting = obj.meta().deletion_timestamp.is_some();
    let result = match &obj.0 {
        Err(_) if !deleting => undecodable(&obj, &ctx).await,
        _ => {
            // The finalizer needs only the metadata, which every stored object has.
            let api: Api<PartialObjectMeta<TrainingJob>> = Api::namespaced(ctx.client.clone(), &ns);
            let meta = Arc::new(PartialObjectMeta { types: None, metadata: obj.meta().clone(), _phantom: PhantomData });
            finalizer(&api, FINALIZER, meta, |event| async {
                match event {
                    FinalizerEvent::Apply(_) => match &obj.0 {
                        Ok(job) => apply(job, ctx.clone()).await,
                        Err(_) => undecodable(&obj, &ctx).await,
                    },
                    FinalizerEvent::Cleanup(m) => cleanup(&m.metadata, retain_of(&obj), ctx.clone()).await,
                }
            })
            .await
            .map_err(|e| match e {
                kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => {
                    e
                }
                // Keep the API error itself, so a conflict is recognised by its status code.
                kube::runtime::finalizer::Error::AddFinalizer(e)
                | kube::runtime::finalizer::Error::RemoveFinalizer(e) => Error::Kube(e),
                other => Error::Finalizer(other.to_string()),
            })
        }
    };
    ctx.shared.metrics.observe(result.is_ok(), started.elapsed());
    if result.is_ok()
        && let (Ok(mut f), Some(uid)) = (ctx.failures.lock(), uid)
    {
        f.remove(&uid);
    }
    result
}

/// Retries a failed pass: conflicts at once (someone else wrote first; the next pass reads their write),
/// anything else after a pause that doubles with each failure in a row of that job, so one job that keeps
/// failing (an API server refusing its objects) does not crowd out the others.
pub fn error_policy(job: Arc<Watched>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(job = %job.name_any(), error = %error, "reconcile error");
    if error.is_conflict() {
        return Action::requeue(Duration::from_millis(200));
    }
    let failures = match ctx.failures.lock() {
        Ok(mut f) => {
            let n = f.entry(job.uid().unwrap_or_default()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    Action::requeue(backoff(failures))
}

/// The pause before retrying a job after its `failures`-th failure in a row: 2 s, doubling, at most 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    Duration::from_secs(2).saturating_mul(1 << doublings).min(Duration::from_secs(300))
}

/// The CS-2 pool ([`nodes::pool_of`]) and the lost nodes ([`nodes::lost`]), read from the nodes.
async fn pool(ctx: &Context) -> Result<(Option<(u32, bool)>, BTreeSet<String>), Error> {
    let nodes = Api::<Node>::all(ctx.client.clone()).list(&ListParams::default()).await?.items;
    Ok((nodes::pool_of(&nodes, ctx.config.pool), nodes::lost(&nodes)))
}

#[derive(Default)]
struct PodCensus {
    ready: bool,
    failed: Vec<String>,
    /// Pods whose program refused the job's input ([`Exit::Refused`]): MemoryX's too, while its container restarts.
    refused: Vec<String>,
    delete: Vec<String>,
    /// Pods of the job on lost nodes (MemoryX's too, and those already being deleted): their kubelet cannot
    /// stop them, so the operator removes them at once, and their replacements go elsewhere.
    lost: Vec<String>,
    missing: Vec<Pod>,
    memoryx_restarts: Option<u32>,
    /// The first desired pod that is not ready, and why.
    unready: Option<Unready>,
}

fn pod_ready(p: &Pod) -> bool {
    let st = p.status.as_ref();
    st.and_then(|s| s.phase.as_deref()) == Some("Running")
        && st
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether a container of `p` (now or before its last restart) ended refusing the job's input.
fn refused_input(p: &Pod) -> bool {
    let statuses = p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map_or(&[][..], |c| &c[..]);
    statuses
        .iter()
        .flat_map(|c| [c.state.as_ref(), c.last_state.as_ref()])
        .filter_map(|s| s?.terminated.as_ref())
        .any(|t| Exit::of(t.exit_code) == Exit::Refused)
}

fn hash_of(p: &Pod) -> Option<&String> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(SPEC_HASH_ANNOTATION))
}

/// Whether `pod` is one of the weight servers of the StatefulSet `set` (`<set>-<ordinal>`).
fn is_weight_server(pod: &str, set: &str) -> bool {
    pod.strip_prefix(set)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|ordinal| !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit()))
}

/// Compares the job's engine, SwarmX and input-worker pods with the desired ones: which are failed (replace and count),
/// outdated or surplus (replace or remove), missing (create), and whether all are ready. MemoryX's pods (those
/// of the StatefulSet `memoryx_set`, one per weight server) are the StatefulSet's to manage: only their
/// container restarts are summed, since a restarted weight server costs the job a restart like any failure.
fn census(existing: &[Pod], desired: &[Pod], memoryx_set: &str, lost_nodes: &BTreeSet<String>) -> PodCensus {
    let mut c = PodCensus { ready: true, ..Default::default() };
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| lost_nodes.contains(n));
    for p in existing {
        let name = p.name_any();
        if node_of(p).is_some() {
            c.lost.push(name);
            continue;
        }
        if is_weight_server(&name, memoryx_set) {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|x| x.name == "memoryx"))
                .map(|x| u32::try_from(x.restart_count).unwrap_or(0));
            if let Some(r) = restarts.filter(|_| p.metadata.deletion_timestamp.is_none()) {
                c.memoryx_restarts = Some(c.memoryx_restarts.unwrap_or(0).saturating_add(r));
                if refused_input(p) {
                    c.refused.push(name);
                }
            }
            continue;
        }
        let role = p.labels().get(ROLE_LABEL).map(String::as_str);
        // Input workers too: after a rescale the surplus ones must go and the rest restart with the new
        // job.yaml (the 192 → 96 scale test found them left behind, still holding the old configuration).
        if !matches!(role, Some("engine" | "swarmx" | "input")) || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match desired.iter().find(|d| d.name_any() == name) {
            None => c.delete.push(name),
            Some(d) if hash_of(d) != hash_of(p) => c.delete.push(name),
            Some(_) if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") => {
                c.failed.push(name.clone());
                if refused_input(p) {
                    c.refused.push(name.clone());
                }
                c.delete.push(name);
            }
            Some(_) => {}
        }
    }
    for d in desired {
        let name = d.name_any();
        let ns = d.namespace().unwrap_or_default();
        let current = existing.iter().find(|p| p.name_any() == name);
        let unready = match current {
            Some(p) if c.lost.contains(&name) => {
                let node = node_of(p).unwrap_or_default();
                Some(Unready {
                    pod: name,
                    namespace: ns,
                    why: format!("its node {node} is lost (unreachable): replacing it"),
                })
            }
            Some(p) if !c.delete.contains(&name) && p.metadata.deletion_timestamp.is_none() => {
                (!pod_ready(p)).then(|| Unready::of(p, &ns))
            }
            Some(_) => Some(Unready { pod: name, namespace: ns, why: "being replaced".into() }),
            None => {
                c.missing.push(d.clone());
                Some(Unready { pod: name, namespace: ns, why: "not created yet".into() })
            }
        };
        if let Some(u) = unready {
            c.ready = false;
            c.unready.get_or_insert(u);
        }
    }
    c
}

async fn apply_one<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().ok_or(Error::MissingField("metadata.name"))?;
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj)).await?;
    Ok(())
}

async fn delete_ignoring_absent<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What one pass read, before deciding anything: MemoryX's report, the pool, the job's pods and the objects
/// its appliance should consist of at the size it holds (built once, here).
struct Reading {
    coordinator: Option<Result<MemoryxStatus, String>>,
    pool: Option<(u32, bool)>,
    /// The nodes that are lost ([`nodes::lost`]).
    lost_nodes: BTreeSet<String>,
    settings: Settings,
    existing: Vec<Pod>,
    desired: Option<Desired>,
    /// Why the plan refuses the job at the size it holds, when it does (then `desired` is `None`).
    plan_refusal: Option<String>,
    classes: PriorityClasses,
    memoryx_refusal: Option<Refusal>,
    /// Why the job cannot be admitted because of its data: `spec.data.volume` names a claim that does not
    /// exist (checked only while it waits).
    missing_data: Option<String>,
    /// Kueue's side of a job labelled for it.
    kueue: Option<kueue::cluster::Reading>,
}

/// Read: everything the decision needs that is not the list of jobs. MemoryX is asked first and outside any
/// critical section, so a slow MemoryX delays only its own job.
async fn read(job: &TrainingJob, ctx: &Context) -> Result<Reading, Error> {
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let holds = job.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
    let coordinator = if holds > 0 { Some(ctx.coordinator.status(job).await.map_err(|e| e.to_string())) } else { None };
    let (pool, lost_nodes) = pool(ctx).await?;
    let settings = Settings {
        default_image: ctx.config.default_image.clone(),
        fan_out: ctx.config.fan_out,
        request_cs2: pool.is_some_and(|p| p.1),
        operator: ctx.config.operator.clone(),
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = pods.list(&ListParams::default().labels(&format!("{JOB_LABEL}={}", job.name_any()))).await?.items;
    let classes = Api::<PriorityClass>::all(ctx.client.clone()).list(&ListParams::default()).await?.items;
    let classes = PriorityClasses::new(&classes);
    let kueue = match queue_of(job) {
        Some(queue) => Some(read_kueue(job, ctx, &settings, &classes, queue).await?),
        None => None,
    };
    let (desired, plan_refusal) = match holds {
        0 => (None, None),
        _ => match appliance(job, &settings, holds, kueue.as_ref()) {
            Ok(d) => (Some(d), None),
            // The plan refuses the size the job holds (its spec changed, say spec.memoryx): not a failed pass
            // retried for ever, but a decision, which says why in the status and gives the CS-2s back.
            Err(Error::Plan(why)) => (None, Some(Error::Plan(why).to_string())),
            Err(e) => return Err(e),
        },
    };
    let servers = desired.as_ref().and_then(|d| d.memoryx.spec.as_ref()?.replicas).map_or(1, |r| r.max(1) as u32);
    let memoryx_refusal = if holds > 0 { memoryx_refusal(job, &existing, servers, ctx).await } else { None };
    let missing_data = match (&job.spec.data.volume, holds) {
        (Some(claim), 0) => {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
            claims.get_opt(claim).await?.is_none().then(|| {
                format!(
                    "spec.data.volume names the PersistentVolumeClaim '{claim}', which does not exist in namespace \
                     '{ns}': create it with the data (or fix the name); the job waits for it without holding CS-2s"
                )
            })
        }
        _ => None,
    };
    Ok(Reading {
        coordinator,
        pool,
        lost_nodes,
        settings,
        existing,
        desired,
        plan_refusal,
        classes,
        memoryx_refusal,
        missing_data,
        kueue,
    })
}

/// Kueue's side of `job`, labelled for `queue`: its Workload created when it has none (from its appliance at
/// `spec.cs2`, unless the plan refuses that or the job is over).
async fn read_kueue(
    job: &TrainingJob,
    ctx: &Context,
    settings: &Settings,
    classes: &PriorityClasses,
    queue: &str,
) -> Result<kueue::cluster::Reading, Error> {
    let reading = kueue::cluster::read(&ctx.client, job, queue, ctx.kueue).await?;
    let over = job.status.as_ref().and_then(|s| s.phase).is_some_and(Phase::is_terminal);
    if reading.seen != Seen::Missing || over || job.metadata.deletion_timestamp.is_some() {
        return Ok(reading);
    }
    match desired::desired(job, settings, job.spec.cs2) {
        Ok(full) => kueue::cluster::ensure(&ctx.client, job, &full, classes, reading).await,
        // The pass fails the job with the plan's reason; no Workload is made for it.
        Err(Error::Plan(_)) => Ok(reading),
        Err(e) => Err(e),
    }
}

/// The job's appliance on `cs2` CS-2s, on the flavors Kueue admitted it to when it is under Kueue.
fn appliance(
    job: &TrainingJob,
    settings: &Settings,
    cs2: u32,
    kueue: Option<&kueue::cluster::Reading>,
) -> Result<Desired, Error> {
    let mut d = desired::desired(job, settings, cs2)?;
    if let Some(k) = kueue {
        kueue::workload::place(&mut d, &k.flavors);
    }
    Ok(d)
}

/// Why a weight server's pod is missing, when the API server refused it: the StatefulSet controller creates
/// them, so the refusal shows only on the StatefulSet (its conditions, or its `FailedCreate` event). Asked only
/// while fewer server pods exist than the job's plan has servers; a failure to read is logged, never fatal.
async fn memoryx_refusal(job: &TrainingJob, existing: &[Pod], servers: u32, ctx: &Context) -> Option<Refusal> {
    let ns = job.namespace()?;
    let name = names::memoryx(&job.name_any());
    let present = existing.iter().filter(|p| is_weight_server(&p.name_any(), &name)).count();
    if present >= servers as usize {
        return None;
    }
    let key = job_key(&ns, &job.name_any());
    let sts = match Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns).get_opt(&name).await {
        Ok(Some(sts)) => sts,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(job = %key, error = %e, "cannot read MemoryX's StatefulSet");
            return None;
        }
    };
    let about = ListParams::default().fields(&format!("involvedObject.kind=StatefulSet,involvedObject.name={name}"));
    let events = match Api::<CoreEvent>::namespaced(ctx.client.clone(), &ns).list(&about).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(job = %key, error = %e, "cannot read the events of MemoryX's StatefulSet");
            Vec::new()
        }
    };
    status::memoryx_refusal(&sts, &events)
}

/// Decide (pure): the job's next status and what to do with its children, from what was read and the current
/// list of every job (whose allocations are what is taken from the pool).
fn decide(
    job: &TrainingJob,
    all: &[Stored],
    r: &Reading,
    ctx: &Context,
    now: Timestamp,
) -> (status::Decision, PodCensus) {
    let mut claims = decode::claims(all, &r.classes);
    let (pool_size, _) = r.pool.unwrap_or((0, false));
    let key = job_key(&job.namespace().unwrap_or_default(), &job.name_any());
    // This pass knows afresh whether the job's data claim exists; other jobs' claims say what their last pass saw.
    if let Some(own) = claims.iter_mut().find(|c| c.key == key) {
        own.blocked = r.missing_data.is_some();
    }
    let holds = job.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
    let kueue = r.kueue.as_ref();
    let admission = (holds == 0).then(|| match (kueue, &r.missing_data, r.pool) {
        (_, Some(message), _) if job.spec.cs2 > 0 && !job.spec.suspend => {
            Verdict::Wait { reason: Reason::DataVolumeNotFound, message: message.clone() }
        }
        (Some(k), _, _) => kueue::seen::verdict(job, &k.seen, &k.queueing),
        (None, _, Some(_)) => admission::decide(pool_size, &claims, &key),
        (None, _, None) => Verdict::Wait {
            reason: Reason::NoPool,
            message: "no node advertises weightstream.dev/cs2 and no pool size is configured (WS_CS2_POOL)".into(),
        },
    });
    // A job under Kueue grows only by a new admission of Kueue's, and only Kueue evicts it.
    let may_grow =
        kueue.is_none() && (job.spec.cs2 <= holds || admission::may_grow(pool_size, &claims, job.spec.cs2 - holds));
    let evicted = match kueue {
        Some(k) => (holds > 0).then(|| kueue::seen::eviction(&k.seen)).flatten(),
        None => (ctx.config.preemption == Preemption::Allowed && holds > 0)
            .then(|| admission::preempted_by(pool_size, &claims, &key))
            .flatten()
            .map(|by| Eviction { reason: Reason::Preempted, why: format!("preempted by {}", preemptor(by)) }),
    };
    let queue_position = match kueue {
        Some(k) => admission.as_ref().and(k.queueing.position),
        None => admission.as_ref().and_then(|_| admission::position(&claims, &key)),
    };
    let desired_pods = r.desired.as_ref().map_or(&[][..], |d| &d.pods[..]);
    let pods = census(&r.existing, desired_pods, &names::memoryx(&job.name_any()), &r.lost_nodes);
    let plan = match (&r.desired, &r.plan_refusal) {
        (_, Some(why)) => Err(why.clone()),
        (Some(d), None) if d.plan.cs2 == job.spec.cs2 => Ok(d.plan.clone()),
        _ => crate::children::plan::plan(job, job.spec.cs2, ctx.config.fan_out)
            .map(|(_, s)| s)
            .map_err(|e| e.to_string()),
    };
    let observed = Observed {
        queue_position,
        admission,
        may_grow,
        capacity: r
            .pool
            .map(|(size, _)| size.saturating_sub(claims.iter().filter(|c| c.key != key).map(|c| c.holds).sum())),
        plan,
        pods_ready: holds > 0 && pods.ready,
        failed_pods: pods.failed.clone(),
        refused_pods: pods.refused.clone(),
        unready: pods.unready.clone(),
        memoryx_restarts: pods.memoryx_restarts,
        placement: status::placement(&r.existing),
        lost_nodes: r
            .existing
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone().filter(|n| r.lost_nodes.contains(n)))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        evicted,
        coordinator: r.coordinator.clone(),
        now,
    };
    (status::decide(job, &observed), pods)
}

/// The waiting job that preempts another, in words: `ns/name (PriorityClass 'high')`.
fn preemptor(by: &admission::Claim) -> String {
    match &by.class_name {
        Some(class) => format!("{} (PriorityClass '{class}')", by.key),
        None => format!("{} (the default PriorityClass)", by.key),
    }
}

/// Every job the operator counts against the pool, read afresh from the API server (not from the cache):
/// admission must see every allocation made so far. Each is decoded on its own, so one that does not decode
/// still counts what it holds and fails nothing. `None` when `job` itself is gone (or no longer decodes).
async fn fresh(job: &TrainingJob, ctx: &Context) -> Result<Option<(TrainingJob, Vec<Stored>)>, Error> {
    let listed = stored_jobs(&ctx.client, ctx.config.namespace.as_deref()).list(&ListParams::default()).await?.items;
    let all: Vec<Stored> = listed.iter().map(decode::decode).collect();
    let this = all.iter().find_map(|s| s.as_ref().ok().filter(|j| j.uid() == job.uid()).cloned());
    Ok(this.map(|j| (j, all)))
}

/// A job that does not decode: says why on the job itself — `Ready=False` with reason `InvalidSpec` and the
/// decoding error (when its status still decodes) and a Warning Event — and waits for it to change. Its
/// children are left as they are: nothing can be decided from a spec that cannot be read.
async fn undecodable(obj: &Watched, ctx: &Context) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api = stored_jobs(&ctx.client, Some(&ns));
    let Some(raw) = api.get_opt(&obj.name_any()).await? else { return Ok(Action::await_change()) };
    let u = match decode::decode(&raw) {
        // Fixed meanwhile: the watch brings it decoded.
        Ok(_) => return Ok(Action::requeue(Duration::from_millis(200))),
        Err(u) => u,
    };
    let key = u.key();
    tracing::warn!(job = %key, error = %u.error, "cannot decode the TrainingJob; reconciling the others");
    let next = decode::invalid_spec_status(&u, Timestamp::now());
    let news = next.is_none() || next != u.status;
    if let Some(status) = next.filter(|s| Some(s) != u.status.as_ref())
        && let Err(e) = patch_status(&api, &u.name, u.resource_version.clone(), &status).await
    {
        tracing::warn!(job = %key, error = %e, "cannot record InvalidSpec in the status");
    }
    if news {
        let note = format!("the operator cannot read this TrainingJob: {}", u.error);
        publish(ctx, &obj.object_ref(&()), &key, EventType::Warning, Reason::InvalidSpec, EventAction::Decode, note)
            .await;
    }
    Ok(Action::await_change())
}

/// Writes `status` as a compare-and-swap on the job's resourceVersion: a status computed from a stale read is
/// refused (409) and the pass is redone from a fresh read, so a counter such as `restarts` or a claim on CS-2s
/// is never written twice.
async fn write_status(ctx: &Context, job: &TrainingJob, status: &TrainingJobStatus) -> Result<TrainingJob, Error> {
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    patch_status(&api, &job.name_any(), job.resource_version(), status).await
}

/// The one way the operator writes a job's status: a server-side apply of `status` alone as the operator's
/// field manager, with `resource_version` in the patch so the API server refuses it (409) when the job
/// changed since it was read. Through `api` of decoded jobs, or of stored ones for a job that does not decode.
async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    resource_version: Option<String>,
    status: &TrainingJobStatus,
) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = status_patch(name, resource_version, status);
    Ok(api.patch_status(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch)).await?)
}

/// The body of [`patch_status`]: the job's type, its name and the resourceVersion to compare, and the status.
fn status_patch(name: &str, resource_version: Option<String>, status: &TrainingJobStatus) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "metadata": { "name": name, "resourceVersion": resource_version },
        "status": status,
    })
}

/// What the operator was doing when it recorded an Event (the Event's `action`).
#[derive(Clone, Copy, Debug)]
enum EventAction {
    /// Creating or updating the job's children.
    Assemble,
    /// Reading the stored job.
    Decode,
    /// Moving the job to this phase.
    Phase(Phase),
}

impl EventAction {
    fn as_str(self) -> &'static str {
        match self {
            EventAction::Assemble => "Assemble",
            EventAction::Decode => "Decode",
            EventAction::Phase(p) => p.as_str(),
        }
    }
}

/// Records an Event about the job `regarding` refers to (`key` for the log). Best effort: a refused Event is
/// logged and the pass goes on, since Events tell people what happened and nothing the operator decides
/// depends on them.
async fn publish(
    ctx: &Context,
    regarding: &ObjectReference,
    key: &str,
    type_: EventType,
    reason: Reason,
    action: EventAction,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.as_str().into(),
        note: Some(note),
        action: action.as_str().into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, regarding).await {
        tracing::warn!(job = %key, error = %e, "cannot record event");
    }
}

/// One pass as a pipeline: read → decide (pure) → (claim) → apply the children built once → status → event.
///
/// A decision that takes CS-2s from the pool (admission, growth) is made again and its claim (the allocation
/// alone) written inside a short critical section — one list of the jobs and one compare-and-swap of this job's
/// status — before any child is created, so two jobs never both take the last free CS-2s, and nothing else
/// (MemoryX, the children) waits on it: different jobs reconcile concurrently. The rest of the status, the
/// phase above all, follows once the children are applied.
async fn apply(job: &TrainingJob, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = job_key(&job.namespace().unwrap_or_default(), &job.name_any());
    let Some((mut job, mut all)) = fresh(job, &ctx).await? else { return Ok(Action::await_change()) };
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let reading = read(&job, &ctx).await?;
    let (pool_size, _) = reading.pool.unwrap_or((0, false));
    ctx.shared.metrics.set_pool(pool_size, decode::claims(&all, &reading.classes).iter().map(|c| c.holds).sum());
    let holds = job.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
    let claims_more = |d: &status::Decision| d.status.allocated_cs2.unwrap_or(0) > holds;
    let (mut decision, mut pods) = decide(&job, &all, &reading, &ctx, Timestamp::now());
    if claims_more(&decision) {
        let _claim = ctx.admission.lock().await;
        let Some(again) = fresh(&job, &ctx).await? else { return Ok(Action::await_change()) };
        (job, all) = again;
        if job.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0) != holds {
            // Another pass changed the allocation meanwhile; start over from what it wrote.
            return Ok(Action::requeue(Duration::from_millis(10)));
        }
        (decision, pods) = decide(&job, &all, &reading, &ctx, Timestamp::now());
        if claims_more(&decision) {
            // The claim alone: the CS-2s are the job's from here on, but its phase moves on only once its
            // children exist, so a job is never seen Starting with part of its gang.
            let mut claim = job.status.clone().unwrap_or_default();
            claim.allocated_cs2 = decision.status.allocated_cs2;
            job = write_status(&ctx, &job, &claim).await?;
        }
    }

    // MemoryX's pod refused by the API server shows only on its StatefulSet: bring it to the job's Ready.
    let refusal = match (&reading.memoryx_refusal, &decision.children) {
        (Some(r), Children::Assemble(_)) => Some(r),
        _ => None,
    };
    if let Some(r) = refusal {
        decision.status = status::children_refused(
            &decision.status,
            r.reason,
            r.message.clone(),
            job.metadata.generation,
            Timestamp::now(),
        );
    }
    let refusal_is_news = refusal.is_some_and(|r| {
        let conditions = job.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        !conditions.iter().any(|c| ConditionType::Ready.of(c) && r.reason.of(c) && c.message == r.message)
    });

    let failing = decision.status.phase == Some(Phase::Failed)
        && job.status.as_ref().and_then(|s| s.phase) != Some(Phase::Failed);
    if failing && let Some(culprit) = keep_postmortem(&ctx, &job, &decision.status, &reading.existing).await {
        decision.status = status::failed_by(&decision.status, &culprit);
    }
    match decision.children {
        Children::Nothing => {}
        Children::Assemble(n) => {
            let built;
            let desired = match &reading.desired {
                Some(d) if n == holds => d,
                _ => {
                    built = appliance(&job, &reading.settings, n, reading.kueue.as_ref())?;
                    &built
                }
            };
            let census_at_n = if n == holds { Some(&pods) } else { None };
            let existing = &reading.existing;
            if let Err(e) = assemble(&ctx, &job, desired, census_at_n, existing, &reading.lost_nodes).await {
                refused(&ctx, &job, &decision.status, &e).await;
                return Err(e);
            }
        }
        Children::Release => release(&ctx, &job, decision.status.phase, &reading.existing).await?,
    }
    take_back_lost(&ctx, &job, &pods.lost).await?;
    if decision.request_checkpoint {
        // A refused request is not fatal: the next pass sees no new checkpoint and asks again.
        if let Err(e) = ctx.coordinator.checkpoint(&job).await {
            tracing::warn!(job = %key, error = %e, "asking MemoryX for a checkpoint failed");
        }
    }
    if job.status.as_ref() != Some(&decision.status) {
        write_status(&ctx, &job, &decision.status).await?;
    }
    if let Some(k) = &reading.kueue {
        kueue::cluster::report(&ctx.client, &job, k, &decision.status, &reading.existing).await?;
    }
    if let Some(r) = refusal.filter(|_| refusal_is_news) {
        tracing::warn!(job = %key, reason = r.reason.as_str(), "{}", r.message);
        publish(
            &ctx,
            &job.object_ref(&()),
            &key,
            EventType::Warning,
            r.reason,
            EventAction::Assemble,
            r.message.clone(),
        )
        .await;
    }
    if let Some(t) = &decision.transition {
        tracing::info!(job = %key, phase = %t.phase, reason = %t.reason, message = %t.message, "phase changed");
        let type_ = if t.warning { EventType::Warning } else { EventType::Normal };
        let note = format!("{}: {}", t.phase, t.message);
        publish(&ctx, &job.object_ref(&()), &key, type_, t.reason, EventAction::Phase(t.phase), note).await;
    }
    Ok(match decision.status.phase {
        Some(Phase::Succeeded | Phase::Failed | Phase::Suspended) => Action::requeue(Duration::from_secs(300)),
        _ if !pods.delete.is_empty() || !pods.lost.is_empty() => Action::requeue(Duration::from_millis(500)),
        _ => Action::requeue(ctx.config.poll),
    })
}

/// Captures the post-mortem of `job` as `status` leaves it (failed), from its pods before they are released;
/// returns the pod and line that failed it, if a container did. A capture that fails is logged, never fatal.
async fn keep_postmortem(ctx: &Context, job: &TrainingJob, status: &TrainingJobStatus, pods: &[Pod]) -> Option<String> {
    let failed = status.conditions.iter().find(|c| ConditionType::Failed.of(c));
    let reason = failed.map_or_else(|| "Failed".to_string(), |c| format!("{}: {}", c.reason, c.message));
    let subject = postmortem::Subject { meta: &job.metadata, status: serde_json::to_string(status).ok(), reason };
    match postmortem::capture(&ctx.client, &subject, pods).await {
        Ok(culprit) => culprit,
        Err(e) => {
            tracing::warn!(job = %job.name_any(), error = %e, "cannot keep the job's post-mortem");
            None
        }
    }
}

/// When the API server refuses one of the job's children (403: Pod Security, RBAC, a quota; 422: invalid),
/// says so in the status's `Ready` condition and in a Warning Event at once, rather than only in the
/// operator's log; the pass then fails and is retried with backoff.
async fn refused(ctx: &Context, job: &TrainingJob, next: &TrainingJobStatus, e: &Error) {
    let Error::Kube(kube::Error::Api(s)) = e else { return };
    if s.code != 403 && s.code != 422 {
        return;
    }
    let reason = status::refusal_reason(s.code);
    let message = format!("the API server refused the job's children: {}", s.message);
    let key = job_key(&job.namespace().unwrap_or_default(), &job.name_any());
    tracing::warn!(job = %key, reason = reason.as_str(), "{message}");
    let status = status::children_refused(next, reason, message.clone(), job.metadata.generation, Timestamp::now());
    if let Err(e) = write_status(ctx, job, &status).await {
        tracing::warn!(job = %key, error = %e, "cannot record the refusal in the status");
    }
    publish(ctx, &job.object_ref(&()), &key, EventType::Warning, reason, EventAction::Assemble, message).await;
}

/// Applies every child of `desired`. Outdated, failed and surplus pods are deleted first; their replacements
/// are created on the next pass, once the old pod is gone and its name free.
async fn assemble(
    ctx: &Context,
    job: &TrainingJob,
    desired: &Desired,
    census_at_n: Option<&PodCensus>,
    existing: &[Pod],
    lost_nodes: &BTreeSet<String>,
) -> Result<(), Error> {
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let uid = job.uid().unwrap_or_default();
    let fingerprint = applied::fingerprint(desired)?;
    let now = Instant::now();
    if !ctx.applied.current(&uid, &fingerprint, now) {
        apply_all_but_pods(ctx, job, &ns, desired).await?;
        ctx.applied.record(&uid, fingerprint, now);
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let owned;
    let census = match census_at_n {
        Some(c) => c,
        None => {
            owned = census(existing, &desired.pods, &names::memoryx(&job.name_any()), lost_nodes);
            &owned
        }
    };
    let failed: Vec<&Pod> = existing
        .iter()
        .filter(|p| census.delete.contains(&p.name_any()))
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        .collect();
    if !failed.is_empty()
        && let Err(e) = postmortem::keep_replaced(&ctx.client, job, &failed).await
    {
        tracing::warn!(job = %job.name_any(), error = %e, "cannot keep the failed pods' logs");
    }
    // Many at once (a large appliance's first pass, a rescale), in batches that grow from one.
    in_batches(&census.delete, |name| {
        tracing::info!(job = %job.name_any(), pod = %name, "replacing pod");
        delete_ignoring_absent(&pods_api, name)
    })
    .await?;
    in_batches(&census.missing, |pod| apply_one(&pods_api, pod)).await
}

/// Applies the job's identity (created once), ConfigMap, Services, NetworkPolicy and MemoryX's StatefulSet:
/// everything but the pods, which [`assemble`] counts against what exists on every pass.
async fn apply_all_but_pods(ctx: &Context, job: &TrainingJob, ns: &str, desired: &Desired) -> Result<(), Error> {
    let client = &ctx.client;
    ensure_identity(client, job, ns).await?;
    apply_one(&Api::<ConfigMap>::namespaced(client.clone(), ns), &desired.config).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for s in &desired.services {
        apply_one(&services, s).await?;
    }
    // The policy before any pod: a job's pods never run unprotected.
    apply_one(&Api::<NetworkPolicy>::namespaced(client.clone(), ns), &desired.network_policy).await?;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), ns);
    let mut memoryx = desired.memoryx.clone();
    if let Some(existing) = sets.get_opt(&names::memoryx(&job.name_any())).await? {
        checkpoints::keep_existing_claims(&mut memoryx, &existing)?;
    }
    apply_one(&sets, &memoryx).await
}

/// Removes the job's pods on lost nodes at once (no grace period: their kubelet cannot run one), so their
/// replacements (the operator's for engines, SwarmX and input workers; the StatefulSet's for MemoryX) start on
/// the nodes that are up, MemoryX's from the newest checkpoint on its volume. The node controller declared the
/// node lost only after hearing nothing from it for its grace period; should the node come back, its kubelet
/// finds the pods gone and stops what is left of them.
async fn take_back_lost(ctx: &Context, job: &TrainingJob, lost: &[String]) -> Result<(), Error> {
    if lost.is_empty() {
        return Ok(());
    }
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::background() };
    for name in lost {
        tracing::warn!(job = %job.name_any(), pod = %name, "the pod's node is lost: removing the pod");
        match pods.delete(name, &now).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Makes sure the job has its own TLS identity before any pod that mounts it exists. It is issued once (the
/// CA's key is dropped at once, so nobody can issue another certificate of this job) and never re-applied: a
/// Secret of a deleted namesake (another uid) is replaced, since it is another job's identity.
async fn ensure_identity(client: &Client, job: &TrainingJob, ns: &str) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = names::identity(&job.name_any());
    if let Some(existing) = secrets.get_opt(&name).await? {
        if identity::identity_belongs_to(&existing, job) {
            return Ok(());
        }
        tracing::info!(job = %job.name_any(), "replacing the identity of an earlier job of the same name");
        delete_ignoring_absent(&secrets, &name).await?;
    }
    let issued = wire::identity::issue(&job.name_any(), &identity::identity_names(&job.name_any(), ns))
        .map_err(|e| Error::Config(format!("cannot issue the job's identity: {e}")))?;
    match secrets.create(&kube::api::PostParams::default(), &identity::identity_secret(job, &issued)?).await {
        Ok(_) => Ok(()),
        // Another pass created it meanwhile: that one stands.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gives the job's CS-2s back: engines, SwarmX nodes and input workers go, and MemoryX scales to zero with its
/// checkpoint volume kept for a resume — except for a job that succeeded (`phase`), whose MemoryX keeps serving
/// its checkpoints (`wsctl checkpoint pull`) on no CS-2 until the job is deleted.
async fn release(ctx: &Context, job: &TrainingJob, phase: Option<Phase>, existing: &[Pod]) -> Result<(), Error> {
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    // MemoryX scales to zero below: the next assembly applies every child again.
    ctx.applied.forget(&job.uid().unwrap_or_default());
    let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let memoryx = names::memoryx(&job.name_any());
    if let Some(sts) = sets.get_opt(&memoryx).await?
        && phase != Some(Phase::Succeeded)
        && sts.spec.as_ref().and_then(|s| s.replicas) != Some(0)
    {
        let scale = serde_json::json!({ "spec": { "replicas": 0 } });
        sets.patch(&memoryx, &PatchParams::default(), &Patch::Merge(&scale)).await?;
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for p in existing {
        let role = p.labels().get(ROLE_LABEL).map(String::as_str);
        let holds_cs2_or_data = role.and_then(Role::from_name).is_some_and(|r| r != Role::Memoryx);
        if holds_cs2_or_data && p.metadata.deletion_timestamp.is_none() {
            delete_ignoring_absent(&pods_api, &p.name_any()).await?;
        }
    }
    Ok(())
}

/// What becomes of a deleted job's checkpoint claims: its `spec.checkpoint.retain`, or `Retain` for a job that
/// does not decode (nothing is deleted that the job might not have meant to give up).
fn retain_of(obj: &Watched) -> RetainPolicy {
    obj.0.as_ref().map_or(RetainPolicy::Retain, |job| job.spec.checkpoint.retain)
}

/// Removes every child of a deleted job by label (owner references would do it too, given a garbage collector;
/// this does not depend on one), but MemoryX's checkpoint claims only under `retain: Delete`, and then only the
/// job's own (by its uid): under `Retain` they outlive the job, and a claim an earlier job of the same name left
/// is never this job's to delete. It needs only the job's metadata, so a job that no longer decodes is cleaned
/// up too.
async fn cleanup(job: &ObjectMeta, retain: RetainPolicy, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = job.namespace.clone().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = job.name.clone().ok_or(Error::MissingField("metadata.name"))?;
    let selector = ListParams::default().labels(&format!("{JOB_LABEL}={name}"));
    let c = &ctx.client;
    if matches!(retain, RetainPolicy::Retain) {
        deleted_postmortem(c, job, &selector).await;
    }
    delete_labelled(&Api::<Pod>::namespaced(c.clone(), &ns), &selector).await?;
    delete_labelled(&Api::<StatefulSet>::namespaced(c.clone(), &ns), &selector).await?;
    delete_labelled(&Api::<Service>::namespaced(c.clone(), &ns), &selector).await?;
    delete_labelled(&Api::<ConfigMap>::namespaced(c.clone(), &ns), &selector).await?;
    delete_labelled(&Api::<Secret>::namespaced(c.clone(), &ns), &selector).await?;
    match (retain, job.uid.as_deref()) {
        (RetainPolicy::Delete, Some(uid)) => {
            let own = ListParams::default().labels(&checkpoints::claims_selector(&name, uid));
            delete_labelled(&Api::<PersistentVolumeClaim>::namespaced(c.clone(), &ns), &own).await?;
            let postmortem = ListParams::default().labels(&format!("{POSTMORTEM_LABEL}={name},{JOB_UID_LABEL}={uid}"));
            delete_labelled(&Api::<ConfigMap>::namespaced(c.clone(), &ns), &postmortem).await?;
        }
        _ => tracing::info!(job = %name, namespace = %ns, "checkpoint claims kept (spec.checkpoint.retain: Retain)"),
    }
    delete_labelled(&Api::<NetworkPolicy>::namespaced(c.clone(), &ns), &selector).await?;
    if let Some(uid) = job.uid.as_deref() {
        kueue::cluster::forget(c, &ns, uid).await?;
        ctx.applied.forget(uid);
    }
    tracing::info!(job = %name, namespace = %ns, "job deleted; children removed");
    Ok(Action::await_change())
}

/// Captures a deleted job's post-mortem from its pods (while they still exist), unless it failed or a capture
/// was kept already (the failure's, whose released pods say more than what is left); only under `retain: Retain` (under `Delete` it
/// would go with the job). Best effort: logged, never fatal.
async fn deleted_postmortem(client: &Client, job: &ObjectMeta, selector: &ListParams) {
    let ns = job.namespace.clone().unwrap_or_default();
    let name = job.name.clone().unwrap_or_default();
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // A job already gone (a second cleanup pass, after its finalizer went) has nothing more to show.
    let Ok(Some(now)) = jobs.get_opt(&name).await else { return };
    let status = now.status;
    if status.as_ref().and_then(|s| s.phase) == Some(Phase::Failed) || postmortem::kept(client, job).await {
        return;
    }
    let pods = match Api::<Pod>::namespaced(client.clone(), &ns).list(selector).await {
        Ok(list) => list.items,
        Err(e) => return tracing::warn!(job = %name, error = %e, "cannot list the pods for the post-mortem"),
    };
    let phase = status.as_ref().and_then(|s| s.phase).map_or_else(|| "unknown".into(), |p| p.to_string());
    let reason = format!("Deleted: the job was deleted while {phase}");
    let subject =
        postmortem::Subject { meta: job, status: status.and_then(|s| serde_json::to_string(&s).ok()), reason };
    if let Err(e) = postmortem::capture(client, &subject, &pods).await {
        tracing::warn!(job = %name, error = %e, "cannot keep the deleted job's post-mortem");
    }
}

async fn delete_labelled<K>(api: &Api<K>, selector: &ListParams) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    for obj in api.list(selector).await?.items {
        delete_ignoring_absent(api, &obj.name_any()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn with_status(mut p: Pod, phase: &str, ready: bool) -> Pod {
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    fn desired(n: u32) -> Vec<Pod> {
        let j = crds::testing::mlp_job("j", "ns", 2);
        let s = Settings { default_image: "i".into(), fan_out: 2, request_cs2: false, operator: Default::default() };
        desired::desired(&j, &s, n).unwrap().pods
    }

    #[test]
    fn the_status_patch_names_the_job_and_the_version_it_read() {
        let status = TrainingJobStatus { phase: Some(Phase::Running), ..Default::default() };
        let patch = status_patch("j", Some("42".into()), &status);
        let want = serde_json::json!({
            "apiVersion": "weightstream.dev/v1beta1",
            "kind": "TrainingJob",
            "metadata": { "name": "j", "resourceVersion": "42" },
            "status": { "phase": "Running" },
        });
        assert_eq!(patch, want);
    }

    /// The pool counts schedulable nodes' allocatable CS-2s; engines request the resource as long as nodes
    /// know it, even while none is allocatable (a device plugin restarting), so their pods do not change.
    #[test]
    fn failures_back_off_exponentially_to_a_ceiling() {
        let pauses: Vec<u64> = (1..=10).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(pauses, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
        assert_eq!(backoff(0), Duration::from_secs(2));
    }

    #[test]
    fn census_finds_missing_failed_outdated_and_surplus_pods() {
        let want = desired(2);
        let c = census(&[], &want, "j-memoryx", &BTreeSet::new());
        // The root, two engines and their two input workers.
        assert_eq!((c.ready, c.missing.len()), (false, 5));
        let first = c.unready.clone().expect("an unready pod named");
        assert_eq!(
            (first.pod.as_str(), first.namespace.as_str(), first.why.as_str()),
            ("j-swarmx-0-0", "ns", "not created yet")
        );

        let all_ready: Vec<Pod> = want.iter().cloned().map(|p| with_status(p, "Running", true)).collect();
        let c = census(&all_ready, &want, "j-memoryx", &BTreeSet::new());
        assert!(c.ready && c.missing.is_empty() && c.delete.is_empty());
        assert_eq!(c.unready, None);
        let mut one_starting = all_ready.clone();
        one_starting[1] = with_status(one_starting[1].clone(), "Running", false);
        let c = census(&one_starting, &want, "j-memoryx", &BTreeSet::new());
        assert_eq!(
            c.unready.map(|u| (u.pod, u.why)),
            Some(("j-engine-0".to_string(), "Running, its readiness probe not passed yet".to_string()))
        );

        let mut one_failed = all_ready.clone();
        one_failed[2] = with_status(one_failed[2].clone(), "Failed", false);
        let c = census(&one_failed, &want, "j-memoryx", &BTreeSet::new());
        assert_eq!(
            (c.ready, c.failed.clone(), c.delete.clone()),
            (false, vec!["j-engine-1".to_string()], vec!["j-engine-1".to_string()])
        );

        // Shrinking to one engine: the second engine and its input worker are surplus, and every pod reads
        // another job.yaml (the CS-2 count), so the rest are outdated.
        let c = census(&all_ready, &desired(1), "j-memoryx", &BTreeSet::new());
        assert!(c.delete.contains(&"j-engine-1".to_string()));
        assert!(
            c.delete.contains(&"j-input-1".to_string()) && c.delete.contains(&"j-input-0".to_string()),
            "{:?}",
            c.delete
        );
        // A failed input worker is replaced and counted like an engine.
        let mut input_failed = all_ready.clone();
        let i = input_failed.iter().position(|p| p.name_any() == "j-input-0").unwrap();
        input_failed[i] = with_status(input_failed[i].clone(), "Failed", false);
        assert_eq!(census(&input_failed, &want, "j-memoryx", &BTreeSet::new()).failed, vec!["j-input-0".to_string()]);
        assert!(c.delete.contains(&"j-swarmx-0-0".to_string()));
        assert!(c.failed.is_empty());
    }

    #[test]
    fn census_tells_a_refusal_from_a_fault() {
        use crds::contract::exit::REFUSED_STATUS;
        use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus};
        // `p` ended with `code`: now (a failed pod), or before its last restart (`last`, a weight server).
        let ended = |p: Pod, code: i32, last: bool| {
            let restart_count = if last { 1 } else { 0 };
            let mut p = with_status(p, if last { "Running" } else { "Failed" }, false);
            let state = ContainerState {
                terminated: Some(ContainerStateTerminated { exit_code: code, ..Default::default() }),
                ..Default::default()
            };
            let (state, last_state) = if last { (None, Some(state)) } else { (Some(state), None) };
            let status =
                ContainerStatus { name: "memoryx".into(), state, last_state, restart_count, ..Default::default() };
            p.status.as_mut().unwrap().container_statuses = Some(vec![status]);
            p
        };
        let want = desired(2);
        let mut pods: Vec<Pod> = want.iter().cloned().map(|p| with_status(p, "Running", true)).collect();
        let input = pods.iter().position(|p| p.name_any() == "j-input-0").unwrap();
        let engine = pods.iter().position(|p| p.name_any() == "j-engine-1").unwrap();
        pods[input] = ended(pods[input].clone(), REFUSED_STATUS, false);
        pods[engine] = ended(pods[engine].clone(), 137, false);
        let c = census(&pods, &want, "j-memoryx", &BTreeSet::new());
        assert_eq!(c.failed.len(), 2);
        assert_eq!(c.refused, vec!["j-input-0".to_string()], "a killed engine is a fault, replaced");
        // A weight server that restarted after refusing is named too; one that restarted after a crash is not.
        let refusing = ended(server("j-memoryx-0", 1), REFUSED_STATUS, true);
        let crashed = ended(server("j-memoryx-1", 1), 1, true);
        assert!(refusing.name_any() == "j-memoryx-0" && crashed.name_any() == "j-memoryx-1");
        let c = census(&[refusing, crashed], &want, "j-memoryx", &BTreeSet::new());
        assert_eq!((c.refused, c.memoryx_restarts), (vec!["j-memoryx-0".to_string()], Some(2)));
    }

    fn server(name: &str, restarts: i32) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            container_statuses: Some(vec![k8s_openapi::api::core::v1::ContainerStatus {
                name: "memoryx".into(),
                restart_count: restarts,
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    /// Every weight server's restarts count, not server 0's alone; other pods and other jobs' servers do not.
    #[test]
    fn census_sums_the_restarts_of_every_weight_server() {
        let want = desired(2);
        assert_eq!(
            census(&[], &want, "j-memoryx", &BTreeSet::new()).memoryx_restarts,
            None,
            "no server, nothing observed"
        );
        let mut pods = vec![server("j-memoryx-0", 1), server("j-memoryx-1", 0), server("j-memoryx-2", 2)];
        assert_eq!(census(&pods, &want, "j-memoryx", &BTreeSet::new()).memoryx_restarts, Some(3));
        pods.push(server("j-memoryx-extra", 5));
        pods.push(server("jj-memoryx-0", 7));
        pods.push(server("j-memoryx-", 9));
        let mut gone = server("j-memoryx-3", 4);
        gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        pods.push(gone);
        let c = census(&pods, &want, "j-memoryx", &BTreeSet::new());
        assert_eq!(c.memoryx_restarts, Some(3), "only the job's live servers");
        assert!(c.delete.is_empty(), "the StatefulSet's pods are not the operator's to delete");
        assert!(is_weight_server("j-memoryx-12", "j-memoryx") && !is_weight_server("j-memoryx-1a", "j-memoryx"));
    }

    /// The job's pods on a lost node, MemoryX's and those already being deleted too, are taken back (not as
    /// failures: a node lost is not the job's fault); the job is not ready until their replacements are.
    #[test]
    fn census_takes_back_every_pod_on_a_lost_node() {
        let on = |mut p: Pod, node: &str| {
            p.spec.get_or_insert_with(Default::default).node_name = Some(node.into());
            p
        };
        let want = desired(2);
        let mut pods: Vec<Pod> = want.iter().cloned().map(|p| on(with_status(p, "Running", true), "w1")).collect();
        let engine = pods.iter().position(|p| p.name_any() == "j-engine-1").expect("engine 1");
        pods[engine] = on(pods[engine].clone(), "w2");
        pods.push(on(server("j-memoryx-0", 0), "w2"));
        let mut leaving = on(server("j-memoryx-1", 0), "w2");
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        pods.push(leaving);
        pods.push(on(server("j-memoryx-2", 0), "w1"));
        let lost = BTreeSet::from(["w2".to_string()]);
        let c = census(&pods, &want, "j-memoryx", &lost);
        assert_eq!(c.lost, ["j-engine-1", "j-memoryx-0", "j-memoryx-1"]);
        assert!(c.failed.is_empty() && c.delete.is_empty() && c.missing.is_empty());
        let unready = c.unready.expect("not ready");
        assert_eq!(unready.pod, "j-engine-1");
        assert!(unready.why.contains("node w2 is lost"), "{}", unready.why);
        assert!(!c.ready);
        let c = census(&pods, &want, "j-memoryx", &BTreeSet::new());
        assert!(c.lost.is_empty() && c.ready, "the same pods with every node up");
    }
}
