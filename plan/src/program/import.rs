//! A captured graph checked and mapped onto a [`Program`]: every placeholder named, every shape bounded, every
//! operation mapped onto an [`Op`] or refused with [`Error::UnsupportedModel`] naming it and the line of the
//! model's source that made it. Matrices read by `linear` and `embedding` become stream units in the order
//! they are first used; every other parameter becomes a vector, placed in the stage that first reads it.

use std::collections::HashMap;
use std::path::Path;

use super::capture::{Arg, Captured, CapturedNode, FORMAT, MAX_PROGRAM_BYTES, PROGRAM_FILE, Size};
use super::{Binary, Cmp, Dim, Mask, Node, Op, Param, Program, Shape, Unary, Unit, UnitKind, resolve};
use errors::{Error, Result};

/// The most nodes a program may have (a 200-block decoder has about 10,000).
pub const MAX_NODES: usize = 1 << 17;
/// The largest size of any dimension.
pub const MAX_DIM: usize = 1 << 24;
/// The most dimensions a value may have.
pub const MAX_RANK: usize = 8;
/// The most values one value of the graph may hold per sequence (a 1,024-token sequence's logits over a
/// 262,144-token vocabulary are 2²⁸).
pub const MAX_VALUES: usize = 1 << 30;

/// Reads `program.json` from `folder` (at most [`MAX_PROGRAM_BYTES`]) and imports it.
pub fn read(folder: &Path) -> Result<Program> {
    use std::io::Read;
    let path = folder.join(PROGRAM_FILE);
    let file = std::fs::File::open(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut text = String::new();
    file.take(MAX_PROGRAM_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    Error::check_limit(|| format!("{}'s size in bytes", path.display()), text.len() as u64, MAX_PROGRAM_BYTES)?;
    let captured: Captured = serde_json::from_str(&text).map_err(|e| {
        Error::Data(format!(
            "{} is not a captured program ({e}): write it with weightstream.from_torch",
            path.display()
        ))
    })?;
    import(&captured)
}

/// Maps a captured graph onto a program.
pub fn import(c: &Captured) -> Result<Program> {
    if c.format != FORMAT {
        return Err(Error::Data(format!(
            "program format {:?} is not {FORMAT:?}: capture the module again with this version's weightstream",
            c.format
        )));
    }
    Error::check_limit(|| "nodes of the program".into(), c.nodes.len() as u64, MAX_NODES as u64)?;
    let mut im = Importer::new(c)?;
    for n in &c.nodes {
        match n.kind.as_str() {
            "placeholder" => {}
            "call_function" => im.call(n)?,
            "output" => im.output(n)?,
            other => return Err(bad(n, &format!("a graph node of kind {other:?}"))),
        }
    }
    im.finish()
}

/// What a node's name stands for while the graph is read.
#[derive(Clone, Debug)]
enum Value {
    /// A node of the program.
    Node(usize),
    /// A placeholder not yet read by any node.
    Placeholder(Placeholder),
    /// A size (`sym_size`): only shape arguments may read it.
    Size,
    /// The pieces of a `split`, each a node.
    Pieces(Vec<usize>),
    /// An output the program cannot compute (a max's indices), refused only where something reads it.
    Refused(String),
}

#[derive(Clone, Debug)]
enum Placeholder {
    Param { target: String, shape: Vec<usize> },
    Constant { target: String, shape: Vec<usize> },
    Tokens { context: usize },
}

struct Importer<'c> {
    c: &'c Captured,
    nodes: Vec<Node>,
    values: HashMap<String, Value>,
    units: Vec<Unit>,
    /// Units by the state-dict name of their matrix (the first unit that reads it).
    unit_of: HashMap<String, usize>,
    params: Vec<Param>,
    vector_of: HashMap<String, usize>,
    constants: Vec<Param>,
    tokens: Option<usize>,
    context: usize,
    output: Option<usize>,
}

/// The error for an operation the engine does not run.
fn unsupported(n: &CapturedNode, why: &str) -> Error {
    Error::UnsupportedModel { op: n.target.clone(), at: n.source(), why: why.into() }
}

/// The error for a node whose arguments are not what its operation takes.
fn bad(n: &CapturedNode, what: &str) -> Error {
    Error::UnsupportedModel { op: n.target.clone(), at: n.source(), why: format!("{what} cannot run on the appliance") }
}

const UNKNOWN: &str = "the appliance has no such operation: write this part of the model with the operations \
                       docs/programs.md lists (linear, embedding, norms, activations, attention, shape operations)";

impl<'c> Importer<'c> {
    fn new(c: &'c Captured) -> Result<Self> {
        let mut im = Importer {
            c,
            nodes: Vec::new(),
            values: HashMap::new(),
            units: Vec::new(),
            unit_of: HashMap::new(),
            params: Vec::new(),
            vector_of: HashMap::new(),
            constants: Vec::new(),
            tokens: None,
            context: 0,
            output: None,
        };
        let by_name: HashMap<&str, &CapturedNode> = c.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut users = 0;
        for spec in &c.inputs {
            let node = by_name.get(spec.name.as_str()).ok_or_else(|| {
                Error::Data(format!("the program's input {:?} has no placeholder: capture the module again", spec.name))
            })?;
            let shape = im.shape_of(node)?;
            let fixed = |shape: &Shape| -> Result<Vec<usize>> {
                shape
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => Ok(*n),
                        Dim::Batch | Dim::PerBatch(_) => Err(bad(node, "a parameter or buffer sized by the batch")),
                    })
                    .collect()
            };
            let target = || {
                spec.target.clone().ok_or_else(|| Error::Data(format!("{} names no parameter or buffer", spec.name)))
            };
            let placeholder = match spec.kind.as_str() {
                "parameter" => Placeholder::Param { target: target()?, shape: fixed(&shape)? },
                "buffer" | "constant_tensor" => Placeholder::Constant { target: target()?, shape: fixed(&shape)? },
                "user_input" => {
                    users += 1;
                    match shape.as_slice() {
                        [Dim::Batch, Dim::Fixed(t)] if *t > 0 => Placeholder::Tokens { context: *t },
                        _ => return Err(bad(node, "an input that is not a (batch, tokens) tensor of token ids")),
                    }
                }
                other => return Err(bad(node, &format!("an input of kind {other:?}"))),
            };
            if let Placeholder::Tokens { context } = placeholder {
                im.context = context;
            }
            im.values.insert(spec.name.clone(), Value::Placeholder(placeholder));
        }
        if users != 1 {
            return Err(Error::Data(format!(
                "the program takes {users} inputs: a model program takes one, a (batch, tokens) tensor of token ids"
            )));
        }
        Ok(im)
    }

    /// The shape a node's output has, checked against the limits.
    fn shape_of(&self, n: &CapturedNode) -> Result<Shape> {
        let sizes = n.shape.as_ref().ok_or_else(|| bad(n, "an operation whose output is not one tensor"))?;
        if sizes.len() > MAX_RANK {
            return Err(bad(n, &format!("a value of {} dimensions (at most {MAX_RANK})", sizes.len())));
        }
        if let Some(dtype) = &n.dtype
            && (dtype.starts_with("complex") || dtype == "bool" && n.kind == "placeholder")
        {
            return Err(bad(n, &format!("a value of type {dtype}")));
        }
        let shape: Shape = sizes
            .iter()
            .map(|s| match s {
                Size::Fixed(v) if (0..=MAX_DIM as i64).contains(v) => Ok(Dim::Fixed(*v as usize)),
                Size::Fixed(v) => Err(bad(n, &format!("a dimension of {v}"))),
                Size::Sym { sym } => batch_dim(sym).ok_or_else(|| bad(n, &format!("a size of {sym}"))),
            })
            .collect::<Result<_>>()?;
        // Per sequence (the batch at 1), so every size the plan computes from it stays far from overflowing.
        let values = shape.iter().try_fold(1usize, |acc, d| acc.checked_mul(d.at(1)));
        if values.is_none_or(|v| v > MAX_VALUES) {
            return Err(bad(n, &format!("a value of shape {sizes:?}, more than {MAX_VALUES} values per sequence")));
        }
        Ok(shape)
    }

    fn push(&mut self, n: &CapturedNode, op: Op, inputs: Vec<usize>, shape: Shape) -> usize {
        let learns = matches!(op, Op::Vector { .. } | Op::Linear { .. } | Op::Embedding { .. })
            || inputs.iter().any(|&i| self.nodes[i].learns);
        self.nodes.push(Node { op, inputs, shape, learns, source: n.source() });
        self.nodes.len() - 1
    }

    /// Names `n`'s output `value`.
    fn define(&mut self, n: &CapturedNode, node: usize) {
        self.values.insert(n.name.clone(), Value::Node(node));
    }

    /// The node argument `i` (or keyword `name`) names, made a node on its first read.
    fn input(&mut self, n: &CapturedNode, i: usize, name: &str) -> Result<usize> {
        let arg = n.arg(i, name).ok_or_else(|| bad(n, &format!("a missing argument {name}")))?;
        self.tensor(n, arg)
    }

    fn tensor(&mut self, n: &CapturedNode, arg: &Arg) -> Result<usize> {
        let name = arg.node().ok_or_else(|| bad(n, &format!("a number where a tensor is expected ({arg:?})")))?;
        let value = self.values.get(name).cloned().ok_or_else(|| bad(n, &format!("an unknown input {name:?}")))?;
        let (op, shape) = match value {
            Value::Node(i) => return Ok(i),
            Value::Size | Value::Pieces(_) => return Err(bad(n, &format!("{name} used as a tensor"))),
            Value::Refused(why) => return Err(unsupported(n, &why)),
            Value::Placeholder(Placeholder::Tokens { context }) => {
                let i = self.push(n, Op::Tokens, vec![], vec![Dim::Batch, Dim::Fixed(context)]);
                self.tokens = Some(i);
                self.values.insert(name.into(), Value::Node(i));
                return Ok(i);
            }
            Value::Placeholder(Placeholder::Constant { target, shape }) => {
                self.constants.push(Param { name: target.clone(), shape: shape.clone() });
                (Op::Constant { name: target }, shape)
            }
            Value::Placeholder(Placeholder::Param { target, shape }) => {
                if self.unit_of.contains_key(&target) {
                    return Err(bad(n, &format!("the matrix {target} read by an operation other than linear")));
                }
                self.params.push(Param { name: target.clone(), shape: shape.clone() });
                self.vector_of.insert(target, self.params.len() - 1);
                (Op::Vector { param: self.params.len() - 1, offset: 0 }, shape)
            }
        };
        let i = self.push(n, op, vec![], shape.into_iter().map(Dim::Fixed).collect());
        self.values.insert(name.into(), Value::Node(i));
        Ok(i)
    }

    /// The unit for the matrix argument `arg` of a `linear` or an `embedding`: a new unit on its first use, a
    /// tied one when another unit already holds it.
    fn unit(
        &mut self,
        n: &CapturedNode,
        arg: &Arg,
        kind: UnitKind,
        bias: Option<String>,
        transposed: bool,
    ) -> Result<usize> {
        let name = arg.node().ok_or_else(|| bad(n, "a weight that is not a parameter"))?;
        let Some(Value::Placeholder(Placeholder::Param { target, shape })) = self.values.get(name).cloned() else {
            return Err(unsupported(
                n,
                "its weight is computed, not a parameter of the module: the appliance streams a linear's or an \
                 embedding's weight as the parameter itself",
            ));
        };
        let [rows, cols] = shape[..] else {
            return Err(bad(n, &format!("a weight of shape {shape:?}")));
        };
        let (rows, cols) = if transposed { (cols, rows) } else { (rows, cols) };
        if self.vector_of.contains_key(&target) {
            return Err(bad(n, &format!("the parameter {target} read both as a matrix and by other operations")));
        }
        let tied_to = self.unit_of.get(&target).copied();
        if let Some(t) = tied_to
            && self.units[t].transposed != transposed
        {
            return Err(bad(n, &format!("the matrix {target} read both as stored and transposed")));
        }
        let unit = Unit {
            name: target.clone(),
            kind,
            inputs: cols,
            outputs: rows,
            bias,
            tied_to,
            transposed,
            node: self.nodes.len(),
            vectors: Vec::new(),
        };
        self.units.push(unit);
        self.unit_of.entry(target).or_insert(self.units.len() - 1);
        Ok(self.units.len() - 1)
    }

    /// The state-dict name of a unit's bias argument `arg`: a parameter of the module (one value per output),
    /// streamed first in the unit's vector.
    fn bias_param(&mut self, n: &CapturedNode, arg: &Arg, outputs: Option<usize>) -> Result<String> {
        let name = arg.node().ok_or_else(|| bad(n, "a bias that is not a tensor"))?;
        match self.values.get(name).cloned() {
            Some(Value::Placeholder(Placeholder::Param { target, shape }))
                if shape.len() == 1 && Some(shape[0]) == outputs =>
            {
                self.values.remove(name);
                Ok(target)
            }
            _ => Err(bad(n, "a linear whose bias is not a parameter of its own (one per output)")),
        }
    }

    /// Whether `arg` names a two-dimensional parameter not yet read (a weight applied as `x @ W`).
    fn is_matrix_param(&self, arg: Option<&Arg>) -> bool {
        let name = arg.and_then(Arg::node);
        matches!(name.and_then(|n| self.values.get(n)), Some(Value::Placeholder(Placeholder::Param { shape, .. })) if shape.len() == 2)
    }

    /// Checks a unit's input and output sizes against its matrix.
    fn check_linear(&self, n: &CapturedNode, x: usize, unit: usize, outputs: Option<usize>) -> Result<()> {
        let u = &self.units[unit];
        if self.nodes[x].shape.last() != Some(&Dim::Fixed(u.inputs)) || outputs != Some(u.outputs) {
            return Err(bad(n, "a linear whose shapes do not match its weight"));
        }
        Ok(())
    }

    fn dim(&self, n: &CapturedNode, arg: Option<&Arg>, rank: usize) -> Result<usize> {
        let d = arg.and_then(Arg::int).ok_or_else(|| bad(n, "a dimension that is not a number"))?;
        let d = if d < 0 { d + rank as i64 } else { d };
        usize::try_from(d).ok().filter(|&d| d < rank).ok_or_else(|| bad(n, &format!("dimension {d} of {rank}")))
    }

    fn rank(&self, i: usize) -> usize {
        self.nodes[i].shape.len()
    }

    fn number(&self, n: &CapturedNode, i: usize, name: &str, default: Option<f64>) -> Result<f64> {
        match n.arg(i, name) {
            Some(a) => a.number().ok_or_else(|| bad(n, &format!("{name} = {a:?}"))),
            None => default.ok_or_else(|| bad(n, &format!("a missing {name}"))),
        }
    }

    /// One `call_function` node.
    fn call(&mut self, n: &CapturedNode) -> Result<()> {
        let t = n.target.as_str();
        match t {
            "aten._assert_tensor_metadata.default" | "aten._assert_scalar.default" => return Ok(()),
            "aten.sym_size.int" => {
                self.values.insert(n.name.clone(), Value::Size);
                return Ok(());
            }
            "<built-in function getitem>" => return self.getitem(n),
            "aten.contiguous.default"
            | "aten.clone.default"
            | "aten.alias.default"
            | "aten.detach.default"
            | "aten.to.dtype"
            | "aten._to_copy.default"
            | "aten.to.dtype_layout"
            | "aten.lift_fresh_copy.default"
            | "aten.type_as.default"
            | "aten.to.device"
            | "aten.dropout.default" => {
                if n.target == "aten.dropout.default" && matches!(n.arg(2, "train"), Some(Arg::Bool(true))) {
                    return Err(unsupported(n, "dropout while training: the appliance trains without dropout"));
                }
                if let Some(dtype) = &n.dtype
                    && !dtype.starts_with("float")
                    && !dtype.starts_with("bfloat")
                    && !dtype.starts_with("int")
                    && dtype != "bool"
                {
                    return Err(bad(n, &format!("a cast to {dtype}")));
                }
                let x = self.input(n, 0, "self")?;
                self.define(n, x);
                return Ok(());
            }
            "aten.split.Tensor" | "aten.split_with_sizes.default" | "aten.chunk.default" => return self.split(n),
            "aten.unbind.int" => return self.unbind(n),
            "aten.max.dim" => return self.max_dim(n),
            _ => {}
        }
        let shape = self.shape_of(n).map_err(|e| if mapped(t) { e } else { unsupported(n, UNKNOWN) })?;
        let (op, inputs) = self.map(n, &shape)?;
        let i = self.push(n, op, inputs, shape);
        self.define(n, i);
        Ok(())
    }

    /// The operation a node maps onto, with its inputs.
    fn map(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let t = n.target.as_str();
        if let Some(u) = unary(t, n) {
            return Ok((Op::Unary(u?), vec![self.input(n, 0, "self")?]));
        }
        if let Some(op) = binary(t) {
            return self.binary(n, op);
        }
        if let Some(mapped) = self.map_layer(n, shape)? {
            return Ok(mapped);
        }
        if let Some(mapped) = self.map_shape(n, shape)? {
            return Ok(mapped);
        }
        self.map_math(n, shape)?.ok_or_else(|| unsupported(n, UNKNOWN))
    }

    /// A unit (`linear`, `embedding`, `addmm`, a product by a weight) or a norm, or `None` for other targets.
    fn map_layer(&mut self, n: &CapturedNode, shape: &Shape) -> Result<Option<(Op, Vec<usize>)>> {
        let t = n.target.as_str();
        Ok(Some(match t {
            "aten.linear.default" => {
                let x = self.input(n, 0, "input")?;
                let outputs = shape.last().map(|d| d.at(1));
                let bias = match n.arg(2, "bias") {
                    Some(arg) => Some(self.bias_param(n, arg, outputs)?),
                    None => None,
                };
                let w = n.arg(1, "weight").cloned().ok_or_else(|| bad(n, "a linear without a weight"))?;
                let unit = self.unit(n, &w, UnitKind::Linear, bias, false)?;
                self.check_linear(n, x, unit, outputs)?;
                (Op::Linear { unit }, vec![x])
            }
            "aten.embedding.default" => {
                let ids = self.input(n, 1, "indices")?;
                if self.nodes[ids].learns {
                    return Err(bad(n, "an embedding looked up by learned values"));
                }
                let w = n.arg(0, "weight").cloned().ok_or_else(|| bad(n, "an embedding without a weight"))?;
                (Op::Embedding { unit: self.unit(n, &w, UnitKind::Embedding, None, false)? }, vec![ids])
            }
            "aten.layer_norm.default" => {
                let x = self.input(n, 0, "input")?;
                self.last_dim_norm(n, x)?;
                let mut inputs = vec![x];
                let gain = n.arg(2, "weight").is_some();
                let bias = n.arg(3, "bias").is_some();
                if gain {
                    inputs.push(self.input(n, 2, "weight")?);
                }
                if bias {
                    inputs.push(self.input(n, 3, "bias")?);
                }
                (Op::LayerNorm { eps: self.number(n, 4, "eps", Some(1e-5))? as f32, gain, bias }, inputs)
            }
            "aten.rms_norm.default" => {
                let x = self.input(n, 0, "input")?;
                self.last_dim_norm(n, x)?;
                let mut inputs = vec![x];
                let gain = n.arg(2, "weight").is_some();
                if gain {
                    inputs.push(self.input(n, 2, "weight")?);
                }
                let eps = self.number(n, 3, "eps", Some(f64::from(f32::EPSILON)))? as f32;
                (Op::RmsNorm { eps, gain }, inputs)
            }
            "aten.matmul.default" | "aten.mm.default" if self.is_matrix_param(n.arg(1, "mat2")) => {
                let x = self.input(n, 0, "self")?;
                let w = n.arg(1, "mat2").cloned().ok_or_else(|| bad(n, "a product without a weight"))?;
                let unit = self.unit(n, &w, UnitKind::Linear, None, true)?;
                self.check_linear(n, x, unit, shape.last().map(|d| d.at(1)))?;
                (Op::Linear { unit }, vec![x])
            }
            "aten.addmm.default" => {
                for k in ["beta", "alpha"] {
                    if n.kwargs.get(k).and_then(Arg::number).is_some_and(|v| v != 1.0) {
                        return Err(bad(n, &format!("an addmm with {k}")));
                    }
                }
                let x = self.input(n, 1, "mat1")?;
                let outputs = shape.last().map(|d| d.at(1));
                let bias = match n.arg(0, "self") {
                    Some(arg) => Some(self.bias_param(n, arg, outputs)?),
                    None => None,
                };
                let w = n.arg(2, "mat2").cloned().ok_or_else(|| bad(n, "an addmm without a weight"))?;
                let unit = self.unit(n, &w, UnitKind::Linear, bias, true)?;
                self.check_linear(n, x, unit, outputs)?;
                (Op::Linear { unit }, vec![x])
            }
            _ => return Ok(None),
        }))
    }

    /// A shape operation, attention or a product of values, or `None` for other targets.
    fn map_shape(&mut self, n: &CapturedNode, shape: &Shape) -> Result<Option<(Op, Vec<usize>)>> {
        let t = n.target.as_str();
        Ok(Some(match t {
            "aten.view.default"
            | "aten.reshape.default"
            | "aten._unsafe_view.default"
            | "aten.unsqueeze.default"
            | "aten.squeeze.dim"
            | "aten.squeeze.dims"
            | "aten.squeeze.default"
            | "aten.flatten.using_ints" => {
                let x = self.input(n, 0, "self")?;
                if !same_count(&self.nodes[x].shape, shape) {
                    return Err(bad(n, "a reshape that changes the number of values"));
                }
                (Op::Reshape, vec![x])
            }
            "aten.transpose.int" => {
                let x = self.input(n, 0, "self")?;
                let rank = self.rank(x);
                let (a, b) = (self.dim(n, n.arg(1, "dim0"), rank)?, self.dim(n, n.arg(2, "dim1"), rank)?);
                let mut dims: Vec<usize> = (0..rank).collect();
                dims.swap(a, b);
                (Op::Permute { dims }, vec![x])
            }
            "aten.t.default" | "aten.numpy_T.default" => {
                let x = self.input(n, 0, "self")?;
                (Op::Permute { dims: (0..self.rank(x)).rev().collect() }, vec![x])
            }
            "aten.permute.default" => {
                let x = self.input(n, 0, "self")?;
                let rank = self.rank(x);
                let list = n.arg(1, "dims").and_then(Arg::list).ok_or_else(|| bad(n, "a permute without dims"))?;
                let dims = list.iter().map(|d| self.dim(n, Some(d), rank)).collect::<Result<Vec<_>>>()?;
                let mut seen = dims.clone();
                seen.sort_unstable();
                if seen != (0..rank).collect::<Vec<_>>() {
                    return Err(bad(n, "a permute that is not a permutation"));
                }
                (Op::Permute { dims }, vec![x])
            }
            "aten.slice.Tensor" => {
                let x = self.input(n, 0, "self")?;
                let op = self.slice(n, x)?;
                (op, vec![x])
            }
            "aten.select.int" => {
                let x = self.input(n, 0, "self")?;
                let rank = self.rank(x);
                let dim = self.dim(n, n.arg(1, "dim"), rank)?;
                let size = fixed(n, self.nodes[x].shape[dim])?;
                let index = n.arg(2, "index").and_then(Arg::int).ok_or_else(|| bad(n, "a select without index"))?;
                let start = if index < 0 { index + size as i64 } else { index };
                let start =
                    usize::try_from(start).ok().filter(|&s| s < size).ok_or_else(|| bad(n, "an index out of range"))?;
                let mut kept = self.nodes[x].shape.clone();
                kept[dim] = Dim::Fixed(1);
                let piece = self.push(n, Op::Slice { dim, start, end: start + 1, step: 1 }, vec![x], kept);
                (Op::Reshape, vec![piece])
            }
            "aten.cat.default" => {
                let list = n.arg(0, "tensors").and_then(Arg::list).ok_or_else(|| bad(n, "a cat without tensors"))?;
                let list = list.to_vec();
                let inputs = list.iter().map(|a| self.tensor(n, a)).collect::<Result<Vec<_>>>()?;
                let dim = self.dim(n, Some(n.arg(1, "dim").unwrap_or(&Arg::Int(0))), shape.len())?;
                if inputs.iter().any(|&i| self.rank(i) != shape.len()) {
                    return Err(bad(n, "a cat of values of different ranks"));
                }
                (Op::Cat { dim }, inputs)
            }
            "aten.expand.default" => {
                let x = self.input(n, 0, "self")?;
                let from = &self.nodes[x].shape;
                let offset = shape.len().checked_sub(from.len()).ok_or_else(|| bad(n, "an expand to fewer dims"))?;
                if from.iter().enumerate().any(|(i, d)| *d != Dim::Fixed(1) && *d != shape[offset + i]) {
                    return Err(bad(n, "an expand of a dimension that is not 1"));
                }
                (Op::Expand, vec![x])
            }
            "aten.repeat_interleave.self_int" => {
                let x = self.input(n, 0, "self")?;
                let repeats = n.arg(1, "repeats").and_then(Arg::int).filter(|&r| r >= 1);
                let repeats = repeats.ok_or_else(|| bad(n, "repeats that are not a positive number"))? as usize;
                let dim = self.dim(n, n.arg(2, "dim"), self.rank(x))?;
                (Op::RepeatInterleave { repeats, dim }, vec![x])
            }
            "aten.scaled_dot_product_attention.default" => return self.attention(n, shape).map(Some),
            "aten.matmul.default" | "aten.bmm.default" | "aten.mm.default" => {
                let (a, b) = (self.input(n, 0, "self")?, self.input(n, 1, "other")?);
                if self.rank(a) < 2 || self.rank(b) < 2 {
                    return Err(bad(n, "a matrix product of vectors"));
                }
                (Op::MatMul, vec![a, b])
            }
            "aten.index.Tensor" => return self.index(n, shape).map(Some),
            "aten.diff.default" => return self.diff(n, shape).map(Some),
            "aten.stack.default" => {
                let list = n.arg(0, "tensors").and_then(Arg::list).ok_or_else(|| bad(n, "a stack without tensors"))?;
                let dim = self.dim(n, Some(n.arg(1, "dim").unwrap_or(&Arg::Int(0))), shape.len())?;
                let mut inputs = Vec::new();
                for arg in list {
                    let x = self.tensor(n, arg)?;
                    let mut one = self.nodes[x].shape.clone();
                    one.insert(dim.min(one.len()), Dim::Fixed(1));
                    inputs.push(self.push(n, Op::Reshape, vec![x], one));
                }
                (Op::Cat { dim }, inputs)
            }
            "aten.einsum.default" => return self.einsum(n, shape).map(Some),
            "aten.repeat.default" => return self.repeat(n, shape).map(Some),
            _ => return Ok(None),
        }))
    }

    /// Arithmetic, reductions, comparisons, masks and positions, or `None` for other targets.
    fn map_math(&mut self, n: &CapturedNode, shape: &Shape) -> Result<Option<(Op, Vec<usize>)>> {
        let t = n.target.as_str();
        Ok(Some(match t {
            "aten.pow.Tensor_Scalar" => {
                let x = self.input(n, 0, "self")?;
                let value = self.number(n, 1, "exponent", None)? as f32;
                (Op::Scalar { op: Binary::Pow, value, reversed: false }, vec![x])
            }
            "aten.pow.Scalar" => {
                let x = self.input(n, 1, "exponent")?;
                let value = self.number(n, 0, "self", None)? as f32;
                (Op::Scalar { op: Binary::Pow, value, reversed: true }, vec![x])
            }
            "aten.rsub.Scalar" => {
                let x = self.input(n, 0, "self")?;
                self.alpha(n)?;
                (
                    Op::Scalar { op: Binary::Sub, value: self.number(n, 1, "other", None)? as f32, reversed: true },
                    vec![x],
                )
            }
            "aten.mean.dim" | "aten.sum.dim_IntList" => {
                let x = self.input(n, 0, "self")?;
                let rank = self.rank(x);
                let dims = match n.arg(1, "dim").and_then(Arg::list) {
                    Some(l) => l.iter().map(|d| self.dim(n, Some(d), rank)).collect::<Result<Vec<_>>>()?,
                    None => (0..rank).collect(),
                };
                let keep = matches!(n.arg(2, "keepdim"), Some(Arg::Bool(true)));
                if n.kwargs.contains_key("dtype") {
                    return Err(bad(n, "a reduction with a dtype"));
                }
                let op = if t == "aten.mean.dim" { Op::Mean { dims, keep } } else { Op::Sum { dims, keep } };
                (op, vec![x])
            }
            "aten.softmax.int" | "aten._softmax.default" => {
                let x = self.input(n, 0, "self")?;
                if self.dim(n, n.arg(1, "dim"), self.rank(x))? + 1 != self.rank(x) {
                    return Err(bad(n, "a softmax over a dimension other than the last"));
                }
                (Op::Softmax, vec![x])
            }
            "aten.arange.default" | "aten.arange.start" | "aten.arange.start_step" => {
                let (start, step) = match t {
                    "aten.arange.default" => (0.0, 1.0),
                    "aten.arange.start" => (self.number(n, 0, "start", None)?, 1.0),
                    _ => (self.number(n, 0, "start", None)?, self.number(n, 2, "step", Some(1.0))?),
                };
                if shape.len() != 1 {
                    return Err(bad(n, "an arange that is not one-dimensional"));
                }
                (Op::Arange { start: start as f32, step: step as f32 }, vec![])
            }
            "aten.outer.default" | "aten.ger.default" => {
                let (a, b) = (self.input(n, 0, "self")?, self.input(n, 1, "vec2")?);
                let (rows, cols) = (self.nodes[a].shape.clone(), self.nodes[b].shape.clone());
                if rows.len() != 1 || cols.len() != 1 {
                    return Err(bad(n, "an outer product of values that are not vectors"));
                }
                let a = self.push(n, Op::Reshape, vec![a], vec![rows[0], Dim::Fixed(1)]);
                let b = self.push(n, Op::Reshape, vec![b], vec![Dim::Fixed(1), cols[0]]);
                (Op::Binary(Binary::Mul), vec![a, b])
            }
            t if compare(t).is_some() => {
                let cmp = compare(t).ok_or_else(|| bad(n, "a comparison"))?;
                let x = self.input(n, 0, "self")?;
                match n.arg(1, "other") {
                    Some(Arg::Node { .. }) => (Op::Compare { cmp, value: None }, vec![x, self.input(n, 1, "other")?]),
                    _ => (Op::Compare { cmp, value: Some(self.number(n, 1, "other", None)? as f32) }, vec![x]),
                }
            }
            "aten.__and__.Tensor" | "aten.logical_and.default" | "aten.bitwise_and.Tensor" => {
                let (a, b) = (self.input(n, 0, "self")?, self.input(n, 1, "other")?);
                (Op::Binary(Binary::Mul), vec![a, b])
            }
            "aten.__or__.Tensor" | "aten.logical_or.default" | "aten.bitwise_or.Tensor" => {
                let (a, b) = (self.input(n, 0, "self")?, self.input(n, 1, "other")?);
                let sum = self.push(n, Op::Binary(Binary::Add), vec![a, b], shape.clone());
                (Op::Compare { cmp: Cmp::Gt, value: Some(0.0) }, vec![sum])
            }
            "aten.logical_not.default" | "aten.bitwise_not.default" => {
                (Op::Compare { cmp: Cmp::Eq, value: Some(0.0) }, vec![self.input(n, 0, "self")?])
            }
            "aten.cumsum.default" => {
                let x = self.input(n, 0, "self")?;
                (Op::Cumsum { dim: self.dim(n, n.arg(1, "dim"), self.rank(x))? }, vec![x])
            }
            "aten.new_ones.default" | "aten.ones.default" | "aten.ones_like.default" => {
                (Op::Fill { value: 1.0 }, vec![])
            }
            "aten.new_zeros.default" | "aten.zeros.default" | "aten.zeros_like.default" => {
                (Op::Fill { value: 0.0 }, vec![])
            }
            "aten.full.default" => (Op::Fill { value: self.number(n, 1, "fill_value", None)? as f32 }, vec![]),
            "aten.new_full.default" => (Op::Fill { value: self.number(n, 2, "fill_value", None)? as f32 }, vec![]),
            "aten.full_like.default" => (Op::Fill { value: self.number(n, 1, "fill_value", None)? as f32 }, vec![]),
            "aten.where.self" => {
                let c = self.input(n, 0, "condition")?;
                let (a, b) = (self.input(n, 1, "self")?, self.input(n, 2, "other")?);
                if self.nodes[c].learns {
                    return Err(bad(n, "a condition computed from learned values"));
                }
                (Op::Where, vec![c, a, b])
            }
            "aten.masked_fill.Scalar" => {
                let (x, mask) = (self.input(n, 0, "self")?, self.input(n, 1, "mask")?);
                if self.nodes[mask].learns {
                    return Err(bad(n, "a mask computed from learned values"));
                }
                (Op::MaskedFill { value: self.number(n, 2, "value", None)? as f32 }, vec![x, mask])
            }
            "aten.square.default" => {
                (Op::Scalar { op: Binary::Pow, value: 2.0, reversed: false }, vec![self.input(n, 0, "self")?])
            }
            "aten.sum.default" | "aten.mean.default" => {
                let x = self.input(n, 0, "self")?;
                let dims: Vec<usize> = (0..self.rank(x)).collect();
                let op = if t == "aten.sum.default" {
                    Op::Sum { dims, keep: false }
                } else {
                    Op::Mean { dims, keep: false }
                };
                (op, vec![x])
            }
            "aten.var.dim" | "aten.var.correction" => return self.variance(n, shape).map(Some),
            "aten.clamp.default" => {
                let x = self.input(n, 0, "self")?;
                let bound = |i: usize, name: &str| n.arg(i, name).and_then(Arg::number).map(|v| v as f32);
                (Op::Clamp { min: bound(1, "min"), max: bound(2, "max") }, vec![x])
            }
            "aten.tril.default" | "aten.triu.default" => {
                let x = self.input(n, 0, "self")?;
                if self.rank(x) < 2 {
                    return Err(bad(n, "a triangle of a vector"));
                }
                let diagonal = n.arg(1, "diagonal").and_then(Arg::int).unwrap_or(0);
                (Op::Triangle { upper: t == "aten.triu.default", diagonal }, vec![x])
            }
            "aten.log_softmax.int" | "aten._log_softmax.default" => {
                let x = self.input(n, 0, "self")?;
                if self.dim(n, n.arg(1, "dim"), self.rank(x))? + 1 != self.rank(x) {
                    return Err(bad(n, "a log-softmax over a dimension other than the last"));
                }
                (Op::LogSoftmax, vec![x])
            }
            "aten.amax.default" => {
                let x = self.input(n, 0, "self")?;
                let rank = self.rank(x);
                let dims = match n.arg(1, "dim").and_then(Arg::list) {
                    Some(l) if !l.is_empty() => {
                        l.iter().map(|d| self.dim(n, Some(d), rank)).collect::<Result<Vec<_>>>()?
                    }
                    _ => (0..rank).collect(),
                };
                (Op::Amax { dims, keep: matches!(n.arg(2, "keepdim"), Some(Arg::Bool(true))) }, vec![x])
            }
            _ => return Ok(None),
        }))
    }

    fn alpha(&self, n: &CapturedNode) -> Result<()> {
        match n.kwargs.get("alpha").and_then(Arg::number) {
            None => Ok(()),
            Some(1.0) => Ok(()),
            Some(_) => Err(bad(n, "an add or a subtraction with alpha")),
        }
    }

    fn binary(&mut self, n: &CapturedNode, op: Binary) -> Result<(Op, Vec<usize>)> {
        self.alpha(n)?;
        if n.kwargs.contains_key("rounding_mode") {
            return Err(bad(n, "a division with rounding"));
        }
        let (a, b) = (n.arg(0, "self"), n.arg(1, "other"));
        let (a, b) = (a.ok_or_else(|| bad(n, "a missing operand"))?, b.ok_or_else(|| bad(n, "a missing operand"))?);
        match (a.node(), b.node()) {
            (Some(_), Some(_)) => Ok((Op::Binary(op), vec![self.tensor(n, a)?, self.tensor(n, b)?])),
            (Some(_), None) => {
                let value = b.number().ok_or_else(|| bad(n, "an operand that is neither a tensor nor a number"))?;
                Ok((Op::Scalar { op, value: value as f32, reversed: false }, vec![self.tensor(n, a)?]))
            }
            (None, Some(_)) => {
                let value = a.number().ok_or_else(|| bad(n, "an operand that is neither a tensor nor a number"))?;
                Ok((Op::Scalar { op, value: value as f32, reversed: true }, vec![self.tensor(n, b)?]))
            }
            (None, None) => Err(bad(n, "arithmetic on two numbers")),
        }
    }

    fn last_dim_norm(&self, n: &CapturedNode, x: usize) -> Result<()> {
        let normalized = n.arg(1, "normalized_shape").and_then(Arg::list).map(|l| l.iter().map(Arg::int).collect());
        let last = self.nodes[x].shape.last().copied();
        match (normalized, last) {
            (Some(Some::<Vec<i64>>(v)), Some(Dim::Fixed(d))) if v == [d as i64] => Ok(()),
            _ => Err(bad(n, "a norm over more than the last dimension")),
        }
    }

    fn slice(&self, n: &CapturedNode, x: usize) -> Result<Op> {
        let rank = self.rank(x);
        let dim = self.dim(n, Some(n.arg(1, "dim").unwrap_or(&Arg::Int(0))), rank)?;
        let size = fixed(n, self.nodes[x].shape[dim])? as i64;
        let clamp = |v: i64| if v < 0 { (v + size).max(0) } else { v.min(size) } as usize;
        let start = clamp(n.arg(2, "start").and_then(Arg::int).unwrap_or(0));
        let end = clamp(n.arg(3, "end").and_then(Arg::int).unwrap_or(size)).max(start);
        let step = n.arg(4, "step").and_then(Arg::int).unwrap_or(1);
        let step =
            usize::try_from(step).ok().filter(|&s| s >= 1).ok_or_else(|| bad(n, "a slice with a step below 1"))?;
        Ok(Op::Slice { dim, start, end, step })
    }

    fn split(&mut self, n: &CapturedNode) -> Result<()> {
        let x = self.input(n, 0, "self")?;
        let rank = self.rank(x);
        let dim = self.dim(n, Some(n.arg(2, "dim").unwrap_or(&Arg::Int(0))), rank)?;
        let size = fixed(n, self.nodes[x].shape[dim])?;
        let sizes: Vec<usize> = match n.target.as_str() {
            "aten.split_with_sizes.default" => n
                .arg(1, "split_sizes")
                .and_then(Arg::list)
                .and_then(|l| l.iter().map(|s| s.int().and_then(|s| usize::try_from(s).ok())).collect())
                .ok_or_else(|| bad(n, "split sizes that are not numbers"))?,
            target => {
                let k = n.arg(1, "split_size").and_then(Arg::int).and_then(|k| usize::try_from(k).ok());
                let k = k.filter(|&k| k >= 1).ok_or_else(|| bad(n, "a split size below 1"))?;
                // chunk(c) cuts into c pieces of ⌈size / c⌉; split(k) into pieces of k.
                let piece = if target == "aten.chunk.default" { size.div_ceil(k) } else { k };
                (0..size).step_by(piece.max(1)).map(|s| piece.min(size - s)).collect()
            }
        };
        if sizes.iter().sum::<usize>() != size {
            return Err(bad(n, "a split whose pieces do not add up to the dimension"));
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        for s in sizes {
            let mut shape = self.nodes[x].shape.clone();
            shape[dim] = Dim::Fixed(s);
            pieces.push(self.push(n, Op::Slice { dim, start, end: start + s, step: 1 }, vec![x], shape));
            start += s;
        }
        self.values.insert(n.name.clone(), Value::Pieces(pieces));
        Ok(())
    }

    fn getitem(&mut self, n: &CapturedNode) -> Result<()> {
        let source = n.arg(0, "self").and_then(Arg::node).and_then(|s| self.values.get(s));
        let Some(Value::Pieces(pieces)) = source.cloned() else {
            return Err(unsupported(n, "indexing the result of this operation is not supported: index a split"));
        };
        // A max over a dimension gives its values only: reading its indices (argmax) is not a program's.
        let i = n.arg(1, "index").and_then(Arg::int).and_then(|i| usize::try_from(i).ok());
        match i.and_then(|i| pieces.get(i)) {
            Some(&piece) => self.define(n, piece),
            None => {
                let why = "the indices of a max (argmax) are not a program's: use the values alone".to_string();
                self.values.insert(n.name.clone(), Value::Refused(why));
            }
        }
        Ok(())
    }

    fn attention(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let (q, mut k, mut v) = (self.input(n, 0, "query")?, self.input(n, 1, "key")?, self.input(n, 2, "value")?);
        let mask = match n.arg(3, "attn_mask") {
            None => None,
            Some(arg) => {
                let m = self.tensor(n, arg)?;
                if self.nodes[m].learns {
                    return Err(bad(n, "an attention mask computed from learned values"));
                }
                let dtype =
                    self.c.nodes.iter().find(|c| Some(c.name.as_str()) == arg.node()).and_then(|c| c.dtype.clone());
                Some((m, if dtype.as_deref() == Some("bool") { Mask::Keep } else { Mask::Additive }))
            }
        };
        if self.number(n, 4, "dropout_p", Some(0.0))? != 0.0 {
            return Err(unsupported(n, "attention dropout: set dropout_p=0.0"));
        }
        let causal = matches!(n.arg(5, "is_causal"), Some(Arg::Bool(true)));
        let scale = n.arg(6, "scale").and_then(Arg::number).map(|s| s as f32);
        let rank = self.rank(q);
        if rank < 3 || self.rank(k) != rank || self.rank(v) != rank || shape.len() != rank {
            return Err(bad(n, "attention over values of different ranks"));
        }
        let heads = fixed(n, self.nodes[q].shape[rank - 3])?;
        for kv in [&mut k, &mut v] {
            let kv_heads = fixed(n, self.nodes[*kv].shape[rank - 3])?;
            if kv_heads != heads {
                if !matches!(n.arg(7, "enable_gqa"), Some(Arg::Bool(true))) || kv_heads == 0 || heads % kv_heads != 0 {
                    return Err(bad(n, "attention whose keys and values have other head counts than its queries"));
                }
                let mut wide = self.nodes[*kv].shape.clone();
                wide[rank - 3] = Dim::Fixed(heads);
                let op = Op::RepeatInterleave { repeats: heads / kv_heads, dim: rank - 3 };
                *kv = self.push(n, op, vec![*kv], wide);
            }
        }
        if self.nodes[q].shape != self.nodes[k].shape
            || self.nodes[v].shape[..rank - 1] != self.nodes[q].shape[..rank - 1]
        {
            return Err(bad(n, "attention whose queries, keys and values disagree in shape"));
        }
        let mut inputs = vec![q, k, v];
        inputs.extend(mask.map(|(m, _)| m));
        Ok((Op::Attention { causal, scale, mask: mask.map(|(_, kind)| kind) }, inputs))
    }

    /// `x[i₀, i₁, …]`: index tensors (none of them learned) for `x`'s leading dimensions.
    fn index(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let x = self.input(n, 0, "self")?;
        let list = n.arg(1, "indices").and_then(Arg::list).ok_or_else(|| bad(n, "an index without indices"))?.to_vec();
        if list.is_empty() || list.len() > self.rank(x) || list.iter().any(|a| a.node().is_none()) {
            return Err(unsupported(n, "indexing other than by index tensors for the leading dimensions"));
        }
        let mut inputs = vec![x];
        for arg in &list {
            let i = self.tensor(n, arg)?;
            if self.nodes[i].learns {
                return Err(bad(n, "indices computed from learned values"));
            }
            inputs.push(i);
        }
        let rest = &self.nodes[x].shape[list.len()..];
        if shape.len() < rest.len() || shape[shape.len() - rest.len()..] != *rest {
            return Err(bad(n, "an index whose output does not end with the dimensions it keeps"));
        }
        Ok((Op::Index, inputs))
    }

    /// `diff(x, dim)` (with what it prepends and appends): the differences of neighbours along `dim`.
    fn diff(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let x = self.input(n, 0, "self")?;
        if n.arg(1, "n").and_then(Arg::int).unwrap_or(1) != 1 {
            return Err(unsupported(n, "a diff of order other than 1"));
        }
        let rank = self.rank(x);
        let dim = self.dim(n, Some(n.arg(2, "dim").unwrap_or(&Arg::Int(-1))), rank)?;
        let mut parts = Vec::new();
        if n.arg(3, "prepend").is_some() {
            parts.push(self.input(n, 3, "prepend")?);
        }
        parts.push(x);
        if n.arg(4, "append").is_some() {
            parts.push(self.input(n, 4, "append")?);
        }
        let joined = if parts.len() == 1 {
            x
        } else {
            let mut whole = self.nodes[x].shape.clone();
            let total = parts.iter().map(|&p| fixed(n, self.nodes[p].shape[dim])).sum::<Result<usize>>()?;
            whole[dim] = Dim::Fixed(total);
            self.push(n, Op::Cat { dim }, parts, whole)
        };
        let size = fixed(n, self.nodes[joined].shape[dim])?;
        if size == 0 || shape.get(dim) != Some(&Dim::Fixed(size - 1)) {
            return Err(bad(n, "a diff whose shape is not one shorter than its input"));
        }
        let later = self.push(n, Op::Slice { dim, start: 1, end: size, step: 1 }, vec![joined], shape.clone());
        let earlier = self.push(n, Op::Slice { dim, start: 0, end: size - 1, step: 1 }, vec![joined], shape.clone());
        Ok((Op::Binary(Binary::Sub), vec![later, earlier]))
    }

    /// `max(x, dim)`: its values (the first piece); reading its indices is refused.
    fn max_dim(&mut self, n: &CapturedNode) -> Result<()> {
        let x = self.input(n, 0, "self")?;
        let rank = self.rank(x);
        let dim = self.dim(n, n.arg(1, "dim"), rank)?;
        let keep = matches!(n.arg(2, "keepdim"), Some(Arg::Bool(true)));
        let mut shape = self.nodes[x].shape.clone();
        if keep {
            shape[dim] = Dim::Fixed(1);
        } else {
            shape.remove(dim);
        }
        let values = self.push(n, Op::Amax { dims: vec![dim], keep }, vec![x], shape);
        self.values.insert(n.name.clone(), Value::Pieces(vec![values]));
        Ok(())
    }

    /// `repeat(x, reps)`: each dimension tiled, as a reshape that opens a size-1 dimension before each, an
    /// expand of those to the repeats and a reshape that folds them back. The repeats are read from the output's
    /// shape, so a repeat by the batch (`ids.shape[0]`) of a dimension of 1 is the batch.
    fn repeat(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let x = self.input(n, 0, "self")?;
        let mut sizes = self.nodes[x].shape.clone();
        if sizes.len() > shape.len() {
            return Err(bad(n, "fewer repeats than dimensions"));
        }
        while sizes.len() < shape.len() {
            sizes.insert(0, Dim::Fixed(1));
        }
        let reps = sizes
            .iter()
            .zip(shape)
            .map(|(&from, &to)| match (from, to) {
                (Dim::Fixed(1), to) => Ok(to),
                (from, to) if from == to => Ok(Dim::Fixed(1)),
                (Dim::Fixed(f), Dim::Fixed(t)) if f > 0 && t % f == 0 => Ok(Dim::Fixed(t / f)),
                _ => Err(bad(n, "a repeat whose output does not tile its input")),
            })
            .collect::<Result<Vec<_>>>()?;
        let opened: Vec<Dim> = sizes.iter().flat_map(|&d| [Dim::Fixed(1), d]).collect();
        let tiled: Vec<Dim> = sizes.iter().zip(&reps).flat_map(|(&d, &r)| [r, d]).collect();
        let open = self.push(n, Op::Reshape, vec![x], opened);
        let expand = self.push(n, Op::Expand, vec![open], tiled);
        Ok((Op::Reshape, vec![expand]))
    }

    /// `unbind(x, dim)`: one piece per index along `dim`, that dimension dropped.
    fn unbind(&mut self, n: &CapturedNode) -> Result<()> {
        let x = self.input(n, 0, "self")?;
        let dim = self.dim(n, Some(n.arg(1, "dim").unwrap_or(&Arg::Int(0))), self.rank(x))?;
        let size = fixed(n, self.nodes[x].shape[dim])?;
        let mut pieces = Vec::new();
        for i in 0..size {
            let mut kept = self.nodes[x].shape.clone();
            kept[dim] = Dim::Fixed(1);
            let piece = self.push(n, Op::Slice { dim, start: i, end: i + 1, step: 1 }, vec![x], kept.clone());
            kept.remove(dim);
            pieces.push(self.push(n, Op::Reshape, vec![piece], kept));
        }
        self.values.insert(n.name.clone(), Value::Pieces(pieces));
        Ok(())
    }

    /// `var(x, dims)` as the mean of squared deviations, divided by `count − correction`.
    fn variance(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let x = self.input(n, 0, "self")?;
        let rank = self.rank(x);
        let dims = match n.arg(1, "dim").and_then(Arg::list) {
            Some(l) => l.iter().map(|d| self.dim(n, Some(d), rank)).collect::<Result<Vec<_>>>()?,
            None => (0..rank).collect(),
        };
        let correction = if n.target == "aten.var.dim" {
            f64::from(u8::from(!matches!(n.arg(2, "unbiased"), Some(Arg::Bool(false)))))
        } else {
            n.kwargs.get("correction").and_then(Arg::number).unwrap_or(1.0)
        };
        let keep = matches!(n.kwargs.get("keepdim").or(n.args.get(3)), Some(Arg::Bool(true)));
        let count = dims.iter().map(|&d| fixed(n, self.nodes[x].shape[d])).product::<Result<usize>>()? as f64;
        if count - correction <= 0.0 {
            return Err(bad(n, "a variance of too few values for its correction"));
        }
        let mut kept = self.nodes[x].shape.clone();
        dims.iter().for_each(|&d| kept[d] = Dim::Fixed(1));
        let full = self.nodes[x].shape.clone();
        let mean = self.push(n, Op::Mean { dims: dims.clone(), keep: true }, vec![x], kept);
        let deviation = self.push(n, Op::Binary(Binary::Sub), vec![x, mean], full.clone());
        let square = self.push(n, Op::Scalar { op: Binary::Pow, value: 2.0, reversed: false }, vec![deviation], full);
        let sum = self.push(n, Op::Sum { dims, keep }, vec![square], shape.clone());
        Ok((Op::Scalar { op: Binary::Mul, value: (1.0 / (count - correction)) as f32, reversed: false }, vec![sum]))
    }

    /// A two-operand `einsum` (or a one-operand permutation) as permutes, reshapes and one batched product:
    /// letters in both operands and the output are batch dimensions, in both and not the output are summed.
    fn einsum(&mut self, n: &CapturedNode, shape: &Shape) -> Result<(Op, Vec<usize>)> {
        let refuse = |why: &str| unsupported(n, &format!("einsum {why}: write it with matmul, transpose and sum"));
        let Some(Arg::Str(equation)) = n.arg(0, "equation") else { return Err(refuse("without an equation")) };
        let equation: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, out) = equation.split_once("->").ok_or_else(|| refuse("without an explicit output"))?;
        let operands: Vec<&str> = lhs.split(',').collect();
        let list = n.arg(1, "tensors").and_then(Arg::list).ok_or_else(|| refuse("without tensors"))?.to_vec();
        let distinct = |s: &str| s.chars().collect::<std::collections::BTreeSet<_>>().len() == s.len();
        if list.len() != operands.len()
            || !operands.iter().chain([&out]).all(|s| distinct(s) && s.chars().all(char::is_alphabetic))
        {
            return Err(refuse(&format!("{equation:?}")));
        }
        let inputs = list.iter().map(|a| self.tensor(n, a)).collect::<Result<Vec<_>>>()?;
        if operands.iter().zip(&inputs).any(|(s, &i)| s.len() != self.rank(i)) {
            return Err(refuse("whose letters do not match its operands' dimensions"));
        }
        let out: Vec<char> = out.chars().collect();
        if let [a] = inputs[..] {
            let letters: Vec<char> = operands[0].chars().collect();
            if letters.len() != out.len() {
                return Err(refuse("that sums within one operand"));
            }
            let dims =
                out.iter().map(|c| letters.iter().position(|l| l == c).ok_or_else(|| refuse("with a new letter")));
            return Ok((Op::Permute { dims: dims.collect::<Result<_>>()? }, vec![a]));
        }
        let [a, b] = inputs[..] else { return Err(refuse("of more than two operands")) };
        let (la, lb): (Vec<char>, Vec<char>) = (operands[0].chars().collect(), operands[1].chars().collect());
        // Each letter's size, from the operand that has it (both agree where both do, or broadcast from 1).
        let mut dim_of = std::collections::HashMap::new();
        for (letters, node) in [(&la, a), (&lb, b)] {
            for (p, &c) in letters.iter().enumerate() {
                let d = self.nodes[node].shape[p];
                if dim_of.get(&c).is_none_or(|&old| old == Dim::Fixed(1)) {
                    dim_of.insert(c, d);
                }
            }
        }
        let in_b = |c: &char| lb.contains(c);
        let batch: Vec<char> = la.iter().copied().filter(|c| in_b(c) && out.contains(c)).collect();
        let summed: Vec<char> = la.iter().copied().filter(|c| in_b(c) && !out.contains(c)).collect();
        let free_a: Vec<char> = la.iter().copied().filter(|c| !in_b(c)).collect();
        let free_b: Vec<char> = lb.iter().copied().filter(|c| !la.contains(c)).collect();
        if free_a.iter().chain(&free_b).any(|c| !out.contains(c))
            || out.len() != batch.len() + free_a.len() + free_b.len()
        {
            return Err(refuse("that sums a letter of one operand alone"));
        }
        let product = |letters: &[char]| -> Result<usize> {
            letters.iter().map(|c| dim_of.get(c).map_or(Ok(1), |&d| fixed(n, d))).product()
        };
        let (m, k, nn) = (product(&free_a)?, product(&summed)?, product(&free_b)?);
        let batch_shape: Vec<Dim> = batch.iter().filter_map(|c| dim_of.get(c).copied()).collect();
        // a: [batch.., free_a.., summed..] → [batch.., m, k]; b: [batch.., summed.., free_b..] → [batch.., k, n].
        let batch_len = batch.len();
        let arrange = |im: &mut Self, node: usize, letters: &[char], order: Vec<char>, rows: usize, cols: usize| {
            let dims: Vec<usize> = order.iter().filter_map(|c| letters.iter().position(|l| l == c)).collect();
            let permuted: Vec<Dim> = dims.iter().map(|&d| im.nodes[node].shape[d]).collect();
            // The operand's own batch sizes: the product broadcasts a 1 against the other's.
            let mut flat = permuted[..batch_len].to_vec();
            let p = im.push(n, Op::Permute { dims }, vec![node], permuted);
            flat.extend([Dim::Fixed(rows), Dim::Fixed(cols)]);
            im.push(n, Op::Reshape, vec![p], flat)
        };
        let order_a = [batch.clone(), free_a.clone(), summed.clone()].concat();
        let order_b = [batch.clone(), summed.clone(), free_b.clone()].concat();
        let a2 = arrange(self, a, &la, order_a, m, k);
        let b2 = arrange(self, b, &lb, order_b, k, nn);
        let mut product_shape = batch_shape.clone();
        product_shape.extend([Dim::Fixed(m), Dim::Fixed(nn)]);
        let mm = self.push(n, Op::MatMul, vec![a2, b2], product_shape);
        let natural: Vec<char> = [batch, free_a, free_b].concat();
        let natural_shape: Vec<Dim> = natural.iter().map(|c| dim_of.get(c).copied().unwrap_or(Dim::Fixed(1))).collect();
        let unflat = self.push(n, Op::Reshape, vec![mm], natural_shape);
        let dims: Vec<usize> = out.iter().filter_map(|c| natural.iter().position(|l| l == c)).collect();
        if dims.len() != out.len() || resolve(shape, 1).len() != out.len() {
            return Err(refuse("whose output does not follow from its operands"));
        }
        Ok((Op::Permute { dims }, vec![unflat]))
    }

    /// The graph's output: the logits, alone or beside outputs that are `None` (a nanoGPT-style `(logits,
    /// loss)` called without targets).
    fn output(&mut self, n: &CapturedNode) -> Result<()> {
        if self.c.outputs.iter().any(|o| o.kind != "user_output") {
            return Err(bad(n, "a module that changes its buffers while it runs"));
        }
        let returned: Vec<Arg> = n.args.first().and_then(Arg::list).unwrap_or_default().to_vec();
        let tensors: Vec<&Arg> = returned.iter().filter(|a| **a != Arg::None).collect();
        let [logits] = tensors[..] else {
            return Err(unsupported(
                n,
                "a module returning more than its logits (or nothing): return the logits alone",
            ));
        };
        self.output = Some(self.tensor(n, logits)?);
        Ok(())
    }

    fn finish(self) -> Result<Program> {
        let output = self.output.ok_or_else(|| Error::Data("the program has no output".into()))?;
        let out = &self.nodes[output];
        let vocab = match out.shape[..] {
            [Dim::Batch, Dim::Fixed(t), Dim::Fixed(v)] if t == self.context && v >= 2 => v,
            _ => {
                return Err(Error::UnsupportedModel {
                    op: "output".into(),
                    at: out.source.clone(),
                    why: format!(
                        "the module returns {:?}: a model program returns logits of shape (batch, {}, vocabulary)",
                        out.shape, self.context
                    ),
                });
            }
        };
        if !out.learns {
            return Err(Error::Data("the program's logits do not depend on any parameter".into()));
        }
        if self.units.is_empty() {
            return Err(Error::Data("the program has no linear or embedding: nothing to stream".into()));
        }
        if self.units[0].kind != UnitKind::Embedding {
            return Err(Error::Data("a model program starts with an embedding of its tokens".into()));
        }
        // Each vector parameter streams in the unit of the stage that first reads it, after that unit's bias.
        let mut program = Program {
            module: self.c.module.clone(),
            nodes: self.nodes,
            units: self.units,
            params: self.params,
            constants: self.constants,
            output,
            context: self.context,
            vocab,
            folder: std::path::PathBuf::new(),
        };
        for u in 0..program.units.len() {
            let mut offset = program.units[u].bias.as_ref().map_or(0, |_| program.units[u].outputs);
            for i in program.stage(u) {
                if let Op::Vector { param, offset: at } = &mut program.nodes[i].op {
                    *at = offset;
                    offset += program.params[*param].len();
                    program.units[u].vectors.push(*param);
                }
            }
        }
        Ok(program)
    }
}

