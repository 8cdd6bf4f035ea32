//! Dense attention, `softmax(q kᵀ + mask) v` with the probabilities kept,
//! as one operation on the CPU ([`crate::ModelBackend::dense_attention`]):
//! each key/value head's products, softmax and (in the backward pass)
//! gradients run one after the other on one thread, with that head's
//! scores in its core's caches. As separate operations over the whole
//! batch (the scores' product, the softmax and the output's product, and
//! five kernels back), every head's scores went through memory between
//! operations, and the small per-head products ran at 50-75% of the speed
//! they reach on data in cache (`docs/experiments/speed.md`).
//!
//! Each product is the gemm call that the batched [`super::matmul`] makes
//! for that head, with the same shapes and strides ([`product`]), and the
//! softmax and its backward pass are the same row kernels, so every result
//! has the bits of [`crate::composed_dense_attention`] and of its
//! backward pass (`the_fused_operation_is_the_composed_one`). The shapes
//! and layouts it does not take (`Dims::fused`, [`in_place`]) go to those
//! composed operations.

use std::mem::MaybeUninit;

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{Shape, TensorMetadata};

use super::fresh;
use super::matmul::{product, View, GEMM_PARALLEL_OPS};
use super::rows::{masked_softmax_in_place, softmax_backward_in_place};
use super::tensors::{f32_tensor, tensor};
use crate::written::assume_init_mut;
use crate::CausalMask;

/// A `[batch, heads, rows, cols]` f32 tensor read in place through its
/// strides ([`in_place`]: a KV cache's keys are a slice of a longer buffer).
struct Heads {
    tensor: FlexTensor,
    heads: usize,
    start: usize,
    strides: [usize; 3],
}

/// Whether `x` is a 4-d tensor that [`Heads`] reads in place, as `matmul`
/// reads it: its last stride 1, the others not negative. Another layout
/// could change a product's lane-split kernel (whose bits depend on the
/// strides) if it were copied, so such inputs go to the composed operations.
fn in_place(x: &FlexTensor) -> bool {
    let strides = x.layout().strides();
    strides.len() == 4 && strides[3] == 1 && strides[..3].iter().all(|&s| s >= 0)
}

impl Heads {
    /// `x` read in place ([`in_place`]).
    ///
    /// # Panics
    /// If `x` is not of shape `shape` or not [`in_place`].
    fn of(x: FlexTensor, shape: [usize; 4]) -> Self {
        assert!(
            x.shape().dims::<4>() == shape && in_place(&x),
            "dense attention: an input of shape {:?} and strides {:?}, expected shape {shape:?} with its last stride 1",
            x.shape(),
            x.layout().strides()
        );
        let layout = x.layout();
        let s = layout.strides();
        let (heads, start) = (shape[1], layout.start_offset());
        let strides = [s[0] as usize, s[1] as usize, s[2] as usize];
        Self {
            tensor: x,
            heads,
            start,
            strides,
        }
    }

    /// The values the views index.
    fn data(&self) -> &[f32] {
        self.tensor.storage::<f32>()
    }

    /// Head `g` (of `batch * heads`, batch-major) as a matrix.
    fn matrix(&self, g: usize) -> View<'_> {
        View::strided(self.data(), self.offset(g), self.row_stride(), 1)
    }

    /// Head `g` transposed: its rows as columns.
    fn transposed(&self, g: usize) -> View<'_> {
        View::strided(self.data(), self.offset(g), 1, self.row_stride())
    }

    /// Row `r` of head `g`, `len` values.
    fn row(&self, g: usize, r: usize, len: usize) -> &[f32] {
        &self.data()[self.offset(g) + r * self.strides[2]..][..len]
    }

    fn offset(&self, g: usize) -> usize {
        let [batch, head, _] = self.strides;
        self.start + g / self.heads * batch + g % self.heads * head
    }

    fn row_stride(&self) -> isize {
        self.strides[2] as isize
    }
}

/// The sizes of an attention: `batch * heads` key/value heads of `rows`
/// stacked query rows, `keys` keys and head size `d`.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    rows: usize,
    keys: usize,
    d: usize,
}

impl Dims {
    /// The sizes of `q` (`[batch, kv_heads, rows, d]`) against `k`
    /// (`[batch, kv_heads, keys, d]`).
    fn of(q: &FlexTensor, k: &FlexTensor) -> Self {
        let (q, k) = (q.shape(), k.shape());
        assert!(
            q.num_dims() == 4 && k.num_dims() == 4 && [q[0], q[1], q[3]] == [k[0], k[1], k[3]],
            "dense attention: q {q:?} and k {k:?}, expected [batch, kv_heads, rows, d] and [batch, kv_heads, keys, d]"
        );
        let [batch, heads, rows, d] = [q[0], q[1], q[2], q[3]];
        Self {
            batch,
            heads,
            rows,
            keys: k[2],
            d,
        }
    }

