//! The math of a model program's operations, forward and backward, over row-major tensors: each
//! [`plan::program::Op`] that needs no streamed weights. (Units, tokens, constants and vectors are the
//! interpreter's, in [`super::exec`].) Norms and attention are recomputed from their inputs in the backward
//! pass rather than kept, so a value's only copy is the one the graph holds.

use super::tensor::{self, Tensor};
use kernels::dense::{MatView, matmul};
use plan::program::{Binary, Mask, Op, Unary};

/// Runs `op` over `inputs`, its output in `shape`. The importer has checked ranks, dimensions and
/// broadcasting, so a mismatch here is a bug of the importer.
pub fn forward(op: &Op, inputs: &[&Tensor], shape: &[usize]) -> Tensor {
    match op {
        Op::Unary(u) => inputs[0].map(|x| unary(*u, x)),
        Op::Binary(b) => {
            let (a, c) = (tensor::broadcast_to(inputs[0], shape), tensor::broadcast_to(inputs[1], shape));
            a.zip(&c, |x, y| binary(*b, x, y))
        }
        Op::Scalar { op, value, reversed } => {
            let v = *value;
            if *reversed { inputs[0].map(|x| binary(*op, v, x)) } else { inputs[0].map(|x| binary(*op, x, v)) }
        }
        Op::LayerNorm { eps, .. } => layer_norm(inputs, *eps).0,
        Op::RmsNorm { eps, .. } => rms_norm(inputs, *eps).0,
        Op::Mean { dims, .. } | Op::Sum { dims, .. } => {
            let kept = kept_shape(&inputs[0].shape, dims);
            let count = reduced_count(&inputs[0].shape, dims);
            let scale = if matches!(op, Op::Mean { .. }) { 1.0 / count as f32 } else { 1.0 };
            let s = tensor::reduce_to(inputs[0], &kept);
            Tensor::new(shape.to_vec(), s.data.iter().map(|v| v * scale).collect())
        }
        Op::Softmax => softmax_rows(inputs[0]),
        Op::Reshape => Tensor::new(shape.to_vec(), inputs[0].data.clone()),
        Op::Permute { dims } => tensor::permute(inputs[0], dims),
        Op::Slice { dim, start, end, step } => tensor::slice(inputs[0], *dim, *start, *end, *step),
        Op::Cat { dim } => tensor::cat(inputs, *dim),
        Op::Expand => tensor::broadcast_to(inputs[0], shape),
        Op::RepeatInterleave { repeats, dim } => tensor::repeat_interleave(inputs[0], *repeats, *dim),
        Op::Attention { causal, scale, mask } => attention(inputs, *causal, *scale, *mask).0,
        Op::MatMul => batched_matmul(inputs[0], inputs[1], shape),
        Op::Arange { start, step } => {
            let n = shape.first().copied().unwrap_or(0);
            Tensor::new(shape.to_vec(), (0..n).map(|i| start + step * i as f32).collect())
        }
        Op::Compare { cmp, value: Some(v) } => inputs[0].map(|x| f32::from(u8::from(cmp.holds(x, *v)))),
        Op::Compare { cmp, value: None } => {
            let (a, b) = (tensor::broadcast_to(inputs[0], shape), tensor::broadcast_to(inputs[1], shape));
            a.zip(&b, |x, y| f32::from(u8::from(cmp.holds(x, y))))
        }
        Op::Cumsum { dim } => cumsum(inputs[0], *dim, false),
        Op::Clamp { min, max } => inputs[0].map(|x| min.map_or(x, |m| x.max(m)).min(max.unwrap_or(f32::INFINITY))),
        Op::Triangle { upper, diagonal } => triangle(inputs[0], *upper, *diagonal),
        Op::Amax { dims, .. } => {
            let kept = kept_shape(&inputs[0].shape, dims);
            let (max, _) = amax(inputs[0], &kept);
            Tensor::new(shape.to_vec(), max)
        }
        Op::LogSoftmax => {
            let mut y = softmax_rows(inputs[0]);
            y.data.iter_mut().for_each(|p| *p = p.ln());
            y
        }
        Op::Fill { value } => Tensor::new(shape.to_vec(), vec![*value; shape.iter().product()]),
        Op::Index => index(inputs, shape),
        Op::Where => {
            let c = tensor::broadcast_to(inputs[0], shape);
            let (a, b) = (tensor::broadcast_to(inputs[1], shape), tensor::broadcast_to(inputs[2], shape));
            let data = c.data.iter().zip(a.data.iter().zip(&b.data)).map(|(&c, (&a, &b))| if c != 0.0 { a } else { b });
            Tensor::new(shape.to_vec(), data.collect())
        }
        Op::MaskedFill { value } => {
            let mask = tensor::broadcast_to(inputs[1], shape);
            let x = tensor::broadcast_to(inputs[0], shape);
            x.zip(&mask, |x, m| if m != 0.0 { *value } else { x })
        }
        Op::Tokens | Op::Constant { .. } | Op::Vector { .. } | Op::Linear { .. } | Op::Embedding { .. } => {
            unreachable!("the interpreter runs {op:?} itself")
        }
    }
}

