//! A model program on the engine: the interpreter ([`crate::model::program::exec`]) run stage by stage over the
//! units MemoryX streams, each unit's matrix reached through the same [`StreamedLinear`] calls as the built-in
//! families (so dense and sparse weights take the same kernels), the program's row-major values converted to
//! and from the engine's feature-major matrices at each unit.

use std::sync::Arc;

use super::hw::Work;
use super::linear::{Grads, StreamedLinear};
use super::net::Net;
use crate::model::program::exec::{Constants, Exec, Units};
use crate::model::program::tensor::Tensor;
use crate::protocol::WeightPayload;
use errors::{Error, Result};
use kernels::small::transpose;
use kernels::tensor::Mat;
use plan::program::{Op, Program, resolve};

/// The most values a program's buffers may hold together (rotary tables and masks are a few thousand).
pub const MAX_CONSTANT_VALUES: usize = 1 << 26;

/// Reads the buffers `program` uses from its folder's weights, each checked to have the shape the program
/// declares, their total bounded before anything is read.
pub fn constants(program: &Program, folder: &std::path::Path) -> Result<Constants> {
    let total: usize = program.constants.iter().map(|c| c.len()).sum();
    Error::check_limit(|| "values of the program's buffers".into(), total as u64, MAX_CONSTANT_VALUES as u64)?;
    let weights = crate::memoryx::huggingface::Folder::open(folder)?;
    program
        .constants
        .iter()
        .map(|c| Ok((c.name.clone(), Tensor::new(c.shape.clone(), weights.tensor(&c.name, &c.shape)?))))
        .collect()
}

/// The buffers of the program in `program.folder`, read once per process. A folder whose buffers cannot be
/// read gives none, and the first step that needs one fails naming it (the roles read them before they start,
/// so that is where the reason is reported).
pub fn shared_constants(program: &Program) -> Arc<Constants> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<std::path::PathBuf, Arc<Constants>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(c) = cache.lock().ok().and_then(|c| c.get(&program.folder).cloned()) {
        return c;
    }
    match constants(program, &program.folder) {
        Ok(c) => {
            let c = Arc::new(c);
            if let Ok(mut cache) = cache.lock() {
                cache.insert(program.folder.clone(), c.clone());
            }
            c
        }
        Err(e) => {
            tracing::error!("the buffers of the program in {}: {e}", program.folder.display());
            Arc::default()
        }
    }
}

/// A program's resident state for one shard.
pub(super) struct ProgramNet {
    exec: Exec,
    /// Why the logits' gradient could not start the backward pass, reported by the next backward call.
    refused: Option<Error>,
}

impl ProgramNet {
    pub(super) fn new(program: Arc<Program>, constants: Arc<Constants>) -> Self {
        ProgramNet { exec: Exec::new(program, constants), refused: None }
    }
}

/// The unit of the stage running, as the interpreter reaches it: its streamed weights, the work it notes and
/// the gradients it collects.
struct Streamed<'a, 's> {
    unit: StreamedLinear<'s>,
    works: &'a mut Vec<Work<'s>>,
    /// The unit's weight gradient as its kernel gives it (at the mask's positions when sparse).
    weights: Option<Vec<f32>>,
    vector: Vec<f32>,
}

impl Streamed<'_, '_> {
    fn check(&self, u: usize) -> Result<()> {
        if u != self.unit.layer {
            return Err(Error::Protocol(format!(
                "the program asked for unit {u} while unit {} streamed",
                self.unit.layer
            )));
        }
        Ok(())
    }
}

/// `x` (`[.., cols]`, row-major, every leading dimension a row) as the engine's feature-major matrix.
fn features(x: &Tensor) -> Mat {
    let cols = x.last();
    let rows = x.len() / cols.max(1);
    Mat::from_vec(cols, rows, transpose(&x.data, rows, cols))
}

/// The engine's feature-major `m` back as row-major `[tokens, features]`.
fn rows(m: &Mat) -> Tensor {
    Tensor::new(vec![m.cols, m.rows], transpose(&m.data, m.rows, m.cols))
}

impl Units for Streamed<'_, '_> {
    fn linear(&mut self, u: usize, x: &Tensor) -> Result<Tensor> {
        self.check(u)?;
        Ok(rows(&self.unit.forward(&features(x), self.works)?))
    }

    fn linear_backward(&mut self, u: usize, x: &Tensor, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        self.check(u)?;
        let ((weights, bias), dx) = self.unit.backward(&features(x), &features(dy), need_dx, self.works)?;
        self.weights = Some(weights);
        if let Some(slot) = self.vector.get_mut(..bias.len()) {
            add(slot, &bias);
        }
        Ok(dx.as_ref().map(rows))
    }

    fn embedding(&mut self, u: usize, ids: &[u32]) -> Result<Tensor> {
        self.check(u)?;
        let WeightPayload::Dense(table) = &self.unit.stream.weights else {
            return Err(Error::Protocol("an embedding must stream dense".into()));
        };
        let width = self.unit.shape.inputs;
        let mut y = Vec::with_capacity(ids.len() * width);
        for &id in ids {
            let row = table.get(id as usize * width..(id as usize + 1) * width);
            y.extend_from_slice(row.ok_or_else(|| Error::Protocol(format!("row {id} is not in the embedding")))?);
        }
        self.works.push(Work::Elementwise { ops: y.len() as u64 });
        Ok(Tensor::new(vec![ids.len(), width], y))
    }