    fn groups(&self) -> usize {
        self.batch * self.heads
    }

    /// The shape of `q`, the output and their gradients.
    fn queries(&self) -> [usize; 4] {
        [self.batch, self.heads, self.rows, self.d]
    }

    /// The shape of `k`, `v` and their gradients.
    fn keys(&self) -> [usize; 4] {
        [self.batch, self.heads, self.keys, self.d]
    }

    /// The shape of the scores and probabilities.
    fn scores(&self) -> [usize; 4] {
        [self.batch, self.heads, self.rows, self.keys]
    }

    /// Whether a product over every head is large enough for threads (as
    /// [`super::matmul`] decides).
    fn threaded(&self) -> bool {
        self.groups() * self.rows * self.keys * self.d >= GEMM_PARALLEL_OPS
    }

    /// Heads per task: one, so that threads share them, unless the work is
    /// too small for threads.
    fn heads_per_task(&self) -> usize {
        if self.threaded() {
            1
        } else {
            self.groups()
        }
    }

    /// Whether [`forward`] and [`backward`] compute these sizes themselves
    /// rather than through the composed operations: at least two keys and
    /// a head size of at least two (with one, the composed backward pass
    /// orders a key's gradient differently), and at least four heads to
    /// share among threads, or too little work for threads (with fewer
    /// heads and enough work, the composed products run faster: each head's
    /// products are threaded, and one head's product is split among the
    /// threads). Every input must also be read in place ([`in_place`]).
    fn fused(&self) -> bool {
        let groups = self.groups();
        groups > 0
            && self.rows > 0
            && self.keys >= 2
            && self.d >= 2
            && (groups >= 4 || !self.threaded())
    }
}

/// A new f32 tensor of these values and shape.
fn shaped(values: Vec<f32>, shape: [usize; 4]) -> FlexTensor {
    tensor(values, Shape::from(shape.to_vec()))
}

/// [`crate::ModelBackend::dense_attention_with_probs`] (`keep_probs`) or
/// [`crate::ModelBackend::dense_attention`]: the output and, if kept, the
/// probabilities.
pub(super) fn forward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    mask: &CausalMask,
    keep_probs: bool,
) -> (FlexTensor, Option<FlexTensor>) {
    let (q, k, v) = (f32_tensor(q), f32_tensor(k), f32_tensor(v));
    let dims = Dims::of(&q, &k);
    if !(dims.fused() && [&q, &k, &v].into_iter().all(in_place)) {
        let (out, probs) = crate::composed_dense_attention::<Flex>(q, k, v, mask);
        return (out, keep_probs.then_some(probs));
    }
    let Dims {
        heads,
        rows,
        keys,
        d,
        ..
    } = dims;
    let groups = dims.groups();
    let (q, k, v) = (
        Heads::of(q, dims.queries()),
        Heads::of(k, dims.keys()),
        Heads::of(v, dims.keys()),
    );
    let per_task = dims.heads_per_task();
    // Head `g`'s output into `out`, its probabilities left in `scores`.
    let head = |g: usize, out: &mut [MaybeUninit<f32>], scores: &mut [MaybeUninit<f32>]| {
        product(scores, [rows, keys, d], &q.matrix(g), &k.transposed(g));
        // SAFETY: the product wrote every score.
        let probs = unsafe { assume_init_mut(scores) };
        for (r, row) in probs.chunks_mut(keys).enumerate() {
            masked_softmax_in_place(row, mask.keys(g / heads, mask.column(r)));
        }
        let probs = View::strided(probs, 0, keys as isize, 1);
        product(out, [rows, d, keys], &probs, &v.matrix(g));
    };
    let (out_len, out_chunk) = (groups * rows * d, per_task * rows * d);
    if keep_probs {
        let lens = [out_len, groups * rows * keys];
        let chunks = [out_chunk, per_task * rows * keys];
        let task = |task: usize, [out, probs]: [&mut [MaybeUninit<f32>]; 2]| {
            let heads_of_task = out.chunks_mut(rows * d).zip(probs.chunks_mut(rows * keys));
            for (i, (out, probs)) in heads_of_task.enumerate() {
                head(task * per_task + i, out, probs);
            }
        };
        // SAFETY: `head` writes every output value and probability of its head.
        let [out, probs] = unsafe { fresh::uninit_buffers(lens, chunks, task) };
        let out = shaped(out, dims.queries());
        (out, Some(shaped(probs, dims.scores())))
    } else {
        let task = |task: usize, [out]: [&mut [MaybeUninit<f32>]; 1]| {
            let mut scratch = Vec::new();
            for (i, out) in out.chunks_mut(rows * d).enumerate() {
                head(task * per_task + i, out, uninit(&mut scratch, rows * keys));
            }
        };
        // SAFETY: `head` writes every output value of its head.
        let [out] = unsafe { fresh::uninit_buffers([out_len], [out_chunk], task) };
        (shaped(out, dims.queries()), None)
    }
}