/// The gradients of `op`'s inputs given its output's gradient `dy` (and its output `y`): one per input, `None`
/// where `wants` says the input takes none.
pub fn backward(op: &Op, inputs: &[&Tensor], y: &Tensor, dy: &Tensor, wants: &[bool]) -> Vec<Option<Tensor>> {
    let want = |i: usize| wants.get(i).copied().unwrap_or(false);
    let one = |g: Tensor| vec![Some(g)];
    match op {
        Op::Unary(u) => one(Tensor::new(
            dy.shape.clone(),
            inputs[0].data.iter().zip(&y.data).zip(&dy.data).map(|((&x, &y), &g)| g * slope(*u, x, y)).collect(),
        )),
        Op::Binary(b) => binary_backward(*b, inputs, dy, wants),
        Op::Scalar { op, value, reversed } => {
            let v = *value;
            let d = |x: f32, y: f32| match (op, reversed) {
                (Binary::Add, _) => 1.0,
                (Binary::Sub, false) => 1.0,
                (Binary::Sub, true) => -1.0,
                (Binary::Mul, _) => v,
                (Binary::Div, false) => 1.0 / v,
                (Binary::Div, true) => -v / (x * x),
                (Binary::Pow, false) => v * x.powf(v - 1.0),
                (Binary::Pow, true) => y * v.ln(),
            };
            one(Tensor::new(
                dy.shape.clone(),
                inputs[0].data.iter().zip(&y.data).zip(&dy.data).map(|((&x, &y), &g)| g * d(x, y)).collect(),
            ))
        }
        Op::LayerNorm { eps, gain, bias } => layer_norm_backward(inputs, dy, *eps, (*gain, *bias), wants),
        Op::RmsNorm { eps, gain } => rms_norm_backward(inputs, dy, *eps, *gain, wants),
        Op::Mean { dims, .. } | Op::Sum { dims, .. } => {
            let x = &inputs[0].shape;
            let kept = kept_shape(x, dims);
            let scale = if matches!(op, Op::Mean { .. }) { 1.0 / reduced_count(x, dims) as f32 } else { 1.0 };
            let g = tensor::broadcast_to(&Tensor::new(kept, dy.data.clone()), x);
            one(g.map(|v| v * scale))
        }
        Op::Softmax => {
            let c = y.last().max(1);
            let mut dx = vec![0.0; y.len()];
            for ((d, y), g) in dx.chunks_mut(c).zip(y.data.chunks(c)).zip(dy.data.chunks(c)) {
                let dot: f32 = y.iter().zip(g).map(|(a, b)| a * b).sum();
                d.iter_mut().zip(y).zip(g).for_each(|((d, y), g)| *d = y * (g - dot));
            }
            one(Tensor::new(y.shape.clone(), dx))
        }
        Op::Reshape => one(Tensor::new(inputs[0].shape.clone(), dy.data.clone())),
        Op::Permute { dims } => one(tensor::permute(dy, &tensor::inverse(dims))),
        Op::Slice { dim, start, step, .. } => one(tensor::unslice(dy, &inputs[0].shape, *dim, *start, *step)),
        Op::Cat { dim } => {
            let mut start = 0;
            inputs
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let size = x.shape[*dim];
                    start += size;
                    want(i).then(|| tensor::slice(dy, *dim, start - size, start, 1))
                })
                .collect()
        }
        Op::Expand => one(tensor::reduce_to(dy, &inputs[0].shape)),
        Op::RepeatInterleave { repeats, dim } => one(tensor::unrepeat(dy, *repeats, *dim)),
        Op::Attention { causal, scale, mask } => attention_backward(inputs, dy, *causal, *scale, *mask),
        Op::Cumsum { dim } => one(cumsum(dy, *dim, true)),
        Op::Clamp { min, max } => {
            let inside = |x: f32| min.is_none_or(|m| x >= m) && max.is_none_or(|m| x <= m);
            one(inputs[0].zip(dy, |x, g| if inside(x) { g } else { 0.0 }))
        }
        Op::Triangle { upper, diagonal } => one(triangle(dy, *upper, *diagonal)),
        Op::Amax { dims, .. } => {
            let kept = kept_shape(&inputs[0].shape, dims);
            let (_, at) = amax(inputs[0], &kept);
            let mut g = vec![0.0; inputs[0].len()];
            at.iter().zip(&dy.data).for_each(|(&i, &d)| g[i] += d);
            one(Tensor::new(inputs[0].shape.clone(), g))
        }
        Op::LogSoftmax => {
            // dx = dy − softmax · Σ dy, row by row (softmax = exp(y)).
            let c = y.last().max(1);
            let mut dx = vec![0.0; y.len()];
            for ((d, y), g) in dx.chunks_mut(c).zip(y.data.chunks(c)).zip(dy.data.chunks(c)) {
                let total: f32 = g.iter().sum();
                d.iter_mut().zip(y).zip(g).for_each(|((d, y), g)| *d = g - y.exp() * total);
            }
            one(Tensor::new(y.shape.clone(), dx))
        }
        Op::Index => {
            let mut g = vec![Some(unindex(inputs, dy))];
            g.extend(std::iter::repeat_n(None, inputs.len() - 1));
            g
        }
        Op::Where => {
            let c = tensor::broadcast_to(inputs[0], &dy.shape);
            let pick = |keep: bool| dy.zip(&c, |g, c| if (c != 0.0) == keep { g } else { 0.0 });
            vec![
                None,
                want(1).then(|| tensor::reduce_to(&pick(true), &inputs[1].shape)),
                want(2).then(|| tensor::reduce_to(&pick(false), &inputs[2].shape)),
            ]
        }
        Op::MatMul => matmul_backward(inputs, dy, wants),
        Op::MaskedFill { .. } => {
            let mask = tensor::broadcast_to(inputs[1], &dy.shape);
            let g = dy.zip(&mask, |g, m| if m != 0.0 { 0.0 } else { g });
            vec![Some(tensor::reduce_to(&g, &inputs[0].shape)), None]
        }
        Op::Arange { .. } | Op::Compare { .. } | Op::Fill { .. } => vec![None; inputs.len()],
        Op::Tokens | Op::Constant { .. } | Op::Vector { .. } | Op::Linear { .. } | Op::Embedding { .. } => {
            unreachable!("the interpreter runs {op:?} itself")
        }
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn unary(u: Unary, x: f32) -> f32 {
    match u {
        Unary::Neg => -x,
        Unary::Relu => x.max(0.0),
        Unary::Silu => x * sigmoid(x),
        Unary::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        Unary::GeluTanh => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh()),
        Unary::Exp => x.exp(),
        Unary::Cos => x.cos(),
        Unary::Sin => x.sin(),
        Unary::Rsqrt => 1.0 / x.sqrt(),
        Unary::Sqrt => x.sqrt(),
        Unary::Reciprocal => 1.0 / x,
        Unary::Tanh => x.tanh(),
        Unary::Sigmoid => sigmoid(x),
        Unary::Erf => libm::erff(x),
        Unary::Log => x.ln(),
        Unary::Abs => x.abs(),
        Unary::Identity => x,
    }
}

