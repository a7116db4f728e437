//! Row-major tensors as a model program sees its values (PyTorch's layout), and the shape operations on them:
//! broadcasting and its reverse (summing back), permutes, slices, joins and repeats, each a plain loop over
//! indices.

/// A dense row-major tensor of `f32` (token ids and integer tables are held as floats: they are exact below
/// 2²⁴, beyond any vocabulary the plan allows).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tensor {
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Values, the last dimension contiguous.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor of `shape` holding `data` (whose length must be the shape's product).
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len(), "a tensor's data fills its shape");
        Tensor { shape, data }
    }

    /// Zeros in `shape`.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        4 * self.data.len() as u64
    }

    /// Size of the last dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// The same values in `shape`.
    pub fn reshaped(self, shape: Vec<usize>) -> Self {
        Tensor::new(shape, self.data)
    }

    /// Applies `f` to every value.
    pub fn map(&self, f: impl Fn(f32) -> f32) -> Self {
        Tensor { shape: self.shape.clone(), data: self.data.iter().map(|&x| f(x)).collect() }
    }

    /// Combines with `other` (same shape) value by value.
    pub fn zip(&self, other: &Tensor, f: impl Fn(f32, f32) -> f32) -> Self {
        debug_assert_eq!(self.shape, other.shape);
        Tensor { shape: self.shape.clone(), data: self.data.iter().zip(&other.data).map(|(&a, &b)| f(a, b)).collect() }
    }
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `x`'s strides for reading it as `shape` by broadcasting (its dimensions aligned to the right; a size-1
/// or missing dimension is read with stride 0).
fn broadcast_strides(x: &[usize], shape: &[usize]) -> Vec<usize> {
    let own = strides(x);
    let offset = shape.len() - x.len();
    (0..shape.len()).map(|i| if i < offset || x[i - offset] == 1 { 0 } else { own[i - offset] }).collect()
}

/// Calls `f(out_index, in_offset)` for every index of `shape`, `in_offset` advancing by `in_strides`.
fn walk(shape: &[usize], in_strides: &[usize], mut f: impl FnMut(usize, usize)) {
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let rank = shape.len();
    let mut index = vec![0usize; rank];
    let mut offset = 0usize;
    for out in 0..total {
        f(out, offset);
        for d in (0..rank).rev() {
            index[d] += 1;
            offset += in_strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= in_strides[d] * shape[d];
            index[d] = 0;
        }
    }
}

/// `x` broadcast to `shape` (NumPy's rules; the caller has checked they apply).
pub fn broadcast_to(x: &Tensor, shape: &[usize]) -> Tensor {
    if x.shape == shape {
        return x.clone();
    }
    let mut data = vec![0.0; shape.iter().product()];
    walk(shape, &broadcast_strides(&x.shape, shape), |o, i| data[o] = x.data[i]);
    Tensor::new(shape.to_vec(), data)
}

/// The gradient `g` of a value broadcast from `shape` summed back to it: the reverse of [`broadcast_to`].
pub fn reduce_to(g: &Tensor, shape: &[usize]) -> Tensor {
    if g.shape == shape {
        return g.clone();
    }
    let mut data = vec![0.0; shape.iter().product()];
    walk(&g.shape, &broadcast_strides(shape, &g.shape), |o, i| data[i] += g.data[o]);
    Tensor::new(shape.to_vec(), data)
}

/// The shape two operands broadcast to, or `None` when they do not.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let x = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
            let y = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
            match (x, y) {
                (x, y) if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// Dimensions reordered: output dimension `i` is `x`'s dimension `dims[i]`.
pub fn permute(x: &Tensor, dims: &[usize]) -> Tensor {
    let own = strides(&x.shape);
    let shape: Vec<usize> = dims.iter().map(|&d| x.shape[d]).collect();
    let read: Vec<usize> = dims.iter().map(|&d| own[d]).collect();
    let mut data = vec![0.0; x.len()];
    walk(&shape, &read, |o, i| data[o] = x.data[i]);
    Tensor::new(shape, data)
}

/// The permutation that undoes `dims`.
pub fn inverse(dims: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; dims.len()];
    for (i, &d) in dims.iter().enumerate() {
        inv[d] = i;
    }
    inv
}

/// Every `step`-th index in `start..end` along `dim`.
pub fn slice(x: &Tensor, dim: usize, start: usize, end: usize, step: usize) -> Tensor {
    let mut shape = x.shape.clone();
    shape[dim] = (end.saturating_sub(start)).div_ceil(step);
    let mut read = strides(&x.shape);
    let base = start * read[dim];
    read[dim] *= step;
    let mut data = vec![0.0; shape.iter().product()];
    walk(&shape, &read, |o, i| data[o] = x.data[base + i]);
    Tensor::new(shape, data)
}

