//! Every operation's backward pass against central differences, and whole captured decoders (Qwen2-, GPT-J-
//! and GPT-2-style, `plan/tests/programs`) against what PyTorch computed for them: the logits and the gradient
//! of every parameter.

use std::collections::HashMap;
use std::path::PathBuf;

use super::exec::{Constants, DenseUnits, Exec};
use super::ops;
use super::tensor::Tensor;
use plan::program::{Binary, Cmp, Mask, Op, Program, Unary};

/// Deterministic values in about [-1, 1].
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn random(shape: &[usize], seed: u64) -> Tensor {
    Tensor::new(shape.to_vec(), values(shape.iter().product(), seed))
}

/// Checks `op`'s backward against central differences of `Σ forward(inputs) · w` for every input in `wants`.
fn check(op: Op, inputs: Vec<Tensor>, shape: &[usize], wants: &[bool]) {
    let w = random(shape, 99);
    let objective = |xs: &[Tensor]| -> f64 {
        let refs: Vec<&Tensor> = xs.iter().collect();
        let y = ops::forward(&op, &refs, shape);
        y.data.iter().zip(&w.data).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum()
    };
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let y = ops::forward(&op, &refs, shape);
    assert_eq!(y.shape, shape, "{op:?} computes its node's shape");
    let grads = ops::backward(&op, &refs, &y, &w, wants);
    let h = 1e-2f32;
    for (k, want) in wants.iter().enumerate() {
        if !want {
            continue;
        }
        let g = grads[k].as_ref().unwrap_or_else(|| panic!("{op:?}: no gradient for input {k}"));
        assert_eq!(g.shape, inputs[k].shape, "{op:?}: input {k}'s gradient has its shape");
        for i in 0..inputs[k].len() {
            let (mut up, mut down) = (inputs.clone(), inputs.clone());
            up[k].data[i] += h;
            down[k].data[i] -= h;
            let fd = (objective(&up) - objective(&down)) / (2.0 * f64::from(h));
            let a = f64::from(g.data[i]);
            assert!((fd - a).abs() < 2e-2 * (1.0 + fd.abs()), "{op:?} input {k}[{i}]: analytic {a} vs numeric {fd}");
        }
    }
}

#[test]
fn element_wise_operations_match_central_differences() {
    use Unary::*;
    // Away from 0, where ReLU's kink would make central differences of step 0.01 meaningless.
    let x = Tensor::new(vec![3, 5], values(15, 1).iter().map(|v| v + 0.1 * v.signum()).collect());
    for u in [Neg, Relu, Silu, Gelu, GeluTanh, Exp, Cos, Sin, Tanh, Sigmoid, Erf, Abs, Identity] {
        check(Op::Unary(u), vec![x.clone()], &[3, 5], &[true]);
    }
    let positive = Tensor::new(vec![3, 5], values(15, 2).iter().map(|v| 1.5 + v).collect());
    for u in [Rsqrt, Sqrt, Reciprocal, Log] {
        check(Op::Unary(u), vec![positive.clone()], &[3, 5], &[true]);
    }
    for b in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
        let rhs = Tensor::new(vec![5], values(5, 4).iter().map(|v| 1.5 + v).collect());
        check(Op::Binary(b), vec![random(&[2, 3, 5], 3), rhs.clone()], &[2, 3, 5], &[true, true]);
        check(Op::Binary(b), vec![rhs, random(&[3, 1], 5)], &[3, 5], &[true, true]);
        for reversed in [false, true] {
            check(Op::Scalar { op: b, value: 1.7, reversed }, vec![positive.clone()], &[3, 5], &[true]);
        }
    }
    for reversed in [false, true] {
        check(Op::Scalar { op: Binary::Pow, value: 2.0, reversed }, vec![positive.clone()], &[3, 5], &[true]);
    }
    let mask = Tensor::new(vec![1, 5], vec![1.0, 0.0, 0.0, 1.0, 0.0]);
    check(Op::MaskedFill { value: -3.0 }, vec![random(&[3, 5], 6), mask], &[3, 5], &[true, false]);
}