/// dy/dx of `u` at `x`, where `y = u(x)`.
fn slope(u: Unary, x: f32, y: f32) -> f32 {
    match u {
        Unary::Neg => -1.0,
        Unary::Relu => f32::from(u8::from(x > 0.0)),
        Unary::Silu => {
            let s = sigmoid(x);
            s + x * s * (1.0 - s)
        }
        Unary::Gelu => {
            let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f32::consts::PI).sqrt();
            cdf + x * pdf
        }
        Unary::GeluTanh => {
            let inner = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
            let t = inner.tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        }
        Unary::Exp => y,
        Unary::Cos => -x.sin(),
        Unary::Sin => x.cos(),
        Unary::Rsqrt => -0.5 * y * y * y,
        Unary::Sqrt => 0.5 / y,
        Unary::Reciprocal => -y * y,
        Unary::Tanh => 1.0 - y * y,
        Unary::Sigmoid => y * (1.0 - y),
        Unary::Erf => 2.0 / std::f32::consts::PI.sqrt() * (-x * x).exp(),
        Unary::Log => 1.0 / x,
        Unary::Abs => x.signum(),
        Unary::Identity => 1.0,
    }
}

fn binary(b: Binary, x: f32, y: f32) -> f32 {
    match b {
        Binary::Add => x + y,
        Binary::Sub => x - y,
        Binary::Mul => x * y,
        Binary::Div => x / y,
        Binary::Pow => x.powf(y),
    }
}

