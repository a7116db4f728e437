//! The optimizers MemoryX runs on summed gradients, and the learning-rate schedule. They live with the
//! weights, not on the engines: the engines never see optimizer state.

use crds::{Decay, OptimizerKind, OptimizerSpec, ScheduleSpec};

/// Per-tensor optimizer state: first and second moments, allocated only by the rules that use them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptState {
    /// Momentum buffer or Adam's first moment.
    pub m: Vec<f32>,
    /// Adam's second moment.
    pub v: Vec<f32>,
}

impl OptState {
    /// State for a tensor of `n` values under `kind`.
    pub fn new(kind: OptimizerKind, n: usize) -> Self {
        match kind {
            OptimizerKind::Sgd => OptState::default(),
            OptimizerKind::Momentum => OptState { m: vec![0.0; n], v: Vec::new() },
            OptimizerKind::Adam | OptimizerKind::Adamw => OptState { m: vec![0.0; n], v: vec![0.0; n] },
        }
    }
}

/// How a model's state is trained: the optimizer, its learning-rate schedule over the run's `total_steps`, and
/// the seed its initial weights and masks are drawn from. What travels together to every store of that state
/// (MemoryX, each weight server's slice, each pipelined engine's replica).
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    /// The optimizer and its hyper-parameters.
    pub optimizer: OptimizerSpec,
    /// The learning-rate schedule.
    pub schedule: ScheduleSpec,
    /// Steps in the whole run: where the schedule ends.
    pub total_steps: u64,
    /// Seed of the initial weights and the masks.
    pub seed: u64,
    /// The pretrained Hugging Face folder the initial weights are read from instead of drawn (`spec.model.from`).
    pub from: Option<std::path::PathBuf>,
}

impl Recipe {
    /// The recipe of a job for a run of `total_steps`: its `training` spec, and the pretrained model it starts
    /// from, if any.
    pub fn of(spec: &crds::TrainingJobSpec, total_steps: u64) -> Recipe {
        let training = &spec.training;
        Recipe {
            optimizer: training.optimizer.clone(),
            schedule: training.schedule.clone(),
            total_steps,
            seed: training.seed,
            from: spec.model.from.as_ref().map(std::path::PathBuf::from),
        }
    }
}

