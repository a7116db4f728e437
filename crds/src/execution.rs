//! How weights reach the engines: chosen in the spec and reported back in the status's plan. It lives apart
//! from both so `spec` (which names the status type for the CRD) and `status` each import it without
//! importing each other.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How weights reach the engine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ExecutionMode {
    /// Pipelined when all weights fit the engine's SRAM beside the activations, weight streaming otherwise.
    #[default]
    Auto,
    /// All weights resident on the engine.
    Pipelined,
    /// Weights streamed from MemoryX one layer at a time.
    WeightStreaming,
}