fn binary_backward(b: Binary, inputs: &[&Tensor], dy: &Tensor, wants: &[bool]) -> Vec<Option<Tensor>> {
    let shape = &dy.shape;
    let (x, y) = (tensor::broadcast_to(inputs[0], shape), tensor::broadcast_to(inputs[1], shape));
    let grad = |second: bool, to: &[usize]| {
        let g: Vec<f32> = x
            .data
            .iter()
            .zip(&y.data)
            .zip(&dy.data)
            .map(|((&a, &c), &g)| {
                let (da, dc) = partials(b, a, c);
                g * if second { dc } else { da }
            })
            .collect();
        tensor::reduce_to(&Tensor::new(shape.clone(), g), to)
    };
    vec![
        wants.first().copied().unwrap_or(false).then(|| grad(false, &inputs[0].shape)),
        wants.get(1).copied().unwrap_or(false).then(|| grad(true, &inputs[1].shape)),
    ]
}

/// The partial derivatives of `b` at `(x, y)` with respect to each operand.
fn partials(b: Binary, x: f32, y: f32) -> (f32, f32) {
    match b {
        Binary::Add => (1.0, 1.0),
        Binary::Sub => (1.0, -1.0),
        Binary::Mul => (y, x),
        Binary::Div => (1.0 / y, -x / (y * y)),
        Binary::Pow => (y * x.powf(y - 1.0), x.powf(y) * x.ln()),
    }
}

/// `shape` with `dims` set to 1.
fn kept_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape.iter().enumerate().map(|(i, &s)| if dims.contains(&i) { 1 } else { s }).collect()
}

fn reduced_count(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape[d]).product::<usize>().max(1)
}

/// Softmax along the last dimension (a row of −∞ gives zeros, not NaN).
fn softmax_rows(x: &Tensor) -> Tensor {
    let c = x.last().max(1);
    let mut y = x.data.clone();
    for row in y.chunks_mut(c) {
        softmax_in_place(row);
    }
    Tensor::new(x.shape.clone(), y)
}

fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    row.iter_mut().for_each(|v| *v /= sum);
}

