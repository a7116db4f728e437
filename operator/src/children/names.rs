//! The names of a job's children, derived from the job name alone so they are stable across restarts and a
//! replacement takes its predecessor's place (and DNS name).

/// The ConfigMap with the job manifest and plan.
pub fn config(job: &str) -> String {
    format!("{job}-config")
}
/// MemoryX's StatefulSet and its headless Service.
pub fn memoryx(job: &str) -> String {
    format!("{job}-memoryx")
}
/// The headless Service of the SwarmX pods.
pub fn swarmx_service(job: &str) -> String {
    format!("{job}-swarmx")
}
/// SwarmX node `index` at `level` of the tree (level 0 is the root).
pub fn swarmx(job: &str, level: usize, index: usize) -> String {
    format!("{job}-{}", plan::wiring::Component::Swarmx { level, index }.name())
}
/// The Secret with the job's TLS identity.
pub fn identity(job: &str) -> String {
    format!("{job}-identity")
}
/// The headless Service of the engine pods.
pub fn engine_service(job: &str) -> String {
    format!("{job}-engine")
}
/// Engine `index`: one per CS-2.
pub fn engine(job: &str, index: u32) -> String {
    format!("{job}-{}", plan::wiring::Component::Engine(index).name())
}
/// The headless Service of the input workers.
pub fn input_service(job: &str) -> String {
    format!("{job}-input")
}
/// Input worker `index`: `spec.data.workers` per CS-2, engine `e`'s in a contiguous block.
pub fn input(job: &str, index: u32) -> String {
    format!("{job}-{}", plan::wiring::Component::Input(index).name())
}
/// The job's NetworkPolicy.
pub fn network_policy(job: &str) -> String {
    format!("{job}-network")
}
