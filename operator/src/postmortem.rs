//! A job's post-mortem (`crds::contract::postmortem`): the end of each pod's log, the job's Events and status,
//! why it failed and the pod and line that failed it, kept in a ConfigMap that outlives the pods (and, under
//! `retain: Retain`, the job). Written when the job fails (before its pods are released), when a failed pod is
//! replaced (before it is deleted) and when the job is deleted (before its children go). Gathering reads the
//! API (pods' logs, Events); what it keeps is chosen by pure functions below, within the contract's bounds.
//! A capture that fails is logged and never fails the pass: a post-mortem must not stop the job's own handling.

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::postmortem::{
    CULPRIT_KEY, EVENTS_KEY, LOG_LINES, LogOf, MAX_BYTES, MAX_EVENTS, OMITTED_KEY, POSTMORTEM_LABEL, REASON_KEY,
    STATUS_KEY, config_map_name, event_line, log_key, log_tail, restarted,
};
use crds::contract::{JOB_LABEL, JOB_UID_LABEL};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;

/// Most bytes of a log the API is asked for (the end is then cut to the contract's bound).
const LOG_REQUEST_BYTES: i64 = 1 << 20;

/// Which job, and why it is captured now.
pub struct Subject<'a> {
    /// The job's metadata (a deleted job may no longer decode: its metadata is enough).
    pub meta: &'a ObjectMeta,
    /// The job's status as JSON, when it decodes.
    pub status: Option<String>,
    /// Why: the job's failure, or what it was when deleted.
    pub reason: String,
}

/// A container that ended badly: the pod, the container's exit code, when it ended, and whether it is the
/// previous container (the pod restarted it since).
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    /// The pod.
    pub pod: String,
    /// Its exit code.
    pub exit_code: i32,
    /// When it ended (RFC 3339), for choosing the latest.
    pub finished: String,
    /// Whether it is the container before the current one.
    pub previous: bool,
}

/// The containers of `pods` that exited with a failure, latest first.
pub fn ended_badly(pods: &[Pod]) -> Vec<Ended> {
    let mut found = Vec::new();
    for p in pods {
        let statuses = p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map_or(&[][..], |v| &v[..]);
        for c in statuses {
            let now = c.state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| (t, false));
            let before = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| (t, true));
            for (t, previous) in now.into_iter().chain(before) {
                if t.exit_code != 0 {
                    let finished = t.finished_at.as_ref().map(|f| f.0.to_string()).unwrap_or_default();
                    found.push(Ended { pod: p.name_any(), exit_code: t.exit_code, finished, previous });
                }
            }
        }
    }
    found.sort_by(|a, b| b.finished.cmp(&a.finished));
    found
}

/// One line of a role's log as the post-mortem reads it: the roles log text (`TIME LEVEL target: message`) or,
/// with `--log-format json`, one JSON object a line (`timestamp`, `level`, `fields.message`, `target`).
struct LogLine {
    /// When it was logged (RFC 3339), or `~` (after every time) when the line has none.
    stamp: String,
    /// Whether it reports an error: an `ERROR` line, a program's `error: …` on exit, or a panic.
    error: bool,
    /// The line for people: a JSON line as `TIME LEVEL target: message`.
    text: String,
}

impl LogLine {
    fn read(line: &str) -> LogLine {
        if let Ok(serde_json::Value::Object(o)) = serde_json::from_str::<serde_json::Value>(line) {
            let field = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).unwrap_or_default().to_string();
            let (stamp, level) = (field(o.get("timestamp")), field(o.get("level")));
            let message = field(o.get("fields").and_then(|f| f.get("message")));
            let text = format!("{stamp} {level} {}: {message}", field(o.get("target")));
            let stamp = if stamp.is_empty() { "~".to_string() } else { stamp };
            return LogLine { stamp, error: level == "ERROR", text };
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        let timed = first.len() >= 20 && first.as_bytes()[0].is_ascii_digit() && first.contains('T');
        let error = line.contains(" ERROR ")
            || line.starts_with("ERROR")
            || line.starts_with("error:")
            || line.contains("panicked at");
        LogLine { stamp: if timed { first } else { "~" }.to_string(), error, text: line.to_string() }
    }
}

/// The line of `log` that says what went wrong: the first error, else the last line.
pub fn telling_line(log: &str) -> Option<String> {
    let lines: Vec<LogLine> = log.lines().map(str::trim).filter(|l| !l.is_empty()).map(LogLine::read).collect();
    let last = lines.last().map(|l| l.text.clone());
    lines.into_iter().find(|l| l.error).map(|l| l.text).or(last)
}

