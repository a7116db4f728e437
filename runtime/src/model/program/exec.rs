//! The interpreter of a model program: it runs one stage at a time, forward in unit order and backward in
//! reverse, keeping every value its stages computed until the backward pass has used it. The matrices are not
//! its own: each stage's unit is reached through [`Units`], which the engine implements over the weights
//! streamed to it (dense or sparse) and the tests over plain matrices ([`DenseUnits`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::ops;
use super::tensor::Tensor;
use errors::{Error, Result};
use plan::program::{Op, Program, UnitKind, resolve};

/// The buffers a program reads (rotary tables, masks), by name.
pub type Constants = HashMap<String, Tensor>;

/// The stream units as the interpreter reaches them: only the unit of the stage running is ever asked for.
pub trait Units {
    /// Unit `u`'s matrix applied to the rows of `x` (`[.., inputs]`, every leading dimension a row), its bias
    /// added: `[rows, outputs]`.
    fn linear(&mut self, u: usize, x: &Tensor) -> Result<Tensor>;
    /// Backward through [`Units::linear`]: records the weight and bias gradients, returns the input's when
    /// `need_dx`.
    fn linear_backward(&mut self, u: usize, x: &Tensor, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>>;
    /// Rows `ids` of unit `u`'s matrix (`[ids, width]`); the ids are checked to be rows of it.
    fn embedding(&mut self, u: usize, ids: &[u32]) -> Result<Tensor>;
    /// Backward through [`Units::embedding`]: records the gradient of the rows looked up.
    fn embedding_backward(&mut self, u: usize, ids: &[u32], dy: &Tensor) -> Result<()>;
    /// Unit `u`'s vector: its bias, then the vector parameters of its stage.
    fn vector(&self, u: usize) -> Result<&[f32]>;
    /// Adds `g` to unit `u`'s vector gradient from `offset`.
    fn add_vector_grad(&mut self, u: usize, offset: usize, g: &[f32]) -> Result<()>;
}

/// One shard's run of a program.
pub struct Exec {
    program: Arc<Program>,
    constants: Arc<Constants>,
    batch: usize,
    tokens: Vec<u32>,
    values: Vec<Option<Tensor>>,
    grads: Vec<Option<Tensor>>,
}

fn missing(what: &str, i: usize) -> Error {
    Error::Protocol(format!("the program's node {i} has no {what}: its stages ran out of order"))
}

impl Exec {
    /// An interpreter for `program` reading `constants`.
    pub fn new(program: Arc<Program>, constants: Arc<Constants>) -> Self {
        Exec { program, constants, batch: 0, tokens: Vec::new(), values: Vec::new(), grads: Vec::new() }
    }

    /// The program it runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Sequences in the shard.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Drops every value, gradient and token held.
    pub fn clear(&mut self) {
        self.values.clear();
        self.grads.clear();
        self.tokens.clear();
    }

    /// Starts a shard: `tokens` hold whole sequences of the program's context. Drops the previous shard's values.
    pub fn begin(&mut self, tokens: Vec<u32>) -> Result<()> {
        let context = self.program.context.max(1);
        if !tokens.len().is_multiple_of(context) {
            return Err(Error::Protocol(format!("{} tokens are not whole sequences of {context}", tokens.len())));
        }
        self.batch = tokens.len() / context;
        self.tokens = tokens;
        self.values = vec![None; self.program.nodes.len()];
        self.grads = vec![None; self.program.nodes.len()];
        Ok(())
    }

    /// Bytes of values and gradients held.
    pub fn resident_bytes(&self) -> u64 {
        self.values.iter().chain(&self.grads).flatten().map(Tensor::bytes).sum::<u64>() + 4 * self.tokens.len() as u64
    }

    fn value(&self, i: usize) -> Result<&Tensor> {
        self.values.get(i).and_then(Option::as_ref).ok_or_else(|| missing("value", i))
    }

    /// Runs unit `u`'s stage; after the last stage, returns the logits (`[batch, context, vocab]`).
    pub fn forward(&mut self, u: usize, units: &mut dyn Units) -> Result<Option<Tensor>> {
        for i in self.program.stage(u) {
            let y = self.node_forward(u, i, units)?;
            self.values[i] = Some(y);
        }
        if u + 1 == self.program.units.len() {
            return Ok(Some(self.value(self.program.output)?.clone()));
        }
        Ok(None)
    }