/// Layer norm of `inputs[0]` with the optional gain and bias that follow it: the output, the normalised rows
/// and each row's reciprocal standard deviation.
fn layer_norm(inputs: &[&Tensor], eps: f32) -> (Tensor, Vec<f32>, Vec<f32>) {
    let x = inputs[0];
    let c = x.last().max(1);
    let (gain, bias) = (inputs.get(1), inputs.get(2));
    let mut xhat = vec![0.0; x.len()];
    let mut rstds = Vec::with_capacity(x.len() / c);
    for (row, out) in x.data.chunks(c).zip(xhat.chunks_mut(c)) {
        let mean = row.iter().sum::<f32>() / c as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / c as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        out.iter_mut().zip(row).for_each(|(o, v)| *o = (v - mean) * rstd);
        rstds.push(rstd);
    }
    let mut y = xhat.clone();
    for row in y.chunks_mut(c) {
        for (i, v) in row.iter_mut().enumerate() {
            *v = *v * gain.map_or(1.0, |g| g.data[i]) + bias.map_or(0.0, |b| b.data[i]);
        }
    }
    (Tensor::new(x.shape.clone(), y), xhat, rstds)
}

fn layer_norm_backward(
    inputs: &[&Tensor],
    dy: &Tensor,
    eps: f32,
    (gain, bias): (bool, bool),
    wants: &[bool],
) -> Vec<Option<Tensor>> {
    let c = dy.last().max(1);
    let (_, xhat, rstds) = layer_norm(&inputs[..1], eps);
    let g = gain.then(|| inputs[1]);
    let (mut dx, mut dg, mut db) = (vec![0.0; dy.len()], vec![0.0; c], vec![0.0; c]);
    for (((d, xh), gy), rstd) in dx.chunks_mut(c).zip(xhat.chunks(c)).zip(dy.data.chunks(c)).zip(&rstds) {
        let dxhat: Vec<f32> = gy.iter().enumerate().map(|(i, v)| v * g.map_or(1.0, |g| g.data[i])).collect();
        let mean = dxhat.iter().sum::<f32>() / c as f32;
        let mean_x = dxhat.iter().zip(xh).map(|(a, b)| a * b).sum::<f32>() / c as f32;
        for i in 0..c {
            d[i] = rstd * (dxhat[i] - mean - xh[i] * mean_x);
            dg[i] += gy[i] * xh[i];
            db[i] += gy[i];
        }
    }
    let mut out = vec![Some(Tensor::new(dy.shape.clone(), dx))];
    if gain {
        out.push(wants.get(1).copied().unwrap_or(false).then(|| Tensor::new(vec![c], dg)));
    }
    if bias {
        let i = out.len();
        out.push(wants.get(i).copied().unwrap_or(false).then(|| Tensor::new(vec![c], db)));
    }
    out
}

/// RMS norm of `inputs[0]` with the optional gain after it: the output, the normalised rows and each row's
/// reciprocal root mean square.
fn rms_norm(inputs: &[&Tensor], eps: f32) -> (Tensor, Vec<f32>, Vec<f32>) {
    let x = inputs[0];
    let c = x.last().max(1);
    let mut xhat = vec![0.0; x.len()];
    let mut rstds = Vec::with_capacity(x.len() / c);
    for (row, out) in x.data.chunks(c).zip(xhat.chunks_mut(c)) {
        let rstd = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / c as f32 + eps).sqrt();
        out.iter_mut().zip(row).for_each(|(o, v)| *o = v * rstd);
        rstds.push(rstd);
    }
    let mut y = xhat.clone();
    if let Some(g) = inputs.get(1) {
        for row in y.chunks_mut(c) {
            row.iter_mut().zip(&g.data).for_each(|(v, g)| *v *= g);
        }
    }
    (Tensor::new(x.shape.clone(), y), xhat, rstds)
}