#[test]
fn norms_reductions_and_softmax_match_central_differences() {
    let x = random(&[2, 3, 6], 7);
    let (g, b) = (random(&[6], 8), random(&[6], 9));
    check(Op::LayerNorm { eps: 1e-5, gain: true, bias: true }, vec![x.clone(), g.clone(), b], &[2, 3, 6], &[true; 3]);
    check(Op::LayerNorm { eps: 1e-5, gain: false, bias: false }, vec![x.clone()], &[2, 3, 6], &[true]);
    check(Op::RmsNorm { eps: 1e-6, gain: true }, vec![x.clone(), g], &[2, 3, 6], &[true, true]);
    check(Op::RmsNorm { eps: 1e-6, gain: false }, vec![x.clone()], &[2, 3, 6], &[true]);
    check(Op::Mean { dims: vec![2], keep: true }, vec![x.clone()], &[2, 3, 1], &[true]);
    check(Op::Sum { dims: vec![0, 2], keep: false }, vec![x.clone()], &[3], &[true]);
    check(Op::Softmax, vec![x], &[2, 3, 6], &[true]);
}

#[test]
fn shape_operations_match_central_differences() {
    let x = random(&[2, 3, 4], 10);
    check(Op::Reshape, vec![x.clone()], &[6, 4], &[true]);
    check(Op::Permute { dims: vec![2, 0, 1] }, vec![x.clone()], &[4, 2, 3], &[true]);
    check(Op::Slice { dim: 2, start: 1, end: 4, step: 2 }, vec![x.clone()], &[2, 3, 2], &[true]);
    check(Op::Cat { dim: 1 }, vec![x.clone(), random(&[2, 2, 4], 11)], &[2, 5, 4], &[true, true]);
    check(Op::Expand, vec![random(&[3, 1], 12)], &[2, 3, 4], &[true]);
    check(Op::RepeatInterleave { repeats: 3, dim: 1 }, vec![x.clone()], &[2, 9, 4], &[true]);
    check(Op::MatMul, vec![x, random(&[4, 5], 13)], &[2, 3, 5], &[true, true]);
    check(Op::MatMul, vec![random(&[2, 1, 3, 4], 14), random(&[3, 4, 2], 15)], &[2, 3, 3, 2], &[true, true]);
}

#[test]
fn attention_matches_central_differences_and_a_direct_computation() {
    let (q, k, v) = (random(&[2, 2, 4, 3], 16), random(&[2, 2, 4, 3], 17), random(&[2, 2, 4, 5], 18));
    for causal in [true, false] {
        for scale in [None, Some(0.3)] {
            let op = Op::Attention { causal, scale, mask: None };
            check(op, vec![q.clone(), k.clone(), v.clone()], &[2, 2, 4, 5], &[true; 3]);
        }
    }
    // Causal: the first token attends to itself alone, so its output is its own value row.
    let causal = Op::Attention { causal: true, scale: None, mask: None };
    let y = ops::forward(&causal, &[&q, &k, &v], &[2, 2, 4, 5]);
    assert_eq!(&y.data[..5], &v.data[..5]);
    // A boolean mask of the causal pattern, and an additive one, compute what is_causal does.
    let keep = Tensor::new(vec![4, 4], (0..16).map(|i| f32::from(u8::from(i % 4 <= i / 4))).collect());
    let add = keep.map(|k| if k == 0.0 { f32::NEG_INFINITY } else { 0.0 });
    for (kind, m) in [(Mask::Keep, keep), (Mask::Additive, add)] {
        let masked = Op::Attention { causal: false, scale: None, mask: Some(kind) };
        let z = ops::forward(&masked, &[&q, &k, &v, &m], &[2, 2, 4, 5]);
        assert!(z.data.iter().zip(&y.data).all(|(a, b)| (a - b).abs() < 1e-6), "{kind:?}");
        check(masked, vec![q.clone(), k.clone(), v.clone(), m], &[2, 2, 4, 5], &[true, true, true, false]);
    }
}