/// The fixed size `d`, or the error for a batch-sized dimension where the program needs a fixed one.
fn fixed(n: &CapturedNode, d: Dim) -> Result<usize> {
    match d {
        Dim::Fixed(v) => Ok(v),
        Dim::Batch | Dim::PerBatch(_) => Err(bad(n, "an operation along the batch dimension")),
    }
}

/// A symbolic size as the batch (`s12`) or a multiple of it (`32*s12`); anything else is not a program's.
fn batch_dim(sym: &str) -> Option<Dim> {
    let is_symbol =
        |t: &str| t.strip_prefix('s').is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    if is_symbol(sym) {
        return Some(Dim::Batch);
    }
    let (a, b) = sym.split_once('*')?;
    let (a, b) = (a.trim(), b.trim());
    let k = if is_symbol(b) {
        a.parse().ok()?
    } else if is_symbol(a) {
        b.parse().ok()?
    } else {
        return None;
    };
    (1..=MAX_DIM).contains(&k).then_some(if k == 1 { Dim::Batch } else { Dim::PerBatch(k) })
}

/// Whether two shapes hold the same number of values for every batch.
fn same_count(a: &[Dim], b: &[Dim]) -> bool {
    let count = |s: &[Dim]| {
        let batch = s.iter().filter(|d| matches!(d, Dim::Batch | Dim::PerBatch(_))).count();
        let fixed: usize = s.iter().map(|d| d.at(1)).product();
        (batch, fixed)
    };
    count(a) == count(b)
}