/// The pod a log key is of (`log.POD`, `log.POD.previous`, `log.POD.replaced`).
fn pod_of(key: &str) -> &str {
    let pod = key.strip_prefix("log.").unwrap_or(key);
    pod.strip_suffix(".previous").or_else(|| pod.strip_suffix(".replaced")).unwrap_or(pod)
}

/// The pod and line that failed the job, as `POD (exit CODE): LINE`: the earliest error any pod logged (the
/// others' errors tend to follow from it), else the latest container that exited with a failure and its last
/// line; `None` when no pod logged an error or failed.
pub fn culprit(pods: &[Pod], logs: &[(String, String)]) -> Option<String> {
    let ended = ended_badly(pods);
    let exit = |pod: &str| ended.iter().find(|e| e.pod == pod).map(|e| format!(" (exit {})", e.exit_code));
    let first_error = logs
        .iter()
        .flat_map(|(key, text)| text.lines().map(str::trim).map(LogLine::read).map(move |l| (l, pod_of(key))))
        .filter(|(l, _)| l.error)
        .min_by(|a, b| a.0.stamp.cmp(&b.0.stamp));
    if let Some((line, pod)) = first_error {
        return Some(format!("{pod}{}: {}", exit(pod).unwrap_or_default(), line.text));
    }
    let e = ended.first()?;
    let key = log_key(&e.pod, if e.previous { LogOf::Previous } else { LogOf::Current });
    let line = logs.iter().find(|(k, _)| *k == key).and_then(|(_, text)| telling_line(text));
    Some(format!("{} (exit {}): {}", e.pod, e.exit_code, line.as_deref().unwrap_or("(its log is empty)")))
}

/// What to keep: the reason, the culprit, the status, the Events and as many logs (in the given order) as fit
/// within the contract's [`MAX_BYTES`]; the logs left out are named under [`OMITTED_KEY`].
pub fn contents(
    subject: &Subject,
    culprit: Option<String>,
    events: &[String],
    logs: Vec<(String, String)>,
) -> BTreeMap<String, String> {
    let mut data = BTreeMap::new();
    data.insert(REASON_KEY.to_string(), subject.reason.clone());
    if let Some(c) = culprit {
        data.insert(CULPRIT_KEY.to_string(), c);
    }
    if let Some(s) = &subject.status {
        data.insert(STATUS_KEY.to_string(), s.clone());
    }
    let newest = &events[events.len().saturating_sub(MAX_EVENTS)..];
    data.insert(EVENTS_KEY.to_string(), newest.join("\n"));
    let mut used: usize = data.values().map(String::len).sum();
    let mut omitted = Vec::new();
    for (key, text) in logs {
        let tail = log_tail(&text);
        if used + key.len() + tail.len() > MAX_BYTES {
            omitted.push(key);
            continue;
        }
        used += key.len() + tail.len();
        data.insert(key, tail.to_string());
    }
    if !omitted.is_empty() {
        data.insert(OMITTED_KEY.to_string(), omitted.join("\n"));
    }
    data
}

/// Captures the job's post-mortem from `pods` and writes it; returns the culprit's words, if a container failed.
pub async fn capture(client: &Client, subject: &Subject<'_>, pods: &[Pod]) -> Result<Option<String>, Error> {
    let ns = subject.meta.namespace.clone().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut logs = Vec::new();
    for p in pods {
        logs.extend(pod_logs(&api, p).await);
    }
    let culprit = culprit(pods, &logs);
    let job = subject.meta.name.clone().unwrap_or_default();
    let events = events(client, &ns, &job, pods).await;
    write(client, subject.meta, contents(subject, culprit.clone(), &events, logs)).await?;
    Ok(culprit)
}

