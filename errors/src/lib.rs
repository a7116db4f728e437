//! The data plane's one error type: every failure a job can meet in its plan, its data or a role, each worded
//! so the user knows what to change. Its kind is kept across the gRPC boundary (`wire::status`), so a refusal
//! reads the same to the caller however many hops it crossed.
//!
//! - [`units`]: the quantities its messages (and plans and reports) are written in.
#![warn(missing_docs)]

pub mod units;

/// Why a job could not run or continue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The manifest is not a runnable job.
    #[error(transparent)]
    Spec(#[from] crds::ApiError),
    /// The data set is missing, truncated or not what the job says it is.
    #[error("data: {0}")]
    Data(String),
    /// An engine was asked to hold more than its SRAM (or a plan would ask it to).
    #[error(
        "{engine}: SRAM budget exceeded: {what} needs {} but the engine has {}; lower spec.training.batchSize, \
         raise spec.cs2 to split the batch over more engines, or raise spec.engine.sramBytes",
        units::bytes(*needed), units::bytes(*available)
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
    /// A model program holds an operation the appliance cannot run (or runs only in another form): nothing was
    /// planned or started for it.
    #[error("unsupported model: {op} at {at}: {why}")]
    UnsupportedModel {
        /// The operation as the capture names it (e.g. `aten.fft_fft.default`).
        op: String,
        /// Where the model's source calls it (`file:line (code)`), or the graph node when no line was captured.
        at: String,
        /// Why it cannot run and what to write instead.
        why: String,
    },
    /// A role received a message that does not fit the job (unknown layer, wrong shape, out of order), or one
    /// names a layer, a shape or a count the plan does not have.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A message, a stream or a file asked a role to hold more than the job's plan allows (more samples than
    /// its shard, a layer larger than the layer's shape, a state larger than the model's): refused before
    /// anything was allocated for it, so no client, even one of the job itself, can make a role grow at will.
    #[error("{what} is {value}, beyond the {limit} this job's plan allows: refused before allocating for it")]
    OverLimit {
        /// The field or stream that is too large, naming where it came from.
        what: String,
        /// What the sender asked for (values, samples or bytes, as `what` says).
        value: u64,
        /// The most the plan allows.
        limit: u64,
    },
    /// A component (an engine, a SwarmX node, MemoryX) could not be reached or dropped out mid-step; the step
    /// can be rerun once it is back.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The job's identity (its certificates) is missing or unusable, so no role may talk to another.
    #[error("identity: {0}")]
    Identity(String),
    /// The program was asked to stop (SIGTERM: its pod evicted or its node drained; Ctrl-C) and stopped at a
    /// step boundary with its state checkpointed, so the job loses nothing and resumes from there. Not a failure
    /// of the job: it ends the process, with status 143 as after a plain SIGTERM.
    #[error("stopped on a termination signal after step {step}; {}", stopped_checkpoint(checkpoint.as_deref()))]
    Stopped {
        /// The step the saved state holds.
        step: u64,
        /// The checkpoint written, when the program has a checkpoint folder.
        checkpoint: Option<String>,
    },
    /// Reading or writing files of the job's output or checkpoints failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying failure.
        source: std::io::Error,
    },
}

/// The end of [`Error::Stopped`]'s message: where the job resumes from.
fn stopped_checkpoint(path: Option<&str>) -> String {
    match path {
        Some(p) => format!("its state is checkpointed at {p} and the job resumes from it"),
        None => "no checkpoint folder was given, so its state was not saved".into(),
    }
}

/// Shorthand used across the data plane.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Refuses `value` of `what` unless it is at most `limit`: the one check every bounded allocation makes
    /// before it is made.
    pub fn check_limit(what: impl FnOnce() -> String, value: u64, limit: u64) -> Result<()> {
        if value > limit {
            return Err(Error::OverLimit { what: what(), value, limit });
        }
        Ok(())
    }

    /// Whether the job's input is what is wrong (its spec, data, model or plan): running the same job again
    /// meets the same input and fails the same way, so a supervisor fails the job instead of restarting the
    /// role. Faults of the moment (a lost peer, an I/O error, a message out of turn) are not refusals.
    pub fn is_refusal(&self) -> bool {
        match self {
            Error::Spec(_) | Error::Data(_) | Error::OutOfSram { .. } | Error::Plan(_) => true,
            Error::UnsupportedModel { .. } => true,
            Error::Protocol(_) | Error::OverLimit { .. } | Error::Unavailable(_) | Error::Identity(_) => false,
            Error::Stopped { .. } | Error::Io { .. } => false,
        }
    }

    /// An I/O error with the path or action it happened on.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
}