/// Whether [`Importer::map`] maps `target` (the rest is refused as unknown before its shape is looked at).
fn mapped(target: &str) -> bool {
    const MAPPED: &[&str] = &[
        "aten.linear.default",
        "aten.embedding.default",
        "aten.layer_norm.default",
        "aten.rms_norm.default",
        "aten.pow.Tensor_Scalar",
        "aten.pow.Scalar",
        "aten.rsub.Scalar",
        "aten.mean.dim",
        "aten.sum.dim_IntList",
        "aten.softmax.int",
        "aten._softmax.default",
        "aten.view.default",
        "aten.reshape.default",
        "aten._unsafe_view.default",
        "aten.unsqueeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.squeeze.default",
        "aten.flatten.using_ints",
        "aten.transpose.int",
        "aten.t.default",
        "aten.numpy_T.default",
        "aten.permute.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.cat.default",
        "aten.expand.default",
        "aten.repeat_interleave.self_int",
        "aten.scaled_dot_product_attention.default",
        "aten.matmul.default",
        "aten.bmm.default",
        "aten.mm.default",
        "aten.arange.default",
        "aten.arange.start",
        "aten.arange.start_step",
        "aten.outer.default",
        "aten.ger.default",
        "aten.masked_fill.Scalar",
        "aten.__and__.Tensor",
        "aten.logical_and.default",
        "aten.bitwise_and.Tensor",
        "aten.__or__.Tensor",
        "aten.logical_or.default",
        "aten.bitwise_or.Tensor",
        "aten.logical_not.default",
        "aten.bitwise_not.default",
        "aten.cumsum.default",
        "aten.new_ones.default",
        "aten.ones.default",
        "aten.ones_like.default",
        "aten.new_zeros.default",
        "aten.zeros.default",
        "aten.zeros_like.default",
        "aten.full.default",
        "aten.new_full.default",
        "aten.full_like.default",
        "aten.index.Tensor",
        "aten.where.self",
        "aten.diff.default",
        "aten.addmm.default",
        "aten.square.default",
        "aten.sum.default",
        "aten.mean.default",
        "aten.var.dim",
        "aten.var.correction",
        "aten.clamp.default",
        "aten.tril.default",
        "aten.triu.default",
        "aten.log_softmax.int",
        "aten._log_softmax.default",
        "aten.stack.default",
        "aten.einsum.default",
        "aten.amax.default",
        "aten.repeat.default",
    ];
    MAPPED.contains(&target) || binary(target).is_some() || UNARY.contains(&target) || compare(target).is_some()
}