/// Whether the job `meta` has a post-mortem with a reason already (its failure's, or its deletion's).
pub async fn kept(client: &Client, meta: &ObjectMeta) -> bool {
    let (Some(ns), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else { return false };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let found = api.get_opt(&config_map_name(name, uid)).await.ok().flatten();
    found.and_then(|c| c.data).is_some_and(|d| d.contains_key(REASON_KEY))
}

/// Adds the logs of failed pods about to be replaced to the job's post-mortem (creating it if needed).
pub async fn keep_replaced(client: &Client, job: &TrainingJob, failed: &[&Pod]) -> Result<(), Error> {
    let ns = job.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut data = BTreeMap::new();
    for p in failed {
        let name = p.name_any();
        if let Some(text) = read_log(&api, &name, false).await {
            data.insert(log_key(&name, LogOf::Replaced), log_tail(&text).to_string());
        }
    }
    let pods: Vec<Pod> = failed.iter().map(|p| (*p).clone()).collect();
    let logs: Vec<(String, String)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(c) = culprit(&pods, &logs) {
        data.insert(CULPRIT_KEY.to_string(), c);
    }
    merge(client, &job.metadata, data).await
}

/// A pod's current log and, if it restarted, its previous container's.
async fn pod_logs(api: &Api<Pod>, pod: &Pod) -> Vec<(String, String)> {
    let name = pod.name_any();
    let restarted = restarted(pod);
    let mut logs = Vec::new();
    if let Some(text) = read_log(api, &name, false).await {
        logs.push((log_key(&name, LogOf::Current), text));
    }
    if restarted && let Some(text) = read_log(api, &name, true).await {
        logs.push((log_key(&name, LogOf::Previous), text));
    }
    logs
}

async fn read_log(api: &Api<Pod>, pod: &str, previous: bool) -> Option<String> {
    let params = LogParams {
        tail_lines: Some(LOG_LINES),
        limit_bytes: Some(LOG_REQUEST_BYTES),
        previous,
        ..LogParams::default()
    };
    match api.logs(pod, &params).await {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::debug!(pod, previous, error = %e, "no log to keep");
            None
        }
    }
}

/// The Events of the job and its pods, oldest first, as lines.
async fn events(client: &Client, ns: &str, job: &str, pods: &[Pod]) -> Vec<String> {
    let names: std::collections::BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
    let list = match Api::<CoreEvent>::namespaced(client.clone(), ns).list(&ListParams::default().limit(1000)).await {
        Ok(l) => l.items,
        Err(e) => return vec![format!("(the Events could not be read: {e})")],
    };
    let mut lines: Vec<String> = list
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref().is_some_and(|n| n == job || names.contains(n)))
        .map(event_line)
        .collect();
    lines.sort();
    lines
}

/// The post-mortem ConfigMap of the job `meta`, holding `data`: labelled with the job's name and uid, owned by
/// nothing.
fn config_map(meta: &ObjectMeta, data: BTreeMap<String, String>) -> Result<ConfigMap, Error> {
    let job = meta.name.clone().ok_or(Error::MissingField("metadata.name"))?;
    let uid = meta.uid.clone().ok_or(Error::MissingField("metadata.uid"))?;
    let labels =
        BTreeMap::from([(POSTMORTEM_LABEL.to_string(), job.clone()), (JOB_UID_LABEL.to_string(), uid.clone())]);
    debug_assert!(!labels.contains_key(JOB_LABEL), "the job's children go by that label; this one stays");
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name(&job, &uid)),
            namespace: meta.namespace.clone(),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    })
}

/// Writes the whole post-mortem (replacing an earlier capture's, but for the logs of replaced pods it holds).
async fn write(client: &Client, meta: &ObjectMeta, mut data: BTreeMap<String, String>) -> Result<(), Error> {
    let cm = config_map(meta, BTreeMap::new())?;
    let (name, ns) = (cm.name_any(), cm.namespace().unwrap_or_default());
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    if let Some(old) = api.get_opt(&name).await? {
        let replaced = old.data.unwrap_or_default().into_iter().filter(|(k, _)| k.ends_with(".replaced"));
        let room = MAX_BYTES.saturating_sub(data.values().map(String::len).sum());
        let mut used = 0;
        for (k, v) in replaced {
            used += k.len() + v.len();
            if used <= room {
                data.entry(k).or_insert(v);
            }
        }
    }
    put(&api, config_map(meta, data)?).await
}

/// Adds `data` to the job's post-mortem, keeping what it holds (within the bound: older replaced logs go first).
async fn merge(client: &Client, meta: &ObjectMeta, data: BTreeMap<String, String>) -> Result<(), Error> {
    let cm = config_map(meta, BTreeMap::new())?;
    let (name, ns) = (cm.name_any(), cm.namespace().unwrap_or_default());
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut all = api.get_opt(&name).await?.and_then(|c| c.data).unwrap_or_default();
    all.extend(data);
    while all.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_BYTES {
        let Some(oldest) = all.keys().find(|k| k.ends_with(".replaced")).cloned() else { break };
        all.remove(&oldest);
    }
    put(&api, config_map(meta, all)?).await
}