fn rms_norm_backward(inputs: &[&Tensor], dy: &Tensor, eps: f32, gain: bool, wants: &[bool]) -> Vec<Option<Tensor>> {
    let c = dy.last().max(1);
    let (_, xhat, rstds) = rms_norm(&inputs[..1], eps);
    let g = gain.then(|| inputs[1]);
    let (mut dx, mut dg) = (vec![0.0; dy.len()], vec![0.0; c]);
    for (((d, xh), gy), rstd) in dx.chunks_mut(c).zip(xhat.chunks(c)).zip(dy.data.chunks(c)).zip(&rstds) {
        let dxhat: Vec<f32> = gy.iter().enumerate().map(|(i, v)| v * g.map_or(1.0, |g| g.data[i])).collect();
        let mean_x = dxhat.iter().zip(xh).map(|(a, b)| a * b).sum::<f32>() / c as f32;
        for i in 0..c {
            d[i] = rstd * (dxhat[i] - xh[i] * mean_x);
            dg[i] += gy[i] * xh[i];
        }
    }
    let mut out = vec![Some(Tensor::new(dy.shape.clone(), dx))];
    if gain {
        out.push(wants.get(1).copied().unwrap_or(false).then(|| Tensor::new(vec![c], dg)));
    }
    out
}

/// The leading (batch) shape of a batched matrix product's operands broadcast together, and the count.
fn batch_of(shape: &[usize]) -> (Vec<usize>, usize) {
    let lead = shape[..shape.len() - 2].to_vec();
    let count = lead.iter().product();
    (lead, count)
}

/// `a · b` over the last two dimensions, leading ones broadcast to `shape`'s.
fn batched_matmul(a: &Tensor, b: &Tensor, shape: &[usize]) -> Tensor {
    let r = shape.len();
    let (m, n, k) = (shape[r - 2], shape[r - 1], a.last());
    let (lead, count) = batch_of(shape);
    let a = tensor::broadcast_to(a, &[lead.clone(), vec![m, k]].concat());
    let b = tensor::broadcast_to(b, &[lead, vec![k, n]].concat());
    let mut out = vec![0.0; count * m * n];
    for i in 0..count {
        let (x, y) =
            (MatView::new(&a.data[i * m * k..][..m * k], m, k), MatView::new(&b.data[i * k * n..][..k * n], k, n));
        matmul(&mut out[i * m * n..][..m * n], x, y, false);
    }
    Tensor::new(shape.to_vec(), out)
}

fn matmul_backward(inputs: &[&Tensor], dy: &Tensor, wants: &[bool]) -> Vec<Option<Tensor>> {
    let shape = &dy.shape;
    let r = shape.len();
    let (m, n, k) = (shape[r - 2], shape[r - 1], inputs[0].last());
    let (lead, count) = batch_of(shape);
    let a = tensor::broadcast_to(inputs[0], &[lead.clone(), vec![m, k]].concat());
    let b = tensor::broadcast_to(inputs[1], &[lead.clone(), vec![k, n]].concat());
    let (mut da, mut db) = (vec![0.0; count * m * k], vec![0.0; count * k * n]);
    for i in 0..count {
        let g = MatView::new(&dy.data[i * m * n..][..m * n], m, n);
        let x = MatView::new(&a.data[i * m * k..][..m * k], m, k);
        let y = MatView::new(&b.data[i * k * n..][..k * n], k, n);
        matmul(&mut da[i * m * k..][..m * k], g, y.t(), false);
        matmul(&mut db[i * k * n..][..k * n], x.t(), g, false);
    }
    let da = Tensor::new([lead.clone(), vec![m, k]].concat(), da);
    let db = Tensor::new([lead, vec![k, n]].concat(), db);
    vec![
        wants.first().copied().unwrap_or(false).then(|| tensor::reduce_to(&da, &inputs[0].shape)),
        wants.get(1).copied().unwrap_or(false).then(|| tensor::reduce_to(&db, &inputs[1].shape)),
    ]
}

