//! The one error of the API crate: why a manifest is not a job, said so a user can fix it. Below both
//! validation and the pretrained-model rules, which each return it.

/// Why a manifest is not a runnable job. Each message names the field and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The text is not YAML of the right shape (syntax, an unknown field or value, a missing field).
    #[error("invalid TrainingJob manifest at {path}: {message}")]
    Syntax {
        /// Where in the document the problem is (`spec.model.kind`).
        path: String,
        /// What the parser found.
        message: String,
    },
    /// The manifest parses but a value is out of range or inconsistent with another.
    #[error("invalid TrainingJob: {field}: {message}")]
    Invalid {
        /// The offending field (`spec.model.layers[2]`).
        field: String,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// A failure of ours, not of the manifest.
    #[error("internal error: {0}")]
    Internal(String),
}