/// The learning rate at `step` (0-based) of `total`: linear warm-up, then constant or cosine to the floor.
pub fn learning_rate(opt: &OptimizerSpec, schedule: &ScheduleSpec, step: u64, total: u64) -> f64 {
    let peak = opt.learning_rate;
    if step < schedule.warmup_steps {
        return peak * (step + 1) as f64 / schedule.warmup_steps as f64;
    }
    match schedule.decay {
        Decay::Constant => peak,
        Decay::Cosine => {
            let span = total.saturating_sub(schedule.warmup_steps).max(1) as f64;
            let progress = ((step - schedule.warmup_steps) as f64 / span).min(1.0);
            let floor = schedule.min_learning_rate;
            floor + 0.5 * (peak - floor) * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// Parameters per parallel piece of an update: large enough that splitting costs nothing, small enough that
/// both cores share every layer of interest.
const CHUNK: usize = 1 << 15;

/// Applies one update to `params` from `grads`. `t` is the 1-based update count (for Adam's bias
/// correction); `decay` is false for biases, which are never decayed. Every parameter's update is independent,
/// so large layers are updated in pieces on all cores with the same result as one pass.
pub fn update(
    opt: &OptimizerSpec,
    params: &mut [f32],
    grads: &[f32],
    state: &mut OptState,
    lr: f64,
    t: u64,
    decay: bool,
) {
    use rayon::prelude::*;
    if params.len() < 2 * CHUNK {
        update_slice(opt, params, grads, &mut state.m, &mut state.v, lr, t, decay);
        return;
    }
    let pieces = params.len().div_ceil(CHUNK);
    let mut ms: Vec<&mut [f32]> = state.m.chunks_mut(CHUNK).collect();
    ms.resize_with(pieces, Default::default);
    let mut vs: Vec<&mut [f32]> = state.v.chunks_mut(CHUNK).collect();
    vs.resize_with(pieces, Default::default);
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(ms.into_par_iter().zip(vs.into_par_iter()))
        .for_each(|((p, g), (m, v))| update_slice(opt, p, g, m, v, lr, t, decay));
}

/// [`update`] over one piece: `m` and `v` are the matching pieces of the optimizer's moments (empty when the
/// optimizer keeps none).
///
/// Multiversioned like the model's element-wise passes (the release build targets plain x86-64): Adam's
/// division and square root run sixteen lanes wide where the CPU allows, with the same result in every lane.
#[allow(clippy::too_many_arguments)]
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "x86_64+avx"))]
fn update_slice(
    opt: &OptimizerSpec,
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f64,
    t: u64,
    decay: bool,
) {
    let lr = lr as f32;
    let wd = if decay { opt.weight_decay as f32 } else { 0.0 };
    match opt.kind {
        OptimizerKind::Sgd => {
            for (p, &g) in params.iter_mut().zip(grads) {
                *p -= lr * (g + wd * *p);
            }
        }
        OptimizerKind::Momentum => {
            let mu = opt.momentum as f32;
            for ((p, &g), m) in params.iter_mut().zip(grads).zip(m) {
                *m = mu * *m + g + wd * *p;
                *p -= lr * *m;
            }
        }
        OptimizerKind::Adam | OptimizerKind::Adamw => {
            let (b1, b2, eps) = (opt.beta1 as f32, opt.beta2 as f32, opt.epsilon as f32);
            let c1 = 1.0 - (opt.beta1).powi(t as i32) as f32;
            let c2 = 1.0 - (opt.beta2).powi(t as i32) as f32;
            let decoupled = opt.kind == OptimizerKind::Adamw;
            for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                let g = if decoupled { g } else { g + wd * *p };
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                let step = (*m / c1) / ((*v / c2).sqrt() + eps);
                if decoupled {
                    *p -= lr * wd * *p;
                }
                *p -= lr * step;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: OptimizerKind) -> OptimizerSpec {
        OptimizerSpec {
            kind,
            learning_rate: 0.1,
            weight_decay: 0.0,
            momentum: 0.9,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }

    #[test]
    fn a_large_update_in_pieces_equals_one_pass() {
        for kind in [OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adamw] {
            let n = 5 * CHUNK + 17;
            let grads: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
            let mut opt = spec(kind);
            opt.weight_decay = 0.01;
            let (mut a, mut b) = (vec![0.3f32; n], vec![0.3f32; n]);
            let (mut sa, mut sb) = (OptState::new(kind, n), OptState::new(kind, n));
            for t in 1..=3 {
                update(&opt, &mut a, &grads, &mut sa, 0.1, t, true);
                update_slice(&opt, &mut b, &grads, &mut sb.m, &mut sb.v, 0.1, t, true);
            }
            assert_eq!(a, b, "{kind:?}");
            assert_eq!(sa.m, sb.m);
        }
    }

    #[test]
    fn every_rule_descends_a_quadratic() {
        for kind in [OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam, OptimizerKind::Adamw] {
            let opt = spec(kind);
            let mut p = vec![3.0f32, -2.0];
            let mut s = OptState::new(kind, 2);
            for t in 1..=200 {
                let g: Vec<f32> = p.iter().map(|x| 2.0 * x).collect();
                update(&opt, &mut p, &g, &mut s, 0.05, t, true);
            }
            assert!(p.iter().all(|x| x.abs() < 0.1), "{kind:?} ended at {p:?}");
        }
    }

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let opt = spec(OptimizerKind::Sgd);
        let sched = ScheduleSpec { warmup_steps: 10, decay: Decay::Cosine, min_learning_rate: 0.01 };
        assert!((learning_rate(&opt, &sched, 0, 100) - 0.01).abs() < 1e-12);
        assert!((learning_rate(&opt, &sched, 9, 100) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&opt, &sched, 10, 100) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&opt, &sched, 100, 100) - 0.01).abs() < 1e-9);
        let mid = learning_rate(&opt, &sched, 55, 100);
        assert!((mid - 0.055).abs() < 1e-9, "{mid}");
    }

    #[test]
    fn adamw_decays_weights_but_not_biases() {
        let mut opt = spec(OptimizerKind::Adamw);
        opt.weight_decay = 0.5;
        let (mut w, mut b) = (vec![1.0f32], vec![1.0f32]);
        update(&opt, &mut w, &[0.0], &mut OptState::new(opt.kind, 1), 0.1, 1, true);
        update(&opt, &mut b, &[0.0], &mut OptState::new(opt.kind, 1), 0.1, 1, false);
        assert!((w[0] - 0.95).abs() < 1e-6 && b[0] == 1.0);
    }
}
