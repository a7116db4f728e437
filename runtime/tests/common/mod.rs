//! What the runtime's network tests share: the small MLP they train, its MemoryX and the job's identity.
#![allow(dead_code)]

use crds::{Activation, ModelSpec, OptimizerKind, OptimizerSpec, ScheduleSpec};
use plan::layout::ModelLayout;
use runtime::memoryx::store::MemoryX;

/// Steps the test MemoryX plans for.
pub const STEPS: u64 = 10;
/// The seed of its weights and of the samplers.
pub const SEED: u64 = 3;

/// 784 → 32 → 10, half sparse.
pub fn layout() -> ModelLayout {
    ModelLayout::from_spec(&ModelSpec::mlp(vec![784, 32, 10], Activation::Relu, 0.5))
}

/// AdamW: two optimizer moments per weight.
pub fn optimizer() -> OptimizerSpec {
    OptimizerSpec {
        kind: OptimizerKind::Adamw,
        learning_rate: 0.002,
        weight_decay: 0.01,
        momentum: 0.9,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    }
}

/// A fresh MemoryX of the test model.
pub fn store() -> MemoryX {
    MemoryX::new(layout(), optimizer(), ScheduleSpec::default(), STEPS, SEED)
}

/// The test job's TLS identity, issued once per test binary.
pub fn identity() -> &'static wire::identity::Identity {
    static ID: std::sync::OnceLock<wire::identity::Identity> = std::sync::OnceLock::new();
    ID.get_or_init(|| wire::identity::issue("runtime-test", &[]).expect("an identity").job_identity())
}