/// [`crate::ModelBackend::dense_attention_backward`]: `q`'s, `k`'s and
/// `v`'s gradients.
pub(super) fn backward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    probs: FlexTensor,
    grad: FlexTensor,
) -> [FlexTensor; 3] {
    let (q, k, v) = (f32_tensor(q), f32_tensor(k), f32_tensor(v));
    let (probs, grad) = (f32_tensor(probs), f32_tensor(grad));
    let dims = Dims::of(&q, &k);
    if !(dims.fused() && [&q, &k, &v, &probs, &grad].into_iter().all(in_place)) {
        return crate::composed_dense_attention_backward::<Flex>(q, k, v, probs, grad).into();
    }
    let Dims { rows, keys, d, .. } = dims;
    let groups = dims.groups();
    let (q, k, v) = (
        Heads::of(q, dims.queries()),
        Heads::of(k, dims.keys()),
        Heads::of(v, dims.keys()),
    );
    let probs = Heads::of(probs, dims.scores());
    let grad = Heads::of(grad, dims.queries());
    let per_task = dims.heads_per_task();
    let lens = [groups * rows * d, groups * keys * d, groups * keys * d];
    let chunks = [
        per_task * rows * d,
        per_task * keys * d,
        per_task * keys * d,
    ];
    let task = |task: usize, [dq, dk, dv]: [&mut [MaybeUninit<f32>]; 3]| {
        let mut scratch = Vec::new();
        let first = task * per_task;
        let heads_of_task = dq
            .chunks_mut(rows * d)
            .zip(dk.chunks_mut(keys * d))
            .zip(dv.chunks_mut(keys * d));
        for (i, ((dq, dk), dv)) in heads_of_task.enumerate() {
            let g = first + i;
            // The probabilities' gradient, then the scores' in its place.
            let dp = uninit(&mut scratch, rows * keys);
            product(dp, [rows, keys, d], &grad.matrix(g), &v.transposed(g));
            // SAFETY: the product wrote every value.
            let ds = unsafe { assume_init_mut(dp) };
            for (r, ds) in ds.chunks_mut(keys).enumerate() {
                softmax_backward_in_place(probs.row(g, r, keys), ds);
            }
            let ds: &[f32] = ds;
            product(dv, [keys, d, rows], &probs.transposed(g), &grad.matrix(g));
            let (ds, ds_t) = (
                View::strided(ds, 0, keys as isize, 1),
                View::strided(ds, 0, 1, keys as isize),
            );
            product(dq, [rows, d, keys], &ds, &k.matrix(g));
            product(dk, [keys, d, rows], &ds_t, &q.matrix(g));
        }
    };
    // SAFETY: each task's products write every gradient value of its heads.
    let [dq, dk, dv] = unsafe { fresh::uninit_buffers(lens, chunks, task) };
    [
        shaped(dq, dims.queries()),
        shaped(dk, dims.keys()),
        shaped(dv, dims.keys()),
    ]
}