/// The gradient of [`slice`]: `g` written back into zeros of `shape` at the sliced indices.
pub fn unslice(g: &Tensor, shape: &[usize], dim: usize, start: usize, step: usize) -> Tensor {
    let mut write = strides(shape);
    let base = start * write[dim];
    write[dim] *= step;
    let mut data = vec![0.0; shape.iter().product()];
    walk(&g.shape, &write, |o, i| data[base + i] += g.data[o]);
    Tensor::new(shape.to_vec(), data)
}

/// `parts` joined along `dim` (equal in every other dimension).
pub fn cat(parts: &[&Tensor], dim: usize) -> Tensor {
    let mut shape = parts[0].shape.clone();
    shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
    let outer: usize = shape[..dim].iter().product();
    let mut data = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for p in parts {
            let run: usize = p.shape[dim..].iter().product();
            data.extend_from_slice(&p.data[o * run..(o + 1) * run]);
        }
    }
    Tensor::new(shape, data)
}

/// Each index along `dim` repeated `repeats` times in place.
pub fn repeat_interleave(x: &Tensor, repeats: usize, dim: usize) -> Tensor {
    let mut shape = x.shape.clone();
    shape[dim] *= repeats;
    let outer: usize = x.shape[..dim].iter().product();
    let inner: usize = x.shape[dim + 1..].iter().product();
    let mut data = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for j in 0..x.shape[dim] {
            let row = &x.data[(o * x.shape[dim] + j) * inner..][..inner];
            for _ in 0..repeats {
                data.extend_from_slice(row);
            }
        }
    }
    Tensor::new(shape, data)
}

/// The gradient of [`repeat_interleave`]: each group of `repeats` summed back to its index.
pub fn unrepeat(g: &Tensor, repeats: usize, dim: usize) -> Tensor {
    let mut shape = g.shape.clone();
    shape[dim] /= repeats;
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let mut data = vec![0.0; shape.iter().product()];
    for o in 0..outer {
        for j in 0..shape[dim] {
            let out = &mut data[(o * shape[dim] + j) * inner..][..inner];
            for r in 0..repeats {
                let src = &g.data[((o * shape[dim] + j) * repeats + r) * inner..][..inner];
                out.iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
        }
    }
    Tensor::new(shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(shape.to_vec(), (0..n).map(|i| i as f32).collect())
    }

    #[test]
    fn broadcasting_and_its_reverse() {
        let x = iota(&[3, 1]);
        let b = broadcast_to(&x, &[2, 3, 2]);
        assert_eq!(b.data, [0., 0., 1., 1., 2., 2., 0., 0., 1., 1., 2., 2.]);
        assert_eq!(reduce_to(&b, &[3, 1]).data, [0., 4., 8.]);
        assert_eq!(broadcast_shape(&[4, 1, 3], &[2, 1]), Some(vec![4, 2, 3]));
        assert_eq!(broadcast_shape(&[2], &[3]), None);
    }

    #[test]
    fn permutes_slices_cats_and_repeats() {
        let x = iota(&[2, 3]);
        assert_eq!(permute(&x, &[1, 0]).data, [0., 3., 1., 4., 2., 5.]);
        assert_eq!(permute(&permute(&iota(&[2, 3, 4]), &[2, 0, 1]), &inverse(&[2, 0, 1])), iota(&[2, 3, 4]));
        let s = slice(&x, 1, 1, 3, 1);
        assert_eq!((s.shape.as_slice(), s.data.as_slice()), (&[2, 2][..], &[1., 2., 4., 5.][..]));
        assert_eq!(unslice(&s, &[2, 3], 1, 1, 1).data, [0., 1., 2., 0., 4., 5.]);
        assert_eq!(slice(&x, 1, 0, 3, 2).data, [0., 2., 3., 5.]);
        assert_eq!(cat(&[&s, &x], 1).data, [1., 2., 0., 1., 2., 4., 5., 3., 4., 5.]);
        let r = repeat_interleave(&x, 2, 0);
        assert_eq!(r.data, [0., 1., 2., 0., 1., 2., 3., 4., 5., 3., 4., 5.]);
        assert_eq!(unrepeat(&r, 2, 0).data, [0., 2., 4., 6., 8., 10.]);
    }
}