/// The comparison a target makes, with a number or a second tensor.
fn compare(target: &str) -> Option<Cmp> {
    let (name, variant) = target.strip_prefix("aten.")?.split_once('.')?;
    if variant != "Scalar" && variant != "Tensor" {
        return None;
    }
    Some(match name {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" => Cmp::Lt,
        "le" => Cmp::Le,
        "gt" => Cmp::Gt,
        "ge" => Cmp::Ge,
        _ => return None,
    })
}

/// The element-wise functions [`unary`] maps.
const UNARY: &[&str] = &[
    "aten.neg.default",
    "aten.relu.default",
    "aten.silu.default",
    "aten.gelu.default",
    "aten.exp.default",
    "aten.cos.default",
    "aten.sin.default",
    "aten.rsqrt.default",
    "aten.sqrt.default",
    "aten.reciprocal.default",
    "aten.tanh.default",
    "aten.erf.default",
    "aten.log.default",
    "aten.abs.default",
    "aten.sigmoid.default",
];

fn unary(target: &str, n: &CapturedNode) -> Option<Result<Unary>> {
    Some(Ok(match target {
        "aten.neg.default" => Unary::Neg,
        "aten.relu.default" => Unary::Relu,
        "aten.silu.default" => Unary::Silu,
        "aten.gelu.default" => {
            return Some(match n.arg(1, "approximate") {
                None => Ok(Unary::Gelu),
                Some(Arg::Str(s)) if s == "none" => Ok(Unary::Gelu),
                Some(Arg::Str(s)) if s == "tanh" => Ok(Unary::GeluTanh),
                Some(other) => Err(bad(n, &format!("GELU's approximation {other:?}"))),
            });
        }
        "aten.exp.default" => Unary::Exp,
        "aten.cos.default" => Unary::Cos,
        "aten.sin.default" => Unary::Sin,
        "aten.rsqrt.default" => Unary::Rsqrt,
        "aten.sqrt.default" => Unary::Sqrt,
        "aten.reciprocal.default" => Unary::Reciprocal,
        "aten.tanh.default" => Unary::Tanh,
        "aten.sigmoid.default" => Unary::Sigmoid,
        "aten.erf.default" => Unary::Erf,
        "aten.log.default" => Unary::Log,
        "aten.abs.default" => Unary::Abs,
        _ => return None,
    }))
}

fn binary(target: &str) -> Option<Binary> {
    Some(match target {
        "aten.add.Tensor" | "aten.add.Scalar" => Binary::Add,
        "aten.sub.Tensor" | "aten.sub.Scalar" => Binary::Sub,
        "aten.mul.Tensor" | "aten.mul.Scalar" => Binary::Mul,
        "aten.div.Tensor" | "aten.div.Scalar" => Binary::Div,
        _ => return None,
    })
}