/// Creates the ConfigMap, or replaces the data of the one there.
async fn put(api: &Api<ConfigMap>, cm: ConfigMap) -> Result<(), Error> {
    let name = cm.name_any();
    match api.create(&PostParams::default(), &cm).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = serde_json::json!({ "data": cm.data });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ()).map_err(Error::from)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, exit: Option<(i32, &str)>, previous: Option<(i32, &str)>) -> Pod {
        let term = |(code, at): (i32, &str)| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                finished_at: Some(Time(at.parse().unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "main".into(),
                    state: exit.map(term),
                    last_state: previous.map(term),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The earliest error any pod logged is the culprit, with its pod's exit code if it failed; without an
    /// error line, the latest failed container and its last line; a clean exit is no culprit.
    #[test]
    fn the_earliest_error_or_the_latest_failed_container_is_named() {
        let pods = vec![
            pod("j-memoryx-0", Some((0, "2026-11-30T10:00:09Z")), None),
            pod("j-input-0", Some((1, "2026-11-30T10:00:05Z")), None),
            pod("j-engine-1", None, Some((137, "2026-11-30T10:00:01Z"))),
        ];
        let ended = ended_badly(&pods);
        assert_eq!(ended.iter().map(|e| e.pod.as_str()).collect::<Vec<_>>(), ["j-input-0", "j-engine-1"]);
        assert!(ended[1].previous);
        let logs = vec![
            (
                log_key("j-memoryx-0", LogOf::Current),
                "2026-11-30T10:00:07.5Z ERROR runtime: input worker 0 failed\n".to_string(),
            ),
            (
                log_key("j-input-0", LogOf::Current),
                "2026-11-30T10:00:02Z  INFO serving\n2026-11-30T10:00:04Z ERROR data: cannot read tokenizer b.json\n"
                    .to_string(),
            ),
        ];
        assert_eq!(
            culprit(&pods, &logs).as_deref(),
            Some("j-input-0 (exit 1): 2026-11-30T10:00:04Z ERROR data: cannot read tokenizer b.json")
        );
        let quiet = vec![(log_key("j-engine-1", LogOf::Previous), "INFO stepping\n".to_string())];
        assert_eq!(culprit(&pods, &quiet).as_deref(), Some("j-input-0 (exit 1): (its log is empty)"));
        assert_eq!(culprit(&pods[..1], &[]), None);
        // The roles' JSON logs: the earliest error by its timestamp, in words.
        let json = |at: &str| {
            format!(
                "{{\"timestamp\":\"{at}\",\"level\":\"ERROR\",\"fields\":{{\"message\":\"bad\"}},\"target\":\"in\"}}\n"
            )
        };
        let logs = vec![
            (log_key("j-input-0", LogOf::Current), json("2026-11-30T09:56:38.152Z")),
            (log_key("j-input-2", LogOf::Current), json("2026-11-30T09:56:38.016Z")),
        ];
        assert_eq!(culprit(&pods[..1], &logs).as_deref(), Some("j-input-2: 2026-11-30T09:56:38.016Z ERROR in: bad"));
    }

    /// Everything fits within the bound; logs that do not are named, not kept in part.
    #[test]
    fn the_contents_stay_within_the_bound_and_name_what_was_left_out() {
        let meta = ObjectMeta::default();
        let subject = Subject { meta: &meta, status: Some("{}".into()), reason: "Failed: boom".into() };
        let big = "x".repeat(crds::contract::postmortem::MAX_LOG_BYTES - 1) + "\n";
        let logs: Vec<(String, String)> = (0..80).map(|i| (format!("log.p-{i}"), big.clone())).collect();
        let events: Vec<String> = (0..500).map(|i| format!("event {i}")).collect();
        let data = contents(&subject, Some("p-3 (exit 1): boom".into()), &events, logs);
        let total: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(total <= MAX_BYTES + OMITTED_KEY.len() + data[OMITTED_KEY].len(), "{total}");
        assert!(data[OMITTED_KEY].lines().count() > 0 && data.contains_key("log.p-0"));
        assert_eq!(data[EVENTS_KEY].lines().count(), MAX_EVENTS);
        assert!(data[EVENTS_KEY].ends_with("event 499"));
        assert_eq!(data[REASON_KEY], "Failed: boom");
    }

    #[test]
    fn a_telling_line_is_the_last_error_else_the_last_line() {
        assert_eq!(telling_line("a\nerror: x\nb\n").as_deref(), Some("error: x"));
        assert_eq!(telling_line("2026-11-30T10:00:04Z ERROR y\nb\n").as_deref(), Some("2026-11-30T10:00:04Z ERROR y"));
        assert_eq!(telling_line("a\nb\n\n").as_deref(), Some("b"));
        let json = r#"{"timestamp":"2026-11-30T09:56:38.15Z","level":"ERROR","fields":{"message":"bad tokenizer"},"target":"input"}"#;
        assert_eq!(telling_line(json).as_deref(), Some("2026-11-30T09:56:38.15Z ERROR input: bad tokenizer"));
        assert_eq!(telling_line(""), None);
    }
}