#[test]
fn index_computations_compute_what_torch_does() {
    let a = ops::forward(&Op::Arange { start: 0.0, step: 2.0 }, &[], &[4]);
    assert_eq!(a.data, [0.0, 2.0, 4.0, 6.0]);
    let e = ops::forward(&Op::Compare { cmp: Cmp::Eq, value: Some(2.0) }, &[&a], &[4]);
    assert_eq!(e.data, [0.0, 1.0, 0.0, 0.0]);
    let b = Tensor::new(vec![4, 1], vec![0.0, 2.0, 4.0, 6.0]);
    let le = ops::forward(&Op::Compare { cmp: Cmp::Le, value: None }, &[&a, &b], &[4, 4]);
    assert_eq!(&le.data[..8], &[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    let c = ops::forward(&Op::Cumsum { dim: 0 }, &[&a], &[4]);
    assert_eq!(c.data, [0.0, 2.0, 6.0, 12.0]);
    assert_eq!(ops::forward(&Op::Fill { value: 1.0 }, &[], &[2, 2]).data, [1.0; 4]);
    // x[rows[:, None], cols[None, :]] picks a 2 × 2 block.
    let x = random(&[3, 4, 2], 19);
    let (rows, cols) = (Tensor::new(vec![2, 1], vec![2.0, 0.0]), Tensor::new(vec![1, 2], vec![1.0, 3.0]));
    let y = ops::forward(&Op::Index, &[&x, &rows, &cols], &[2, 2, 2]);
    assert_eq!(&y.data[..2], &x.data[(2 * 4 + 1) * 2..][..2]);
    assert_eq!(&y.data[6..8], &x.data[3 * 2..][..2]);
}

#[test]
fn index_where_and_cumsum_match_central_differences() {
    let x = random(&[3, 4, 2], 20);
    let (rows, cols) = (Tensor::new(vec![2, 1], vec![2.0, 0.0]), Tensor::new(vec![1, 2], vec![1.0, 1.0]));
    check(Op::Index, vec![x.clone(), rows, cols], &[2, 2, 2], &[true, false, false]);
    let cond = Tensor::new(vec![4, 1], vec![1.0, 0.0, 1.0, 0.0]);
    check(Op::Where, vec![cond, x.clone(), random(&[2], 21)], &[3, 4, 2], &[false, true, true]);
    check(Op::Cumsum { dim: 1 }, vec![x.clone()], &[3, 4, 2], &[true]);
    // Away from the bounds, where the clamp's kink would spoil central differences.
    let spread = Tensor::new(vec![3, 4, 2], values(24, 22).iter().map(|v| 2.0 * v + 0.05 * v.signum()).collect());
    check(Op::Clamp { min: Some(-1.0), max: Some(1.0) }, vec![spread], &[3, 4, 2], &[true]);
    for (upper, diagonal) in [(false, 0), (true, 1), (false, -1)] {
        check(Op::Triangle { upper, diagonal }, vec![x.clone()], &[3, 4, 2], &[true]);
    }
    check(Op::LogSoftmax, vec![x], &[3, 4, 2], &[true]);
    // Values 0.1 apart, so no step of the differences changes which one is largest.
    let distinct = Tensor::new(vec![3, 4, 2], (0..24).map(|i| ((i * 7) % 24) as f32 * 0.1 - 1.2).collect());
    check(Op::Amax { dims: vec![1], keep: true }, vec![distinct.clone()], &[3, 1, 2], &[true]);
    check(Op::Amax { dims: vec![0, 2], keep: false }, vec![distinct], &[4], &[true]);
    let tril =
        ops::forward(&Op::Triangle { upper: false, diagonal: 0 }, &[&Tensor::new(vec![2, 2], vec![1.0; 4])], &[2, 2]);
    assert_eq!(tril.data, [1.0, 0.0, 1.0, 1.0]);
}

/// A captured example and what PyTorch computed for it.
struct Reference {
    program: Program,
    tensors: HashMap<String, Tensor>,
    reference: HashMap<String, Tensor>,
}

fn load(path: &std::path::Path) -> HashMap<String, Tensor> {
    let bytes = std::fs::read(path).expect("the fixture exists");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (name, Tensor::new(view.shape().to_vec(), data))
        })
        .collect()
}

fn reference(name: &str) -> Reference {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plan/tests/programs").join(name);
    Reference {
        program: plan::program::import::read(&dir).expect("imports"),
        tensors: load(&dir.join("model.safetensors")),
        reference: load(&dir.join("reference.safetensors")),
    }
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-3);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what}[{i}]: {g} vs PyTorch's {w} (scale {scale})");
    }
}