    fn node_forward(&self, u: usize, i: usize, units: &mut dyn Units) -> Result<Tensor> {
        let node = &self.program.nodes[i];
        let shape = resolve(&node.shape, self.batch);
        let y = match &node.op {
            Op::Tokens => Tensor::new(shape.clone(), self.tokens.iter().map(|&t| t as f32).collect()),
            Op::Constant { name } => {
                let c = self.constants.get(name).ok_or_else(|| Error::Data(format!("the buffer {name} is missing")))?;
                c.clone()
            }
            Op::Vector { param, offset } => {
                let len = self.program.params[*param].len();
                let v = units.vector(u)?;
                let values = v.get(*offset..offset + len).ok_or_else(|| {
                    Error::Protocol(format!("unit {u}'s vector holds {} values, not {}", v.len(), offset + len))
                })?;
                Tensor::new(shape.clone(), values.to_vec())
            }
            Op::Linear { .. } => units.linear(u, self.value(node.inputs[0])?)?.reshaped(shape.clone()),
            Op::Embedding { unit } => {
                let rows = self.program.units[*unit].outputs;
                let ids = indices(self.value(node.inputs[0])?, rows)?;
                units.embedding(u, &ids)?.reshaped(shape.clone())
            }
            op => {
                let inputs = node.inputs.iter().map(|&j| self.value(j)).collect::<Result<Vec<_>>>()?;
                ops::forward(op, &inputs, &shape)
            }
        };
        if y.shape != shape || y.data.len() != shape.iter().product::<usize>() {
            return Err(Error::Protocol(format!("node {i} computed {:?}, not {shape:?}", y.shape)));
        }
        Ok(y)
    }

    /// Starts the backward pass from the logits' gradient.
    pub fn start_backward(&mut self, d_logits: Tensor) -> Result<()> {
        let out = self.program.output;
        if d_logits.shape != self.value(out)?.shape {
            return Err(Error::Protocol(format!("a logits gradient of {:?}", d_logits.shape)));
        }
        self.grads[out] = Some(d_logits);
        Ok(())
    }

    /// Runs unit `u`'s stage backward, handing the unit its gradients; drops the values it no longer needs.
    pub fn backward(&mut self, u: usize, units: &mut dyn Units) -> Result<()> {
        for i in self.program.stage(u).rev() {
            if let Some(dy) = self.grads[i].take()
                && self.program.nodes[i].learns
            {
                self.node_backward(u, i, &dy, units)?;
            }
            self.values[i] = None;
        }
        Ok(())
    }

    fn node_backward(&mut self, u: usize, i: usize, dy: &Tensor, units: &mut dyn Units) -> Result<()> {
        let program = self.program.clone();
        let node = &program.nodes[i];
        let learns = |j: usize| program.nodes[j].learns;
        match &node.op {
            Op::Tokens | Op::Constant { .. } => {}
            Op::Vector { offset, .. } => units.add_vector_grad(u, *offset, &dy.data)?,
            Op::Linear { .. } => {
                let j = node.inputs[0];
                let x = self.value(j)?;
                if let Some(dx) = units.linear_backward(u, x, dy, learns(j))? {
                    let shape = x.shape.clone();
                    self.add_grad(j, dx.reshaped(shape));
                }
            }
            Op::Embedding { unit } => {
                let ids = indices(self.value(node.inputs[0])?, program.units[*unit].outputs)?;
                units.embedding_backward(u, &ids, dy)?;
            }
            op => {
                let wants: Vec<bool> = node.inputs.iter().map(|&j| learns(j)).collect();
                let grads = {
                    let inputs = node.inputs.iter().map(|&j| self.value(j)).collect::<Result<Vec<_>>>()?;
                    ops::backward(op, &inputs, self.value(i)?, dy, &wants)
                };
                for ((&j, g), want) in node.inputs.iter().zip(grads).zip(wants) {
                    if let (Some(g), true) = (g, want) {
                        self.add_grad(j, g);
                    }
                }
            }
        }
        Ok(())
    }

