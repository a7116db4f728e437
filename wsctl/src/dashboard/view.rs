//! What the dashboard shows, as plain data: the jobs' table and one job's page, filled by a source (local runs or
//! a cluster's jobs) and drawn by [`super::html`]. No source knows HTML; no page knows where its data came from.

use crds::contract::Role;

/// The first page: every job (or local run) in one table.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// What is listed: `namespace ml`, `every namespace`, `3 local runs`.
    pub scope: String,
    /// Whether the rows carry a namespace (all namespaces listed).
    pub namespaces: bool,
    /// One row per job, in the source's order.
    pub rows: Vec<Row>,
}

/// One job in the table: every cell already text, `-` where nothing is known.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The job's page, relative to the dashboard's root (`jobs/ml/train`).
    pub href: String,
    /// The job's namespace (only when [`Listing::namespaces`]).
    pub namespace: String,
    /// The job's (or run folder's) name.
    pub name: String,
    /// Its phase (`Running`, `Queued`, `Succeeded`, …).
    pub phase: String,
    /// CS-2s held of those asked for (`2/4`).
    pub cs2: String,
    /// Steps done of all (`20/100`).
    pub step: String,
    /// The last step's loss.
    pub loss: String,
    /// Samples a second of the last steps.
    pub throughput: String,
    /// The time the remaining steps take.
    pub eta: String,
    /// The place in the queue (`#2`).
    pub queue: String,
    /// What a waiting job waits for, or why a failed one failed.
    pub reason: String,
}

/// One job's page.
#[derive(Clone, Debug, Default)]
pub struct Detail {
    /// The job's table row (its name, phase and progress).
    pub row: Row,
    /// Further facts as label and value (the plan, the summary), in order.
    pub facts: Vec<(String, String)>,
    /// Loss and throughput, step by step.
    pub curve: Curve,
    /// The appliance: every component, by role in the tree's order (MemoryX, SwarmX, engines, input workers).
    pub appliance: Vec<Component>,
    /// Kubernetes Events of the job and its pods, oldest first (none for a local run).
    pub events: Vec<Event>,
    /// The checkpoints kept, newest first.
    pub checkpoints: Vec<Checkpoint>,
    /// The tail of each role's log.
    pub logs: Vec<LogTail>,
    /// What could not be read (the records of a job whose MemoryX is not running, a log gone): said on the
    /// page instead of failing it.
    pub gaps: Vec<String>,
    /// The job has ended: the page stops refreshing.
    pub finished: bool,
}

/// The job's records: one point per recorded step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curve {
    /// Each step's training loss.
    pub loss: Vec<(u64, f64)>,
    /// The held-out loss and the step it was measured after.
    pub held_out: Option<(u64, f64)>,
    /// Each step's samples a second.
    pub throughput: Vec<(u64, f64)>,
}

/// One pod (or local process) of the appliance.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    /// What it runs.
    pub role: Role,
    /// Its name (the pod's, or the local process's).
    pub name: String,
    /// The node it runs on (`local` for a local process, `-` while unplaced).
    pub node: String,
    /// Its phase (`Running`, `Pending`, `exited`, …).
    pub phase: String,
    /// Container restarts.
    pub restarts: u32,
    /// The share of the run's wall time an engine computed, 0 to 1, once known.
    pub busy: Option<f64>,
    /// Bytes it moved a step, once known (MemoryX: the bytes streamed).
    pub bytes_per_step: Option<u64>,
}

/// A Kubernetes Event of the job or one of its pods.
#[derive(Clone, Debug, Default)]
pub struct Event {
    /// When it last happened (RFC 3339).
    pub time: String,
    /// `Normal` or `Warning`.
    pub kind: String,
    /// Its machine-readable reason.
    pub reason: String,
    /// The object it is about (`Pod/train-engine-0`).
    pub object: String,
    /// Its sentence, with how often it happened.
    pub message: String,
}

/// A checkpoint kept.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    /// The step it holds.
    pub step: u64,
    /// Its size.
    pub bytes: u64,
}

/// The last lines of one log.
#[derive(Clone, Debug, Default)]
pub struct LogTail {
    /// Whose log (the pod's or process's name).
    pub name: String,
    /// The lines.
    pub text: String,
}

/// `bytes` for people: `512 B`, `3.2 MiB`.
pub fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// The order of the appliance's tree on the page: the store, the fabric, the engines, then what feeds them.
pub const TREE_ORDER: [Role; 4] = [Role::Memoryx, Role::Swarmx, Role::Engine, Role::Input];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_written_in_the_largest_whole_unit() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