/// Runs `name` forward and backward over plain matrices and compares the logits and every gradient with
/// PyTorch's.
fn matches_pytorch(name: &str) {
    let Reference { program, tensors, reference } = reference(name);
    let get = |n: &str| tensors.get(n).unwrap_or_else(|| panic!("{n} is in the weights")).data.clone();
    let matrix = |u: &plan::program::Unit| {
        let w = get(&u.name);
        if u.transposed { kernels::small::transpose(&w, u.inputs, u.outputs) } else { w }
    };
    let weights: Vec<Vec<f32>> =
        program.units.iter().map(|u| if u.tied_to.is_some() { Vec::new() } else { matrix(u) }).collect();
    let vectors: Vec<Vec<f32>> = program
        .units
        .iter()
        .map(|u| {
            let mut v = u.bias.as_deref().map(get).unwrap_or_default();
            u.vectors.iter().for_each(|&p| v.extend(get(&program.params[p].name)));
            v
        })
        .collect();
    let constants: Constants = program.constants.iter().map(|c| (c.name.clone(), tensors[&c.name].clone())).collect();
    let mut units = DenseUnits::new(&program, weights, vectors);
    let program = std::sync::Arc::new(program);
    let mut exec = Exec::new(program.clone(), std::sync::Arc::new(constants));
    let ids = &reference["ids"];
    exec.begin(ids.data.iter().map(|&t| t as u32).collect()).expect("whole sequences");
    let mut logits = None;
    for u in 0..program.units.len() {
        logits = exec.forward(u, &mut units).expect("runs");
    }
    let logits = logits.expect("the last stage gives the logits");
    close(&format!("{name} logits"), &logits.data, &reference["logits"].data, 1e-4);
    exec.start_backward(reference["r"].clone()).expect("the logits' shape");
    for u in (0..program.units.len()).rev() {
        exec.backward(u, &mut units).expect("runs backward");
    }
    for (u, unit) in program.units.iter().enumerate() {
        if unit.tied_to.is_none() {
            let want = &reference[&format!("grad.{}", unit.name)].data;
            // A transposed unit's gradient is the module's (`inputs × outputs`) turned the unit's way.
            let want =
                if unit.transposed { kernels::small::transpose(want, unit.inputs, unit.outputs) } else { want.clone() };
            close(&format!("{name} {}", unit.name), &units.weight_grads[u], &want, 1e-3);
        }
        let mut want = unit.bias.as_deref().map(|b| reference[&format!("grad.{b}")].data.clone()).unwrap_or_default();
        for &p in &unit.vectors {
            want.extend(&reference[&format!("grad.{}", program.params[p].name)].data);
        }
        close(&format!("{name} unit {u}'s vector"), &units.vector_grads[u], &want, 1e-3);
    }
    assert_eq!(exec.resident_bytes(), 4 * ids.len() as u64, "the backward pass dropped every value");
}

#[test]
fn a_qwen_style_decoder_computes_what_pytorch_does() {
    matches_pytorch("qwen");
}

#[test]
fn a_gpt_j_style_decoder_computes_what_pytorch_does() {
    matches_pytorch("gptj");
}

#[test]
fn a_gpt_2_style_decoder_computes_what_pytorch_does() {
    matches_pytorch("gpt2");
}

#[test]
fn a_research_decoder_computes_what_pytorch_does() {
    // LayerNorm written with var, einsum attention over a tril mask, unbind, x @ W, clamp, stack and mean.
    matches_pytorch("research");
}

#[test]
fn a_token_outside_the_vocabulary_fails_the_step() {
    let Reference { program, tensors, .. } = reference("gpt2");
    let constants: Constants = program.constants.iter().map(|c| (c.name.clone(), tensors[&c.name].clone())).collect();
    let weights = program.units.iter().map(|u| vec![0.0; u.inputs * u.outputs]).collect();
    let vectors = (0..program.units.len()).map(|u| vec![0.0; program.vector_len(u)]).collect();
    let mut units = DenseUnits::new(&program, weights, vectors);
    let mut exec = Exec::new(std::sync::Arc::new(program), std::sync::Arc::new(constants));
    assert!(exec.begin(vec![1; 7]).is_err(), "7 tokens are not whole sequences of 8");
    exec.begin(vec![40; 8]).expect("one sequence");
    let e = exec.forward(0, &mut units).expect_err("token 40 of 32");
    assert!(e.to_string().contains("index 40 is not a row of an embedding of 32 rows"), "{e}");
}

#[test]
fn hugging_face_decoders_compute_what_pytorch_does() {
    // Qwen2 (biases on Q, K and V, a tied head), Llama (untied) and GPT-2 (Conv1D weights stored transposed,
    // learned positions), each with the attention mask transformers builds.
    for name in ["hf-qwen2", "hf-llama", "hf-gpt2"] {
        matches_pytorch(name);
    }
}