    fn add_grad(&mut self, j: usize, g: Tensor) {
        match &mut self.grads[j] {
            Some(acc) => acc.data.iter_mut().zip(&g.data).for_each(|(a, b)| *a += b),
            slot => *slot = Some(g),
        }
    }
}

/// The values of `ids` as row indices below `rows`: a token id or position outside the table fails the step
/// rather than reading past it.
fn indices(ids: &Tensor, rows: usize) -> Result<Vec<u32>> {
    let limit = rows as f32;
    if let Some(bad) = ids.data.iter().find(|&&t| !(t >= 0.0 && t < limit && t.fract() == 0.0)) {
        return Err(Error::Protocol(format!("index {bad} is not a row of an embedding of {rows} rows")));
    }
    Ok(ids.data.iter().map(|&t| t as u32).collect())
}

/// Plain matrices as units, with their gradients: the reference the engine's streamed units are held to, and
/// what the tests run programs over.
#[derive(Clone, Debug, Default)]
pub struct DenseUnits {
    /// Each unit's matrix (`outputs × inputs`, row-major); a tied unit's is empty and read from its target.
    pub weights: Vec<Vec<f32>>,
    /// Each unit's vector.
    pub vectors: Vec<Vec<f32>>,
    /// Each unit's weight gradient (a tied unit's adds to its target's).
    pub weight_grads: Vec<Vec<f32>>,
    /// Each unit's vector gradient.
    pub vector_grads: Vec<Vec<f32>>,
    shapes: Vec<(usize, usize, bool, UnitKind)>,
    tied: Vec<Option<usize>>,
}

impl DenseUnits {
    /// Units for `program` with the given matrices and vectors (one each per unit; a tied unit's matrix empty).
    pub fn new(program: &Program, weights: Vec<Vec<f32>>, vectors: Vec<Vec<f32>>) -> Self {
        let shapes = program.units.iter().map(|u| (u.outputs, u.inputs, u.bias.is_some(), u.kind)).collect();
        DenseUnits {
            weight_grads: weights.iter().map(|w| vec![0.0; w.len()]).collect(),
            vector_grads: vectors.iter().map(|v| vec![0.0; v.len()]).collect(),
            weights,
            vectors,
            shapes,
            tied: program.units.iter().map(|u| u.tied_to).collect(),
        }
    }

    fn owner(&self, u: usize) -> usize {
        self.tied[u].unwrap_or(u)
    }
}

impl Units for DenseUnits {
    fn linear(&mut self, u: usize, x: &Tensor) -> Result<Tensor> {
        let (outputs, inputs, bias, _) = self.shapes[u];
        let w = &self.weights[self.owner(u)];
        let rows = x.len() / inputs.max(1);
        let mut y = vec![0.0; rows * outputs];
        kernels::dense::matmul(
            &mut y,
            kernels::dense::MatView::new(&x.data, rows, inputs),
            kernels::dense::MatView::new(&w[..outputs * inputs], outputs, inputs).t(),
            false,
        );
        if bias {
            for row in y.chunks_mut(outputs) {
                row.iter_mut().zip(&self.vectors[u]).for_each(|(y, b)| *y += b);
            }
        }
        Ok(Tensor::new(vec![rows, outputs], y))
    }

    fn linear_backward(&mut self, u: usize, x: &Tensor, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        use kernels::dense::{MatView, matmul};
        let (outputs, inputs, bias, _) = self.shapes[u];
        let rows = x.len() / inputs.max(1);
        let owner = self.owner(u);
        let g = MatView::new(&dy.data, rows, outputs);
        matmul(&mut self.weight_grads[owner][..outputs * inputs], g.t(), MatView::new(&x.data, rows, inputs), true);
        if bias {
            for row in dy.data.chunks(outputs) {
                self.vector_grads[u].iter_mut().zip(row).for_each(|(a, b)| *a += b);
            }
        }
        Ok(need_dx.then(|| {
            let mut dx = vec![0.0; rows * inputs];
            matmul(&mut dx, g, MatView::new(&self.weights[owner][..outputs * inputs], outputs, inputs), false);
            Tensor::new(vec![rows, inputs], dx)
        }))
    }

    fn embedding(&mut self, u: usize, ids: &[u32]) -> Result<Tensor> {
        let (_, width, _, _) = self.shapes[u];
        let w = &self.weights[self.owner(u)];
        let mut y = Vec::with_capacity(ids.len() * width);
        for &id in ids {
            y.extend_from_slice(&w[id as usize * width..][..width]);
        }
        Ok(Tensor::new(vec![ids.len(), width], y))
    }

    fn embedding_backward(&mut self, u: usize, ids: &[u32], dy: &Tensor) -> Result<()> {
        let (_, width, _, _) = self.shapes[u];
        let owner = self.owner(u);
        for (&id, g) in ids.iter().zip(dy.data.chunks(width)) {
            let row = &mut self.weight_grads[owner][id as usize * width..][..width];
            row.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    fn vector(&self, u: usize) -> Result<&[f32]> {
        Ok(&self.vectors[u])
    }

    fn add_vector_grad(&mut self, u: usize, offset: usize, g: &[f32]) -> Result<()> {
        let slot = self.vector_grads[u].get_mut(offset..offset + g.len()).ok_or_else(|| {
            Error::Protocol(format!("unit {u}'s vector gradient is shorter than {}", offset + g.len()))
        })?;
        slot.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        Ok(())
    }
}