/// Scaled dot-product attention over `[.., tokens, head_dim]` (every leading dimension a separate head):
/// the output and the probabilities.
fn attention(inputs: &[&Tensor], causal: bool, scale: Option<f32>, mask: Option<Mask>) -> (Tensor, Vec<f32>) {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let r = q.shape.len();
    let (t, d, s, dv) = (q.shape[r - 2], q.last(), k.shape[r - 2], v.last());
    let heads = q.len() / (t * d).max(1);
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    // The mask broadcast to every head's scores.
    let masks = mask.zip(inputs.get(3)).map(|(kind, m)| {
        let mut full = q.shape[..r - 2].to_vec();
        full.extend([t, s]);
        (kind, tensor::broadcast_to(m, &full))
    });
    let mut probs = vec![0.0; heads * t * s];
    let mut out = vec![0.0; heads * t * dv];
    for h in 0..heads {
        let qh = MatView::new(&q.data[h * t * d..][..t * d], t, d);
        let kh = MatView::new(&k.data[h * s * d..][..s * d], s, d);
        let p = &mut probs[h * t * s..][..t * s];
        matmul(p, qh, kh.t(), false);
        for (i, row) in p.chunks_mut(s).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = if causal && j > i + s - t { f32::NEG_INFINITY } else { *v * scale };
            }
            if let Some((kind, m)) = &masks {
                let mrow = &m.data[(h * t + i) * s..][..s];
                for (v, &m) in row.iter_mut().zip(mrow) {
                    match kind {
                        Mask::Keep if m == 0.0 => *v = f32::NEG_INFINITY,
                        Mask::Keep => {}
                        Mask::Additive => *v += m,
                    }
                }
            }
            softmax_in_place(row);
        }
        let vh = MatView::new(&v.data[h * s * dv..][..s * dv], s, dv);
        matmul(&mut out[h * t * dv..][..t * dv], MatView::new(p, t, s), vh, false);
    }
    let mut shape = q.shape.clone();
    shape[r - 1] = dv;
    (Tensor::new(shape, out), probs)
}

fn attention_backward(
    inputs: &[&Tensor],
    dy: &Tensor,
    causal: bool,
    scale: Option<f32>,
    mask: Option<Mask>,
) -> Vec<Option<Tensor>> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let r = q.shape.len();
    let (t, d, s, dv) = (q.shape[r - 2], q.last(), k.shape[r - 2], v.last());
    let heads = q.len() / (t * d).max(1);
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let (_, probs) = attention(inputs, causal, Some(scale), mask);
    let (mut dq, mut dk, mut dvv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let mut dp = vec![0.0; t * s];
    for h in 0..heads {
        let p = MatView::new(&probs[h * t * s..][..t * s], t, s);
        let g = MatView::new(&dy.data[h * t * dv..][..t * dv], t, dv);
        let vh = MatView::new(&v.data[h * s * dv..][..s * dv], s, dv);
        matmul(&mut dvv[h * s * dv..][..s * dv], p.t(), g, false);
        matmul(&mut dp, g, vh.t(), false);
        let pr = &probs[h * t * s..][..t * s];
        for (drow, prow) in dp.chunks_mut(s).zip(pr.chunks(s)) {
            let dot: f32 = drow.iter().zip(prow).map(|(a, b)| a * b).sum();
            drow.iter_mut().zip(prow).for_each(|(d, p)| *d = p * (*d - dot) * scale);
        }
        let ds = MatView::new(&dp, t, s);
        let qh = MatView::new(&q.data[h * t * d..][..t * d], t, d);
        let kh = MatView::new(&k.data[h * s * d..][..s * d], s, d);
        matmul(&mut dq[h * t * d..][..t * d], ds, kh, false);
        matmul(&mut dk[h * s * d..][..s * d], ds.t(), qh, false);
    }
    let mut grads = vec![
        Some(Tensor::new(q.shape.clone(), dq)),
        Some(Tensor::new(k.shape.clone(), dk)),
        Some(Tensor::new(v.shape.clone(), dvv)),
    ];
    grads.extend(inputs.get(3).map(|_| None));
    grads
}