    fn embedding_backward(&mut self, u: usize, ids: &[u32], dy: &Tensor) -> Result<()> {
        self.check(u)?;
        let width = self.unit.shape.inputs;
        let table = self.weights.get_or_insert_with(|| vec![0.0; self.unit.shape.dense_weights()]);
        for (&id, g) in ids.iter().zip(dy.data.chunks(width.max(1))) {
            let row = table.get_mut(id as usize * width..(id as usize + 1) * width);
            add(row.ok_or_else(|| Error::Protocol(format!("row {id} is not in the embedding")))?, g);
        }
        self.works.push(Work::Elementwise { ops: dy.len() as u64 });
        Ok(())
    }

    fn vector(&self, u: usize) -> Result<&[f32]> {
        self.check(u)?;
        Ok(&self.unit.stream.bias)
    }

    fn add_vector_grad(&mut self, u: usize, offset: usize, g: &[f32]) -> Result<()> {
        self.check(u)?;
        let len = self.vector.len();
        let slot = self.vector.get_mut(offset..offset + g.len()).ok_or_else(|| {
            Error::Protocol(format!("unit {u}'s vector holds {len} values, not {}", offset + g.len()))
        })?;
        add(slot, g);
        Ok(())
    }
}

fn add(acc: &mut [f32], g: &[f32]) {
    acc.iter_mut().zip(g).for_each(|(a, b)| *a += b);
}

/// The work of unit `u`'s stage beside its unit: element-wise passes over every value, products for
/// attention and matrix products.
fn stage_work(program: &Program, u: usize, batch: usize, works: &mut Vec<Work<'_>>) {
    for i in program.stage(u) {
        let node = &program.nodes[i];
        let shape = resolve(&node.shape, batch);
        let values: usize = shape.iter().product();
        match node.op {
            Op::Linear { .. } | Op::Embedding { .. } | Op::Tokens | Op::Constant { .. } | Op::Vector { .. } => {}
            Op::Attention { .. } => {
                let r = shape.len();
                let (t, d) = (shape[r - 2], shape[r - 1]);
                let heads = values / (t * d).max(1);
                works.extend([Work::Gemm { m: t, n: t * heads, k: d }, Work::Gemm { m: t, n: d * heads, k: t }]);
            }
            Op::MatMul => {
                let a = resolve(&program.nodes[node.inputs[0]].shape, batch);
                let k = a.last().copied().unwrap_or(1);
                let r = shape.len();
                works.push(Work::Gemm { m: shape[r - 2], n: values / shape[r - 2].max(1), k });
            }
            _ => works.push(Work::Elementwise { ops: values as u64 }),
        }
    }
}

impl Net for ProgramNet {
    fn begin(&mut self, inputs: Mat) -> Result<()> {
        let tokens = super::net::token_ids(&inputs, self.exec.program().vocab)?;
        self.exec.begin(tokens)
    }

    fn forward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Option<Mat>> {
        let u = unit.layer;
        stage_work(self.exec.program(), u, self.exec.batch(), works);
        let mut streamed = Streamed { unit, works, weights: None, vector: Vec::new() };
        let logits = self.exec.forward(u, &mut streamed)?;
        Ok(logits.map(|l| {
            let vocab = l.last();
            let tokens = l.len() / vocab.max(1);
            Mat::from_vec(vocab, tokens, transpose(&l.data, tokens, vocab))
        }))
    }

    fn start_backward(&mut self, d_logits: Mat) {
        let program = self.exec.program();
        let shape = vec![self.exec.batch(), program.context, d_logits.rows];
        if shape.iter().product::<usize>() != d_logits.data.len() {
            self.refused = Some(Error::Protocol(format!("a logits gradient of {} values", d_logits.data.len())));
            return;
        }
        let g = Tensor::new(shape, transpose(&d_logits.data, d_logits.rows, d_logits.cols));
        self.refused = self.exec.start_backward(g).err();
    }

    fn backward<'s>(&mut self, unit: StreamedLinear<'s>, works: &mut Vec<Work<'s>>) -> Result<Grads> {
        if let Some(e) = self.refused.take() {
            return Err(e);
        }
        let (u, shape) = (unit.layer, unit.shape);
        // A unit the loss does not reach gets a zero gradient of the length its kernel would give.
        let zeros = match &unit.stream.weights {
            WeightPayload::Sparse { pattern, .. } if shape.tied_to.is_none() => pattern.nnz(),
            _ => shape.dense_weights(),
        };
        stage_work(self.exec.program(), u, self.exec.batch(), works);
        let mut streamed = Streamed { unit, works, weights: None, vector: vec![0.0; shape.vector_len()] };
        self.exec.backward(u, &mut streamed)?;
        let Streamed { weights, vector, .. } = streamed;
        Ok((weights.unwrap_or_else(|| vec![0.0; zeros]), vector))
    }

    fn resident_bytes(&self) -> u64 {
        self.exec.resident_bytes()
    }

    fn clear(&mut self) {
        self.exec.clear();
    }
}
