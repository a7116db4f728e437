//! Why a job has no appliance: the one error the plan gives, each worded so the user knows what to change.

/// Why a job cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The manifest is not a runnable job.
    #[error(transparent)]
    Spec(#[from] crds::ApiError),
    /// An engine would have to hold more than its SRAM.
    #[error(
        "{engine}: SRAM budget exceeded: {what} needs {} but the engine has {}; lower spec.training.batchSize, \
         raise spec.cs2 to split the batch over more engines, or raise spec.engine.sramBytes",
        crate::units::bytes(*needed), crate::units::bytes(*available)
    )]
    OutOfSram {
        /// Which engine.
        engine: String,
        /// What it was holding when the budget ran out.
        what: String,
        /// Bytes it needed.
        needed: u64,
        /// Bytes it has.
        available: u64,
    },
    /// The appliance cannot be assembled as the spec asks (MemoryX's servers or their memory cannot hold the
    /// model); the message gives the numbers and what to change.
    #[error("plan: {0}")]
    Plan(String),
    /// A message or stream names a layer, a shape or a count the plan does not have.
    #[error("protocol: {0}")]
    Protocol(String),
}

/// Shorthand for the plan's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