/// `scratch` resized to `len` values, not initialised (it may hold an
/// earlier head's values).
fn uninit(scratch: &mut Vec<MaybeUninit<f32>>, len: usize) -> &mut [MaybeUninit<f32>] {
    scratch.resize(len, MaybeUninit::uninit());
    &mut scratch[..len]
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bits, seeded, t, B};
    use crate::{CausalMask, ModelBackend};
    use burn::backend::flex::FlexTensor;
    use burn::prelude::*;
    use burn::tensor::TensorPrimitive;
    use proptest::prelude::*;

    fn inner(x: &Tensor<B, 4>) -> FlexTensor {
        x.clone().into_primitive().tensor()
    }

    fn bits_of(x: FlexTensor) -> Vec<u32> {
        bits(Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(x)))
    }

    /// Fails, naming `what` and the first value that differs, unless `a`
    /// and `b` hold the same bits.
    fn same(what: &str, a: FlexTensor, b: FlexTensor) -> Result<(), TestCaseError> {
        let (a, b) = (bits_of(a), bits_of(b));
        prop_assert_eq!(a.len(), b.len(), "{}: lengths", what);
        if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            let (x, y) = (f32::from_bits(a[i]), f32::from_bits(b[i]));
            return Err(TestCaseError::fail(format!(
                "{what}: value {i}: {x:e} against {y:e}"
            )));
        }
        Ok(())
    }

    /// The fused operation and the composed one, forward (with and without
    /// the probabilities) and backward, bit for bit; keys and values read
    /// as a KV cache holds them, the first `keys` columns of longer buffers.
    fn check(
        [batch, heads, group, seq, start, d, spare]: [usize; 7],
        pad_left: Vec<usize>,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        let (rows, keys) = (group * seq, start + seq);
        let mask = CausalMask {
            pad_left,
            start,
            seq,
        };
        let q = t(
            seeded(&[batch, heads, rows, d], seed),
            [batch, heads, rows, d],
        );
        let cached = |seed| {
            let shape = [batch, heads, keys + spare, d];
            t(seeded(&shape, seed), shape).slice([0..batch, 0..heads, 0..keys, 0..d])
        };
        let (k, v) = (cached(seed + 1), cached(seed + 2));
        let grad = t(
            seeded(&[batch, heads, rows, d], seed + 3),
            [batch, heads, rows, d],
        );
        let [q, k, v, grad] = [&q, &k, &v, &grad].map(inner);

        let (out, probs) = B::dense_attention_with_probs(q.clone(), k.clone(), v.clone(), &mask);
        let (c_out, c_probs) =
            crate::composed_dense_attention::<B>(q.clone(), k.clone(), v.clone(), &mask);
        same("output", out.clone(), c_out)?;
        same("probabilities", probs.clone(), c_probs)?;
        let untracked = B::dense_attention(q.clone(), k.clone(), v.clone(), &mask);
        same("output without the probabilities", untracked, out)?;

        let fused = B::dense_attention_backward(
            q.clone(),
            k.clone(),
            v.clone(),
            probs.clone(),
            grad.clone(),
        );
        let composed = crate::composed_dense_attention_backward::<B>(q, k, v, probs, grad);
        same("dq", fused.0, composed.0)?;
        same("dk", fused.1, composed.1)?;
        same("dv", fused.2, composed.2)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Small shapes: lane-split products (at most 256 scores per head,
        /// one query row), heads on the calling thread, left padding, a
        /// KV-cache offset, and the shapes the composed operations keep (one
        /// key or one value per head).
        #[test]
        fn the_fused_operation_is_the_composed_one(
            dims in (1usize..4, 1usize..4, 1usize..4, 1usize..10, 0usize..5, 1usize..20, 0usize..3),
            pads in proptest::collection::vec(0usize..16, 3),
            seed in 0u64..1000,
        ) {
            let (batch, heads, group, seq, start, d, spare) = dims;
            let keys = start + seq;
            let pad_left = pads[..batch].iter().map(|&p| p % keys).collect();
            check([batch, heads, group, seq, start, d, spare], pad_left, seed)?;
        }
    }

    /// Heads shared among threads (the training step's shapes), and query
    /// rows past gemm's 512 terms (each key's gradient sums over them).
    #[test]
    fn the_fused_operation_is_the_composed_one_at_scale() {
        check([2, 2, 2, 128, 0, 64, 0], vec![0, 17], 5).unwrap();
        check([1, 2, 5, 120, 8, 16, 4], vec![3], 6).unwrap();
    }

    /// One head, where the composed products take `matmul`'s paths for a
    /// single matrix: a decoding step's one query row (the narrow kernel),
    /// a transposed right factor copied row-major, and a left factor whose
    /// columns are 4 KiB apart (a column-major destination: 1024 keys).
    #[test]
    fn the_fused_operation_is_the_composed_one_on_one_head() {
        check([1, 1, 1, 1, 5, 8, 2], vec![2], 7).unwrap();
        check([1, 1, 4, 16, 8, 16, 0], vec![0], 8).unwrap();
        check([1, 1, 1, 6, 1018, 64, 0], vec![0], 9).unwrap();
    }

    /// Inputs that are not read in place (here a transposed `v`) go to the
    /// composed operations, with their bits.
    #[test]
    fn an_input_not_in_place_takes_the_composed_operations() {
        let (rows, keys, d) = (6, 5, 4);
        let mask = CausalMask {
            pad_left: vec![0; 2],
            start: 2,
            seq: 3,
        };
        let q = t(seeded(&[2, 2, rows, d], 1), [2, 2, rows, d]);
        let k = t(seeded(&[2, 2, keys, d], 2), [2, 2, keys, d]);
        let v = t(seeded(&[2, 2, d, keys], 3), [2, 2, d, keys]).swap_dims(2, 3);
        let [q, k, v] = [&q, &k, &v].map(inner);
        assert!(!super::in_place(&v));
        let (out, _) = B::dense_attention_with_probs(q.clone(), k.clone(), v.clone(), &mask);
        let (composed, _) = crate::composed_dense_attention::<B>(q, k, v, &mask);
        same("output", out, composed).unwrap();
    }
}
