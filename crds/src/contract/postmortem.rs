//! What a job leaves to be read once its pods are gone: a ConfigMap the operator writes when the job fails, when
//! it replaces a failed pod and when the job is deleted, holding the end of each pod's log, the job's Events and
//! status, why it failed and the pod and line that failed it. It is not owned by the job, so it outlives it as
//! the checkpoint claims do (`spec.checkpoint.retain`), and `wsctl logs export` reads it. Its keys and bounds are
//! spelled here, once, for the writer and the reader.

/// Label on a post-mortem ConfigMap naming its job (not [`super::JOB_LABEL`]: the job's children go with the
/// job by that label, and this one stays), beside [`super::JOB_UID_LABEL`] with the job's uid.
pub const POSTMORTEM_LABEL: &str = "weightstream.dev/postmortem-of";

/// Why the job failed (its `Failed` condition's reason and message), or what it was when it was deleted.
pub const REASON_KEY: &str = "reason";
/// The pod and the log line that failed the job, when one did: `POD (exit CODE): LINE`.
pub const CULPRIT_KEY: &str = "culprit";
/// The job's status as JSON when captured.
pub const STATUS_KEY: &str = "status.json";
/// The job's and its pods' Events, oldest first, one a line.
pub const EVENTS_KEY: &str = "events.txt";
/// The logs left out to keep within [`MAX_BYTES`], one pod a line.
pub const OMITTED_KEY: &str = "omitted";

/// Most bytes of one log's end kept.
pub const MAX_LOG_BYTES: usize = 16 << 10;
/// Lines of a log asked for (then cut to [`MAX_LOG_BYTES`]).
pub const LOG_LINES: i64 = 200;
/// Most Events kept (the newest).
pub const MAX_EVENTS: usize = 200;
/// Most bytes of all values together: well within a ConfigMap's 1 MiB.
pub const MAX_BYTES: usize = 768 << 10;

/// The ConfigMap's name for the job `job` of uid `uid`: one per job, so a later job of the same name keeps
/// the earlier one's.
pub fn config_map_name(job: &str, uid: &str) -> String {
    let short: String = uid.chars().filter(char::is_ascii_alphanumeric).take(8).collect();
    format!("{job}-postmortem-{short}")
}

/// The key of pod `pod`'s log: its running (or last) container's, its previous container's (after a restart),
/// or that of a failed pod the operator replaced.
pub fn log_key(pod: &str, which: LogOf) -> String {
    match which {
        LogOf::Current => format!("log.{pod}"),
        LogOf::Previous => format!("log.{pod}.previous"),
        LogOf::Replaced => format!("log.{pod}.replaced"),
    }
}

/// Which of a pod's logs a key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogOf {
    /// The container as it is (running, or ended).
    Current,
    /// The container before its last restart.
    Previous,
    /// A failed pod the operator deleted to replace it.
    Replaced,
}

/// The end of `text` within [`MAX_LOG_BYTES`], from a line's start (or a character's, for one long line).
pub fn log_tail(text: &str) -> &str {
    if text.len() <= MAX_LOG_BYTES {
        return text;
    }
    let cut = text.len() - MAX_LOG_BYTES;
    let start = text[cut..].find('\n').map(|i| cut + i + 1).filter(|&i| i < text.len());
    let start = start.unwrap_or_else(|| (cut..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len()));
    &text[start..]
}

/// Whether a container of `pod` has restarted: then its previous container's log is kept too.
pub fn restarted(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    statuses.is_some_and(|cs| cs.iter().any(|c| c.restart_count > 0))
}

/// An Event as one line, `WHEN TYPE REASON KIND/NAME: MESSAGE`, starting with when it last happened so that
/// sorted lines are in time order.
pub fn event_line(e: k8s_openapi::api::core::v1::Event) -> String {
    let when = e.last_timestamp.map(|t| t.0.to_string()).or(e.event_time.map(|t| t.0.to_string()));
    format!(
        "{} {} {} {}/{}: {}",
        when.unwrap_or_default(),
        e.type_.unwrap_or_default(),
        e.reason.unwrap_or_default(),
        e.involved_object.kind.unwrap_or_default(),
        e.involved_object.name.unwrap_or_default(),
        e.message.unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys_are_valid_for_kubernetes() {
        let name = config_map_name("train", "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert_eq!(name, "train-postmortem-1b4e28ba");
        assert_eq!(log_key("train-engine-0", LogOf::Previous), "log.train-engine-0.previous");
    }

    #[test]
    fn a_long_log_keeps_its_end_from_a_lines_start() {
        let text: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        let tail = log_tail(&text);
        assert!(tail.len() <= MAX_LOG_BYTES && tail.starts_with("line ") && tail.ends_with("line 4999\n"));
        let one = "é".repeat(MAX_LOG_BYTES);
        assert!(log_tail(&one).len() <= MAX_LOG_BYTES);
        assert_eq!(log_tail("short\n"), "short\n");
    }
}