/// The largest value of `x` over the dimensions `kept` holds at 1, and the flat position of the first holding
/// it, for every position of `kept`.
fn amax(x: &Tensor, kept: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let count: usize = kept.iter().product();
    let (mut max, mut at) = (vec![f32::NEG_INFINITY; count], vec![usize::MAX; count]);
    let own = tensor::strides(&x.shape);
    let out = tensor::strides(kept);
    for (i, &v) in x.data.iter().enumerate() {
        let o: usize =
            (0..x.shape.len()).map(|d| if kept[d] == 1 { 0 } else { (i / own[d]) % x.shape[d] * out[d] }).sum();
        if v > max[o] || at[o] == usize::MAX {
            (max[o], at[o]) = (v, i);
        }
    }
    (max, at)
}

/// `x` with the elements of its last two dimensions off one side of `diagonal` set to 0 (`tril`, or `triu`
/// when `upper`).
fn triangle(x: &Tensor, upper: bool, diagonal: i64) -> Tensor {
    let r = x.shape.len();
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let mut y = x.data.clone();
    for block in y.chunks_mut((rows * cols).max(1)) {
        for (i, row) in block.chunks_mut(cols.max(1)).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                let offset = j as i64 - i as i64;
                if (upper && offset < diagonal) || (!upper && offset > diagonal) {
                    *v = 0.0;
                }
            }
        }
    }
    Tensor::new(x.shape.clone(), y)
}

/// Running sums of `x` along `dim` (from the end when `reverse`: the gradient of the forward sums).
fn cumsum(x: &Tensor, dim: usize, reverse: bool) -> Tensor {
    let size = x.shape[dim];
    let inner: usize = x.shape[dim + 1..].iter().product();
    let mut y = x.data.clone();
    for block in y.chunks_mut((size * inner).max(1)) {
        let order: Box<dyn Iterator<Item = usize>> =
            if reverse { Box::new((0..size).rev()) } else { Box::new(0..size) };
        let mut previous: Option<usize> = None;
        for j in order {
            if let Some(p) = previous {
                for c in 0..inner {
                    block[j * inner + c] += block[p * inner + c];
                }
            }
            previous = Some(j);
        }
    }
    Tensor::new(x.shape.clone(), y)
}

/// For every position of the broadcast index tensors (`inputs[1..]`, one per leading dimension of `x`), the
/// flat offset of the slice of `x` it picks, and that slice's length.
fn index_offsets(inputs: &[&Tensor], shape: &[usize]) -> (Vec<usize>, usize) {
    let x = inputs[0];
    let k = inputs.len() - 1;
    let inner: usize = x.shape[k..].iter().product();
    let lead = &shape[..shape.len() - (x.shape.len() - k)];
    let strides = tensor::strides(&x.shape[..k]);
    let idx: Vec<Tensor> = inputs[1..].iter().map(|i| tensor::broadcast_to(i, lead)).collect();
    let count: usize = lead.iter().product();
    let offsets = (0..count)
        .map(|p| {
            idx.iter()
                .enumerate()
                .map(|(d, i)| {
                    let size = x.shape[d] as i64;
                    let v = i.data[p] as i64;
                    let v = if v < 0 { v + size } else { v };
                    v.clamp(0, size - 1) as usize * strides[d]
                })
                .sum::<usize>()
                * inner
        })
        .collect();
    (offsets, inner)
}

fn index(inputs: &[&Tensor], shape: &[usize]) -> Tensor {
    let x = inputs[0];
    let (offsets, inner) = index_offsets(inputs, shape);
    let mut data = Vec::with_capacity(offsets.len() * inner);
    for o in offsets {
        data.extend_from_slice(&x.data[o..o + inner]);
    }
    Tensor::new(shape.to_vec(), data)
}

fn unindex(inputs: &[&Tensor], dy: &Tensor) -> Tensor {
    let (offsets, inner) = index_offsets(inputs, &dy.shape);
    let mut g = vec![0.0; inputs[0].len()];
    for (p, o) in offsets.into_iter().enumerate() {
        g[o..o + inner].iter_mut().zip(&dy.data[p * inner..(p + 1) * inner]).for_each(|(a, b)| *a += b);
    }
    Tensor::new(inputs[0].shape.clone(), g)
}
