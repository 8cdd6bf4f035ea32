//! [`ModelBackend`] on burn's `flex` CPU backend: kernels whose summation
//! order is fixed by the shapes alone.
//!
//! - **Matrix products** go to the `gemm` crate in calls of at most
//!   [`GEMM_MAX_K`] terms, each through a kernel that its shapes and strides
//!   choose, so that a product has the same bits on every x86-64 CPU with
//!   AVX2 and FMA (`matmul.rs`). A transposed weight's gradient is computed
//!   in the weight's own layout where that is the same packed product with
//!   its factors swapped ([`ModelBackend::matmul_rhs_grad`]).
//! - **Token log-probabilities** (the cross-entropy over the logits) read
//!   each row of logits once and keep one log-sum-exp per row, with the
//!   bits of a log-softmax followed by a gather (`token.rs`); the backward
//!   pass writes the gradient over the logits when nothing else holds them.
//! - **AdamW** runs as one pass per parameter, with burn's operations'
//!   arithmetic one by one ([`ModelBackend::adamw_step`]), writing the
//!   parameter and moments in place when nothing else holds them.
//! - **The token embedding's gradient** adds each token's row into a zeroed
//!   table in token order, as burn's does, without first filling and
//!   copying a table-sized buffer ([`ModelBackend::embed_tokens_backward`]).
//! - **Sums** (RMSNorm, softmax, log-softmax, token log-probabilities, full
//!   sums) keep [`LANES`] partial sums in plain Rust arrays and add them in a
//!   fixed tree, so the compiler may vectorise them at any width without
//!   changing a bit, and long sums add fixed-size blocks in order.
//! - `exp` and `ln` are the `libm` crate's software routines, not the C
//!   library's, whose implementation is chosen at run time by CPU feature.
//!   The exception is SwiGLU's sigmoid, which keeps the bits of the C
//!   library's `expf` so as to give those of burn's own `silu` (which models
//!   were trained with before the kernel existed), through
//!   [`crate::expf`]: glibc's algorithm written out and vectorised.
//!
//! Rows are spread over rayon's threads; each row is computed by one thread
//! from start to end, so the thread count changes nothing.

use burn::backend::flex::{Flex, FlexTensor, Layout};
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor, ModuleOps};
use burn::tensor::{Bytes, DType, FloatDType, Shape, TensorMetadata};
use rayon::prelude::*;

use crate::expf::{libm_exp_in_place, sigmoid_into};
use crate::written::{write_all, write_rows};
use std::mem::MaybeUninit;

/// `fn name(args) body`, compiled twice: for AVX2, run where the CPU has
/// it, and for the baseline (SSE2). The target feature only widens the
/// registers the loops run in: nothing is fused (FMA is not enabled) and
/// nothing is reordered, so both copies give the same bits. What the body
/// calls is widened with it only if inlined: the helpers it uses here are
/// `#[inline(always)]`.
macro_rules! widened {
    ($(#[$meta:meta])* fn $name:ident $(<$($lt:lifetime),+>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        fn $name $(<$($lt),+>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body $(<$($lt),+>)? ($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2 $(<$($lt),+>)? ($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                // SAFETY: AVX2 is present (checked just above).
                return unsafe { avx2($($arg),*) };
            }
            body($($arg),*)
        }
    };
}

mod attention;
mod copy;
mod fresh;
mod matmul;
mod narrow;
mod steps;
mod token;
use crate::{AdamWStep, CausalMask, ModelBackend};
pub use matmul::GEMM_MAX_K;
use matmul::{lane_split, matmul};

/// Partial sums kept apart in [`sum`] and [`dot`].
pub const LANES: usize = 16;

/// Elements per block of a long sum: blocks are summed on their own (in
/// parallel), then added in order.
const SUM_BLOCK: usize = 1 << 16;

/// Rows handled by one rayon task in the row-wise kernels.
const ROWS_PER_TASK: usize = 16;

impl ModelBackend for Flex {
    const ONE_DEVICE: bool = true;
    const MASKS_IN_SOFTMAX: bool = true;

    fn run_step<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        steps::run(f)
    }

    fn permute_contiguous(x: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        copy::to_contiguous(&f32_tensor(x).permute(axes))
    }

    fn write_slice(
        tensor: FloatTensor<Self>,
        ranges: &[std::ops::Range<usize>],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        write_slice(tensor, ranges, value)
    }

    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        matmul(&f32_tensor(lhs), &f32_tensor(rhs))
    }

    fn adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: &AdamWStep,
    ) -> [FloatTensor<Self>; 3] {
        let shape = param.shape();
        let mut param = owned(param);
        let (grad, _) = contiguous(grad);
        let (mut m, mut v, first) = match moments {
            Some((m, v)) => (owned(m), owned(v), false),
            None => {
                let zeros = || tensor(vec![0.0; shape.num_elements()], shape.clone());
                (zeros(), zeros(), true)
            }
        };
        let scalars = AdamWScalars::of(step);
        param
            .storage_mut::<f32>()
            .par_chunks_mut(ADAMW_ELEMENTS_PER_TASK)
            .zip(
                m.storage_mut::<f32>()
                    .par_chunks_mut(ADAMW_ELEMENTS_PER_TASK),
            )
            .zip(
                v.storage_mut::<f32>()
                    .par_chunks_mut(ADAMW_ELEMENTS_PER_TASK),
            )
            .zip(grad.par_chunks(ADAMW_ELEMENTS_PER_TASK))
            .for_each(|(((w, m), v), g)| scalars.update((w, m, v), g, first));
        [param, m, v]
    }

    fn is_transposed(x: &FloatTensor<Self>) -> bool {
        let layout = x.layout();
        let (shape, strides) = (layout.shape(), layout.strides());
        let rank = shape.len();
        rank >= 2 && shape[rank - 2] > 1 && shape[rank - 1] > 1 && strides[rank - 2] == 1
    }

    /// `(gradᵀ @ lhs)ᵀ` for a transposed right operand where neither order
    /// is lane-split: every output is then one chain of multiply-adds over
    /// the same `k` in the same order, with each product's factors swapped,
    /// so the bits are those of `lhsᵀ @ grad`.
    fn matmul_rhs_grad(
        lhs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        rhs_transposed: bool,
    ) -> FloatTensor<Self> {
        let (lhs, grad) = (f32_tensor(lhs), f32_tensor(grad));
        let lhs_t = Self::float_transpose(lhs.clone());
        if rhs_transposed {
            let grad_t = Self::float_transpose(grad.clone());
            if !lane_split(&lhs_t, &grad) && !lane_split(&grad_t, &lhs) {
                return Self::float_transpose(matmul(&grad_t, &lhs));
            }
        }
        matmul(&lhs_t, &grad)
    }

    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self> {
        let (x, shape) = contiguous(x);
        let gamma = contiguous(gamma).0;
        let d = gamma.len();
        let out = fresh::rows(&x, d, |row, out| rms_norm_row(row, &gamma, epsilon, out));
        tensor(out, shape)
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, shape) = contiguous(x);
        let (grad, _) = contiguous(grad);
        let (gamma, gamma_shape) = contiguous(gamma);
        let d = gamma.len();
        // dgamma_i = Σ_rows grad_i x_i inv: each task's rows summed in
        // order (beside their dx), then the tasks' sums added in order.
        let chunk = d * ROWS_PER_TASK;
        let tasks = x.len().div_ceil(chunk.max(1));
        let lens = [x.len(), tasks * d];
        let [dx, partials] = fresh::buffers(lens, [chunk, d], |task, [dx, partial]| {
            let start = task * chunk;
            let (x, grad) = (&x[start..start + dx.len()], &grad[start..start + dx.len()]);
            rms_norm_backward_rows(x, grad, &gamma, epsilon, dx, partial);
        });
        let mut dgamma = vec![0.0; d];
        for partial in partials.chunks(d.max(1)) {
            for (a, p) in dgamma.iter_mut().zip(partial) {
                *a += p;
            }
        }
        (tensor(dx, shape), tensor(dgamma, gamma_shape))
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let (gate, shape) = contiguous(gate);
        let (up, _) = contiguous(up);
        let out = fresh::in_chunks(gate.len(), ELEMENTS_PER_TASK, |start, out| {
            let end = start + out.len();
            swiglu_chunk(&gate[start..end], &up[start..end], out)
        });
        tensor(out, shape)
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (gate, shape) = contiguous(gate);
        let (up, _) = contiguous(up);
        let (grad, _) = contiguous(grad);
        let n = gate.len();
        let chunks = [ELEMENTS_PER_TASK; 2];
        let [d_gate, d_up] = fresh::filled([n, n], chunks, |task, [d_gate, d_up]| {
            let (start, end) = (
                task * ELEMENTS_PER_TASK,
                task * ELEMENTS_PER_TASK + d_gate.len(),
            );
            let (gate, up, grad) = (&gate[start..end], &up[start..end], &grad[start..end]);
            swiglu_backward_chunk(gate, up, grad, d_gate, d_up)
        });
        (tensor(d_gate, shape.clone()), tensor(d_up, shape))
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        rope_pass(x, cos, sin, scale, RotateHalf::Forward)
    }

    fn rope_backward(
        grad: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        rope_pass(grad, cos, sin, scale, RotateHalf::Inverse)
    }

    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, shape) = contiguous(x);
        let out = fresh::rows(&x, last_dim(&shape), softmax_row);
        tensor(out, shape)
    }

    fn softmax_last_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let (y, shape) = contiguous(y);
        let (grad, _) = contiguous(grad);
        let d = last_dim(&shape);
        let out = fresh::row_pairs(&y, &grad, d, softmax_backward_row);
        tensor(out, shape)
    }

    fn causal_softmax(scores: FloatTensor<Self>, mask: &CausalMask) -> FloatTensor<Self> {
        let (x, shape) = contiguous(scores);
        let [heads, rows, keys] = [shape[1], shape[2], shape[3]];
        let out = fresh::in_chunks(x.len(), keys * ROWS_PER_TASK, |start, out| {
            write_rows(out, keys, |i, out| {
                // Row `r` of head `bh` (batch row `bh / heads`).
                let row = start / keys + i;
                let (bh, r) = (row / rows, row % rows);
                let seen = mask.keys(bh / heads, mask.column(r));
                masked_softmax_row(&x[row * keys..][..keys], seen, out)
            })
        });
        tensor(out, shape)
    }

    fn log_softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, shape) = contiguous(x);
        let out = fresh::rows(&x, last_dim(&shape), log_softmax_row);
        tensor(out, shape)
    }

    fn log_softmax_last_backward(
        y: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (y, shape) = contiguous(y);
        let (grad, _) = contiguous(grad);
        let d = last_dim(&shape);
        let out = fresh::row_pairs(&y, &grad, d, log_softmax_backward_row);
        tensor(out, shape)
    }

    fn embed_tokens_backward(
        weights: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let table = weights.shape();
        assert_eq!(
            table.len(),
            2,
            "embed_tokens: a table of shape {table:?}, expected [vocab, hidden]"
        );
        if grad.dtype() != DType::F32 {
            return Self::embedding_backward(weights, grad, indices);
        }
        let (vocab, hidden) = (table[0], table[1]);
        let ids = ids_below(indices, vocab, "embed_tokens: token id");
        let (grad, grad_shape) = contiguous(grad);
        assert_eq!(
            grad.len(),
            ids.len() * hidden,
            "embed_tokens backward: a gradient of shape {grad_shape:?} for {} tokens of width {hidden}",
            ids.len()
        );
        // Zeroed by the allocator: rows of ids that do not occur are never written.
        let mut out = vec![0.0f32; vocab * hidden];
        for (&id, row) in ids.iter().zip(grad.chunks(hidden)) {
            for (o, &g) in out[id * hidden..][..hidden].iter_mut().zip(row) {
                *o += g;
            }
        }
        tensor(out, table)
    }

    fn token_log_probs_with_lse(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        token::forward(logits, targets)
    }

    fn token_log_probs_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        token::backward(logits, targets, lse, grad)
    }

    fn add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (a, shape) = contiguous(a);
        let (b, _) = contiguous(b);
        assert_eq!(a.len(), b.len(), "add: operands of different sizes");
        let out = fresh::in_chunks(a.len(), ELEMENTS_PER_TASK, |start, out| {
            let end = start + out.len();
            let sums = a[start..end].iter().zip(&b[start..end]).map(|(x, y)| x + y);
            write_all(out, sums)
        });
        tensor(out, shape)
    }

    fn sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, _) = contiguous(x);
        tensor(vec![long_sum(&x)], Shape::from(vec![1]))
    }

    fn to_f32(x: FloatTensor<Self>) -> FloatTensor<Self> {
        f32_tensor(x)
    }

    fn dense_attention_with_probs(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (out, probs) = attention::forward(q, k, v, mask, true);
        (
            out,
            probs.expect("the probabilities are kept when asked for"),
        )
    }

    fn dense_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> FloatTensor<Self> {
        attention::forward(q, k, v, mask, false).0
    }

    fn dense_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        attention::backward(q, k, v, probs, grad).into()
    }

    fn causal_attention_with_lse(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (q, q_shape) = contiguous(q);
        let (k, k_shape) = contiguous(k);
        let (v, _) = contiguous(v);
        let (q, k, v): (&[f32], &[f32], &[f32]) = (&q, &k, &v);
        let [batch, heads, rows, d] = [q_shape[0], q_shape[1], q_shape[2], q_shape[3]];
        let keys = k_shape[2];
        let lens = [q.len(), batch * heads * rows];
        let chunks = [d * ROWS_PER_TASK, ROWS_PER_TASK];
        let [out, lse] = fresh::buffers(lens, chunks, |task, [out, lse]| {
            let mut scores = vec![0.0f32; keys];
            for (i, (out, lse)) in out.chunks_mut(d).zip(lse.iter_mut()).enumerate() {
                // Row `r` of head `bh` (batch row `bh / heads`).
                let row = task * ROWS_PER_TASK + i;
                let (bh, r) = (row / rows, row % rows);
                let seen = mask.keys(bh / heads, mask.column(r));
                let lo = *seen.start();
                let scores = &mut scores[..seen.count()];
                let query = &q[row * d..][..d];
                let key = |j: usize| &k[(bh * keys + lo + j) * d..][..d];
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = dot(query, key(j));
                }
                let max = row_max(scores);
                for s in scores.iter_mut() {
                    *s -= max;
                }
                libm_exp_in_place(scores);
                let total = sum(scores);
                out.fill(0.0);
                for (j, &e) in scores.iter().enumerate() {
                    axpy(out, e / total, &v[(bh * keys + lo + j) * d..][..d]);
                }
                *lse = max + libm::logf(total);
            }
        });
        let lse_shape = Shape::from(vec![batch, heads, rows]);
        (tensor(out, q_shape), tensor(lse, lse_shape))
    }

    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (q, q_shape) = contiguous(q);
        let (k, k_shape) = contiguous(k);
        let (v, _) = contiguous(v);
        let (out, _) = contiguous(out);
        let (lse, _) = contiguous(lse);
        let (grad, _) = contiguous(grad);
        let (q, k, v): (&[f32], &[f32], &[f32]) = (&q, &k, &v);
        let (out, lse, grad): (&[f32], &[f32], &[f32]) = (&out, &lse, &grad);
        let [heads, rows, d] = [q_shape[1], q_shape[2], q_shape[3]];
        let keys = k_shape[2];
        // One task per key/value head: its keys' gradients add up over its
        // query rows in order.
        let lens = [q.len(), k.len(), v.len()];
        let chunks = [rows * d, keys * d, keys * d];
        let [dq, dk, dv] = fresh::buffers(lens, chunks, |bh, [dq, dk, dv]| {
            let k = &k[bh * keys * d..][..keys * d];
            let v = &v[bh * keys * d..][..keys * d];
            let mut probabilities = vec![0.0f32; keys];
            for (r, dq) in dq.chunks_mut(d).enumerate() {
                let row = bh * rows + r;
                let (query, g) = (&q[row * d..][..d], &grad[row * d..][..d]);
                // Σ_j p_j dp_j = g · out.
                let rowsum = dot(g, &out[row * d..][..d]);
                let seen = mask.keys(bh / heads, mask.column(r));
                let lo = *seen.start();
                let probabilities = &mut probabilities[..seen.clone().count()];
                for (j, p) in seen.clone().zip(probabilities.iter_mut()) {
                    *p = dot(query, &k[j * d..][..d]) - lse[row];
                }
                libm_exp_in_place(probabilities);
                for j in seen {
                    let (key, value) = (&k[j * d..][..d], &v[j * d..][..d]);
                    let p = probabilities[j - lo];
                    axpy(&mut dv[j * d..][..d], p, g);
                    let ds = p * (dot(g, value) - rowsum);
                    axpy(dq, ds, key);
                    axpy(&mut dk[j * d..][..d], ds, query);
                }
            }
        });
        (
            tensor(dq, q_shape),
            tensor(dk, k_shape.clone()),
            tensor(dv, k_shape),
        )
    }
}

/// `acc += a * x`, element by element (no sum, so any vectorisation gives
/// the same bits).
#[inline(always)]
fn axpy(acc: &mut [f32], a: f32, x: &[f32]) {
    for (acc, &x) in acc.iter_mut().zip(x) {
        *acc += a * x;
    }
}

/// The sum of `xs`: [`LANES`] running sums, added in a fixed tree, then the
/// tail in order. The same bits on every CPU, however it is vectorised.
#[inline(always)]
pub fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a += x;
        }
    }
    tail.iter().fold(fold_lanes(acc), |total, &x| total + x)
}

/// `Σ a_i b_i` in the order of [`sum`] (products rounded, never fused).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail = ca.remainder().iter().zip(cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((a, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *a += x * y;
        }
    }
    tail.fold(fold_lanes(acc), |total, (&x, &y)| total + x * y)
}

/// A sum of any length: [`sum`] over blocks of [`SUM_BLOCK`] elements
/// (in parallel), the block sums added in order.
pub fn long_sum(xs: &[f32]) -> f32 {
    if xs.len() <= SUM_BLOCK {
        return sum(xs);
    }
    let blocks: Vec<f32> = xs.par_chunks(SUM_BLOCK).map(sum).collect();
    blocks.into_iter().fold(0.0, |total, x| total + x)
}

#[inline(always)]
fn fold_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// Elements handled by one rayon task in the element-wise kernels.
const ELEMENTS_PER_TASK: usize = 1 << 14;

/// Elements of a parameter handled by one rayon task in AdamW's update.
/// The optimiser updates one parameter at a time, and most of a small
/// model's are a few [`ELEMENTS_PER_TASK`] or less (the 1m benchmark's
/// attention weights are 8-16K values): in tasks that size, one thread
/// updated each of them while the others waited. In tasks of 4K values the
/// 1m training step ran about 2% faster (`docs/experiments/speed.md`).
/// The update is element by element, so the split changes no bit.
const ADAMW_ELEMENTS_PER_TASK: usize = 1 << 12;

/// RoPE's forward (`turn` = [`RotateHalf::Forward`]) or backward pass over
/// `y` (the input `[batch, seq, heads, d]` or the output's gradient
/// `[batch, heads, seq, d]`), written with its two middle dimensions
/// swapped, rows in parallel; see [`rotate_rows`].
fn rope_pass(
    y: FloatTensor<Flex>,
    cos: FloatTensor<Flex>,
    sin: FloatTensor<Flex>,
    scale: f64,
    turn: RotateHalf,
) -> FloatTensor<Flex> {
    let (y, shape) = contiguous(y);
    let (cos, _) = contiguous(cos);
    let (sin, _) = contiguous(sin);
    let [b, a, c, d] = shape.dims::<4>();
    let rows = RopeRows {
        d,
        outer: a,
        inner: c,
        turn,
    };
    let rows_per_task = (ELEMENTS_PER_TASK / d.max(1)).max(1);
    let out = fresh::in_chunks(y.len(), rows_per_task * d, |start, out| {
        rotate_rows(&y, &cos, &sin, scale as f32, rows, start / d.max(1), out)
    });
    tensor(out, Shape::from(vec![b, c, a, d]))
}

/// The rows of one [`rope_pass`]: a `[batch, outer, inner, d]` input
/// written as `[batch, inner, outer, d]`, turned `turn`'s way. The token
/// of a row is its index along `outer` in the forward pass (queries or keys
/// in `[batch, seq, heads, d]`) and along `inner` in the backward pass
/// (their gradients in `[batch, heads, seq, d]`).
#[derive(Clone, Copy)]
struct RopeRows {
    d: usize,
    outer: usize,
    inner: usize,
    turn: RotateHalf,
}

impl RopeRows {
    /// The input row and the table row of output row `row`.
    #[inline(always)]
    fn source(self, row: usize) -> (usize, usize) {
        let (o, i) = (row % self.outer, row / self.outer % self.inner);
        let batch = row / (self.outer * self.inner);
        let token = if self.turn == RotateHalf::Inverse {
            batch * self.inner + i
        } else {
            batch * self.outer + o
        };
        ((batch * self.outer + o) * self.inner + i, token)
    }
}

/// Which way [`rotate_rows`] turns the halves of a row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RotateHalf {
    /// `[-x₂, x₁]`: RoPE's forward pass.
    Forward,
    /// `[x₂, -x₁]`: its transpose, in the backward pass.
    Inverse,
}

widened! {
    /// RoPE over the output rows `first..` of a [`rope_pass`] (as many as
    /// `out` holds), each read from the input and table rows
    /// [`RopeRows::source`] names, as burn's operations in
    /// `ModelBackend::rope`'s default compute it, rounding for rounding: the
    /// forward pass `(x * cos + rotate_half(x) * sin) * scale`, the backward
    /// pass `g * cos + rotate_half⁻¹(g * sin)` with `g = grad * scale`. The
    /// default rotates by a product with a signed permutation matrix: one FMA
    /// chain from +0 whose only nonzero term is `±v`, so each rotated element
    /// is `0 + (±v)` here, which keeps its bits, signed zeros included.
    fn rotate_rows<'a>(
        y: &[f32],
        cos: &[f32],
        sin: &[f32],
        scale: f32,
        rows: RopeRows,
        first: usize,
        out: &'a mut [MaybeUninit<f32>],
    ) -> &'a mut [f32] {
        let (d, turn) = (rows.d, rows.turn);
        let half = d / 2;
        // The scaled gradient, which only the backward pass with a scale needs.
        let mut scaled = if turn == RotateHalf::Inverse && scale != 1.0 {
            vec![0.0f32; d]
        } else {
            Vec::new()
        };
        let mut turned = vec![0.0f32; d];
        write_rows(out, d, |row, out| {
            let (source, token) = rows.source(first + row);
            let (y, cos, sin) = (&y[source * d..][..d], &cos[token * d..][..d], &sin[token * d..][..d]);
            match turn {
                RotateHalf::Forward => {
                    let (y1, y2) = y.split_at(half);
                    let (t1, t2) = turned.split_at_mut(half);
                    for ((t, &a), &b) in t1.iter_mut().zip(y2).zip(sin) {
                        *t = (0.0 + -a) * b;
                    }
                    for ((t, &a), &b) in t2.iter_mut().zip(y1).zip(&sin[half..]) {
                        *t = (0.0 + a) * b;
                    }
                    let rotated = y.iter().zip(cos).zip(&turned).map(|((&v, &c), &t)| v * c + t);
                    let out = write_all(out, rotated);
                    if scale != 1.0 {
                        for o in out.iter_mut() {
                            *o *= scale;
                        }
                    }
                    out
                }
                RotateHalf::Inverse => {
                    let y = if scale == 1.0 {
                        y
                    } else {
                        for (s, &v) in scaled.iter_mut().zip(y) {
                            *s = v * scale;
                        }
                        &scaled
                    };
                    let (s1, s2) = sin.split_at(half);
                    let (y1, y2) = y.split_at(half);
                    let (t1, t2) = turned.split_at_mut(half);
                    for ((t, &a), &b) in t1.iter_mut().zip(y2).zip(s2) {
                        *t = 0.0 + a * b;
                    }
                    for ((t, &a), &b) in t2.iter_mut().zip(y1).zip(s1) {
                        *t = 0.0 + -(a * b);
                    }
                    write_all(out, y.iter().zip(cos).zip(&turned).map(|((&v, &c), &t)| v * c + t))
                }
            }
        })
    }
}

widened! {
    /// One row of RMSNorm: `x * inv_rms(x) * gamma`, element by element.
    fn rms_norm_row<'a>(
        row: &[f32],
        gamma: &[f32],
        epsilon: f64,
        out: &'a mut [MaybeUninit<f32>],
    ) -> &'a mut [f32] {
        let inv = inv_rms(row, epsilon);
        write_all(out, row.iter().zip(gamma).map(|(&v, &g)| v * inv * g))
    }
}

widened! {
    /// One row's softmax: `exp(x - max) / Σ exp(x - max)`.
    fn softmax_row<'a>(row: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
        let max = row_max(row);
        let out = write_all(out, row.iter().map(|&v| v - max));
        libm_exp_in_place(out);
        let total = sum(out);
        for o in out.iter_mut() {
            *o /= total;
        }
        out
    }
}

/// One row of the softmax's gradient given its output `y`:
/// `y * (grad - grad · y)`.
fn softmax_backward_row<'a>(
    y: &[f32],
    grad: &[f32],
    out: &'a mut [MaybeUninit<f32>],
) -> &'a mut [f32] {
    let out = write_all(out, grad.iter().copied());
    softmax_backward_in_place(y, out);
    out
}

widened! {
    /// [`softmax_backward_row`] written over the output's gradient `grad`.
    fn softmax_backward_in_place(y: &[f32], grad: &mut [f32]) {
        let inner = dot(grad, y);
        for (g, &p) in grad.iter_mut().zip(y) {
            *g = p * (*g - inner);
        }
    }
}

widened! {
    /// One row's log-softmax: `x - log_sum_exp(x)`.
    fn log_softmax_row<'a>(row: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
        let (lse, out) = log_sum_exp(row, out);
        for (o, &v) in out.iter_mut().zip(row) {
            *o = v - lse;
        }
        out
    }
}

widened! {
    /// One row of the log-softmax's gradient given its output `y`:
    /// `grad - exp(y) * Σ grad`.
    fn log_softmax_backward_row<'a>(
        y: &[f32],
        grad: &[f32],
        out: &'a mut [MaybeUninit<f32>],
    ) -> &'a mut [f32] {
        let total = sum(grad);
        let out = write_all(out, y.iter().copied());
        libm_exp_in_place(out);
        for (o, &g) in out.iter_mut().zip(grad) {
            *o = g - *o * total;
        }
        out
    }
}

widened! {
    /// RMSNorm's backward pass over whole rows of `d = gamma.len()`
    /// elements: each row's `dx`, and `grad_i x_i inv` added into
    /// `partial` (dgamma's partial sum over these rows) in row order.
    fn rms_norm_backward_rows(
        x: &[f32],
        grad: &[f32],
        gamma: &[f32],
        epsilon: f64,
        dx: &mut [f32],
        partial: &mut [f32],
    ) {
        let d = gamma.len();
        for ((dx, x), grad) in dx.chunks_mut(d).zip(x.chunks(d)).zip(grad.chunks(d)) {
            let inv = inv_rms(x, epsilon);
            for ((a, &v), &g) in partial.iter_mut().zip(x).zip(grad) {
                *a += g * (v * inv);
            }
            // The scaled gradient `grad * gamma` first, in the output row.
            for ((s, &g), &w) in dx.iter_mut().zip(grad).zip(gamma) {
                *s = g * w;
            }
            // d/dx_j of (x_i * inv) = inv δ_ij - inv³ x_i x_j / d
            let coef = inv * inv * inv * dot(dx, x) / d as f32;
            for (o, &v) in dx.iter_mut().zip(x) {
                *o = *o * inv - v * coef;
            }
        }
    }
}

widened! {
    /// `out = silu(gate) * up`, element by element, as `gate * sigmoid(gate) * up`.
    fn swiglu_chunk<'a>(gate: &[f32], up: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
        let out = sigmoid_into(gate, out);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g * *o * u;
        }
        out
    }
}

widened! {
    /// SwiGLU's gradients with respect to `gate` and `up`, given the
    /// output's gradient `grad`, element by element.
    fn swiglu_backward_chunk<'a>(
        gate: &[f32],
        up: &[f32],
        grad: &[f32],
        d_gate: &'a mut [MaybeUninit<f32>],
        d_up: &'a mut [MaybeUninit<f32>],
    ) -> [&'a mut [f32]; 2] {
        // The sigmoids first (vectorised), then each element's terms.
        let d_gate = sigmoid_into(gate, d_gate);
        let terms = d_gate.iter_mut().zip(gate).zip(up).zip(grad);
        let d_up = write_all(
            d_up,
            terms.map(|(((dg, &g), &u), &dy)| {
                // burn's graph of g * sigmoid(g) * u, term by term: the
                // product rule's two terms for g, the sigmoid's own backward.
                let s = *dg;
                let d_silu = dy * u;
                *dg = d_silu * s + d_silu * g * s * (1.0 - s);
                dy * (g * s)
            }),
        );
        [d_gate, d_up]
    }
}

/// `out = softmax(row + bias)` for the bias that is 0 on the keys `seen`
/// and `-inf` elsewhere ([`masked_softmax_in_place`] of the row's seen keys).
fn masked_softmax_row<'a>(
    row: &[f32],
    seen: std::ops::RangeInclusive<usize>,
    out: &'a mut [MaybeUninit<f32>],
) -> &'a mut [f32] {
    let out = write_all(out, row.iter().copied());
    masked_softmax_in_place(out, seen);
    out
}

widened! {
    /// `row = softmax(row + bias)` for the bias that is 0 on the keys `seen`
    /// and `-inf` elsewhere, with the bits of [`Flex::softmax_last`] of the
    /// biased row; only the seen values are read. Adding `+0.0` is not a
    /// no-op (it turns `-0.0` into `+0.0`), so the seen scores get it. The
    /// unseen ones would become `-inf`, which leaves the row's maximum as it
    /// is (the fold never holds a NaN) and, shifted by a finite maximum,
    /// exponentiates to `+0.0` exactly: they are written as zeros, and only
    /// the seen keys are exponentiated. A row whose maximum is not finite
    /// takes the plain path.
    fn masked_softmax_in_place(out: &mut [f32], seen: std::ops::RangeInclusive<usize>) {
        let (lo, hi) = (*seen.start(), *seen.end());
        for o in &mut out[lo..=hi] {
            *o += 0.0;
        }
        let max = row_max(&out[lo..=hi]);
        if max.is_finite() {
            for o in &mut out[lo..=hi] {
                *o -= max;
            }
            libm_exp_in_place(&mut out[lo..=hi]);
            out[..lo].fill(0.0);
            out[hi + 1..].fill(0.0);
        } else {
            out[..lo].fill(f32::NEG_INFINITY);
            out[hi + 1..].fill(f32::NEG_INFINITY);
            for o in out.iter_mut() {
                *o -= max;
            }
            libm_exp_in_place(out);
        }
        let total = sum(out);
        for o in out.iter_mut() {
            *o /= total;
        }
    }
}

/// The largest value of `row` that is not NaN (`-inf` if none), in
/// [`LANES`] running maxima that vectorise. A maximum of values, NaN
/// ignored, is the same in any order, but for the sign of a zero maximum
/// (`f32::max` may return either zero), which no caller's result shows:
/// each subtracts it from values and exponentiates, or adds it to a
/// logarithm that is at least `+0`.
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = a.max(v);
        }
    }
    tail.iter()
        .copied()
        .fold(acc.into_iter().fold(f32::NEG_INFINITY, f32::max), f32::max)
}

widened! {
    /// `log(Σ exp(row))`, shifted by the row's maximum; `scratch` (the row's
    /// length) is overwritten. Log-softmax and token log-probabilities share it,
    /// hence their bits.
    fn log_sum_exp<'a>(row: &[f32], scratch: &'a mut [MaybeUninit<f32>]) -> (f32, &'a mut [f32]) {
        let max = row_max(row);
        let scratch = write_all(scratch, row.iter().map(|&v| v - max));
        libm_exp_in_place(scratch);
        (max + libm::logf(sum(scratch)), scratch)
    }
}

#[inline(always)]
fn inv_rms(row: &[f32], epsilon: f64) -> f32 {
    let mean = dot(row, row) / row.len() as f32;
    1.0 / (mean + epsilon as f32).sqrt()
}

fn last_dim(shape: &Shape) -> usize {
    shape.last().copied().unwrap_or(1)
}

/// `tensor[ranges] = value` written into `tensor`'s own buffer when it is a
/// whole, contiguous f32 buffer that nothing else shares; otherwise (or for
/// ranges that do not fit) burn's `slice_assign`, which copies it.
fn write_slice(
    mut tensor: FlexTensor,
    ranges: &[std::ops::Range<usize>],
    value: FlexTensor,
) -> FlexTensor {
    let shape = tensor.shape();
    let value_shape = value.shape();
    let fits = ranges.len() == shape.len()
        && ranges.len() == value_shape.len()
        && ranges
            .iter()
            .zip(shape.iter())
            .zip(value_shape.iter())
            .all(|((r, &n), &v)| r.start <= r.end && r.end <= n && r.end - r.start == v);
    let whole = tensor.dtype() == DType::F32
        && tensor.is_contiguous()
        && tensor.layout().start_offset() == 0
        && tensor.storage::<f32>().len() == shape.num_elements();
    if fits && whole && !ranges.is_empty() && value_shape.num_elements() > 0 {
        let (values, _) = contiguous(value.clone());
        if let Some(dst) = tensor.try_storage_mut::<f32>() {
            let rank = shape.len();
            let run = value_shape[rank - 1];
            // Row-major strides of the destination.
            let mut strides = vec![1usize; rank];
            for d in (0..rank - 1).rev() {
                strides[d] = strides[d + 1] * shape[d + 1];
            }
            let mut index = vec![0usize; rank - 1];
            for chunk in values.chunks_exact(run) {
                let offset: usize = (0..rank - 1)
                    .map(|d| (ranges[d].start + index[d]) * strides[d])
                    .sum::<usize>()
                    + ranges[rank - 1].start;
                dst[offset..offset + run].copy_from_slice(chunk);
                for d in (0..rank - 1).rev() {
                    index[d] += 1;
                    if index[d] < value_shape[d] {
                        break;
                    }
                    index[d] = 0;
                }
            }
            return tensor;
        }
    }
    let slices: Vec<burn::tensor::Slice> = ranges.iter().cloned().map(Into::into).collect();
    Flex::float_slice_assign(tensor, &slices, value)
}

/// The tensor in f32 (flex's float tensors may also be f16 or bf16).
fn f32_tensor(x: FlexTensor) -> FlexTensor {
    match x.dtype() {
        DType::F32 => x,
        DType::BF16 => widen_bf16(x),
        _ => Flex::float_cast(x, FloatDType::F32),
    }
}

/// A bf16 tensor in f32: each value's 16 bits become the high half of an
/// f32 (exact: what `float_cast` computes through f64, without it).
fn widen_bf16(x: FlexTensor) -> FlexTensor {
    let shape = x.shape();
    let x = x.to_contiguous();
    let start = x.layout().start_offset();
    let source = &x.storage::<burn::tensor::bf16>()[start..start + shape.num_elements()];
    let out = fresh::in_chunks(source.len(), ELEMENTS_PER_TASK, |start, out| {
        let widened = source[start..]
            .iter()
            .map(|b| f32::from_bits(u32::from(b.to_bits()) << 16));
        write_all(out, widened)
    });
    tensor(out, shape)
}

/// A tensor's f32 elements in row-major order, read in place from its
/// storage (copied first only when the tensor was laid out otherwise).
struct Values {
    tensor: FlexTensor,
    start: usize,
    len: usize,
}

impl std::ops::Deref for Values {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.tensor.storage::<f32>()[self.start..self.start + self.len]
    }
}

impl<'a> IntoIterator for &'a Values {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The tensor's f32 elements in row-major order, and its shape.
fn contiguous(x: FlexTensor) -> (Values, Shape) {
    let x = f32_tensor(x);
    let shape = x.shape();
    let tensor = copy::to_contiguous(&x);
    let start = tensor.layout().start_offset();
    let len = shape.num_elements();
    (Values { tensor, start, len }, shape)
}

/// The values of an integer tensor (i32 or i64) in row-major order, each
/// checked to lie in `0..bound`; `what` names them in the message otherwise.
fn ids_below(x: FlexTensor, bound: usize, what: &str) -> Vec<usize> {
    let x = x.to_contiguous();
    let (start, n) = (x.layout().start_offset(), x.shape().num_elements());
    let ids: Vec<i64> = match x.dtype() {
        DType::I32 => x.storage::<i32>()[start..start + n]
            .iter()
            .map(|&t| i64::from(t))
            .collect(),
        DType::I64 => x.storage::<i64>()[start..start + n].to_vec(),
        other => panic!("{what}s of dtype {other:?}, expected i32 or i64"),
    };
    ids.into_iter()
        .enumerate()
        .map(|(r, id)| match usize::try_from(id) {
            Ok(id) if id < bound => id,
            _ => panic!("{what} {id} of row {r} is outside the vocabulary (0..{bound})"),
        })
        .collect()
}

/// Whether `x` may be written in place: f32, contiguous from the start of
/// a buffer of exactly its elements, and held nowhere else.
fn writable(x: &FlexTensor) -> bool {
    x.dtype() == DType::F32
        && x.is_contiguous()
        && x.layout().start_offset() == 0
        && x.storage::<f32>().len() == x.shape().num_elements()
        && x.is_unique()
}

/// `x` as an f32 tensor that can be written in place ([`writable`]):
/// itself when it is one, otherwise a copy.
fn owned(x: FlexTensor) -> FlexTensor {
    let x = f32_tensor(x);
    if writable(&x) {
        return x;
    }
    let (values, shape) = contiguous(x);
    tensor(values.to_vec(), shape)
}

fn tensor(values: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(shape),
        DType::F32,
    )
}

/// The scalars of one AdamW update as burn's operations use them (each
/// scalar operation takes its scalar as f32).
#[derive(Debug, Clone, Copy)]
struct AdamWScalars {
    beta_1: f32,
    beta_2: f32,
    factor_1: f32,
    factor_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    /// `1 - lr * weight_decay`, or `None` without decay.
    keep: Option<f32>,
    lr: f32,
}

/// The parameter, first and second moment of a chunk of elements, read
/// and written in place.
type AdamWChunk<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

impl AdamWScalars {
    fn of(step: &AdamWStep) -> Self {
        let [correction_1, correction_2] = step.corrections();
        let decay_rate = step.decay_rate();
        Self {
            beta_1: step.beta_1,
            beta_2: step.beta_2,
            factor_1: 1.0 - step.beta_1,
            factor_2: 1.0 - step.beta_2,
            correction_1,
            correction_2,
            epsilon: step.epsilon,
            keep: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
            lr: step.lr as f32,
        }
    }

    /// One chunk, vectorised with AVX2 where the CPU has it (the
    /// operations are IEEE's, correctly rounded at any width). At the
    /// `first` update the moments' old values are not read: burn starts
    /// them from the gradient's terms alone, which differs from `0 * beta +
    /// term` where the term is `-0`.
    fn update(&self, chunk: AdamWChunk, grad: &[f32], first: bool) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present.
            unsafe { self.update_avx2(chunk, grad, first) };
            return;
        }
        self.update_any(chunk, grad, first);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn update_avx2(&self, chunk: AdamWChunk, grad: &[f32], first: bool) {
        self.update_any(chunk, grad, first);
    }

    /// Each operation rounds to f32, as burn's separate passes do (Rust
    /// never fuses a multiply and an add).
    #[inline(always)]
    fn update_any(&self, (w, m, v): AdamWChunk, grad: &[f32], first: bool) {
        let tail = |w: f32, m: f32, v: f32| {
            let delta = (m / self.correction_1) / ((v / self.correction_2).sqrt() + self.epsilon);
            let w = match self.keep {
                Some(keep) => w * keep,
                None => w,
            };
            w - delta * self.lr
        };
        let elements = w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(grad);
        if first {
            for (((w, m), v), &g) in elements {
                (*m, *v) = (g * self.factor_1, (g * g) * self.factor_2);
                *w = tail(*w, *m, *v);
            }
        } else {
            for (((w, m), v), &g) in elements {
                *m = *m * self.beta_1 + g * self.factor_1;
                *v = *v * self.beta_2 + (g * g) * self.factor_2;
                *w = tail(*w, *m, *v);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use burn::prelude::*;

    pub(super) type B = Flex;

    pub(super) fn seeded(shape: &[usize], seed: u64) -> Vec<f32> {
        let n: usize = shape.iter().product();
        // A small LCG: the values only need to be varied and reproducible.
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    pub(super) fn t<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }

    pub(crate) fn bits<const D: usize>(x: Tensor<B, D>) -> Vec<u32> {
        x.into_data()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    #[test]
    fn write_slice_equals_slice_assign_and_reuses_an_unshared_buffer() {
        let device = Default::default();
        let (base, value) = (seeded(&[2, 3, 5, 4], 1), seeded(&[2, 2, 1, 4], 2));
        let ranges = [0..2, 1..3, 3..4, 0..4];
        let expected = t(base.clone(), [2, 3, 5, 4])
            .slice_assign(ranges.clone(), t(value.clone(), [2, 2, 1, 4]));

        // Unshared: written in place, the same buffer comes back.
        let target = t(base.clone(), [2, 3, 5, 4]);
        let before = target.clone().into_primitive().tensor();
        let address = before.storage::<f32>().as_ptr();
        drop(before);
        let written = crate::write_slice(target, ranges.clone(), t(value.clone(), [2, 2, 1, 4]));
        let after = written.clone().into_primitive().tensor();
        assert_eq!(
            after.storage::<f32>().as_ptr(),
            address,
            "the buffer was copied"
        );
        drop(after);
        assert_eq!(bits(written), bits(expected.clone()));

        // Shared: the other holder keeps its values.
        let target =
            Tensor::<B, 4>::from_data(TensorData::new(base.clone(), [2, 3, 5, 4]), &device);
        let other = target.clone();
        let written = crate::write_slice(target, ranges, t(value, [2, 2, 1, 4]));
        assert_eq!(bits(written), bits(expected));
        assert_eq!(bits(other), bits(t(base, [2, 3, 5, 4])));
    }

    #[test]
    fn widening_bf16_is_burns_cast_bit_for_bit() {
        use burn::tensor::ops::FloatTensorOps;
        let values: Vec<f32> = (0..40_000)
            .map(|i| ((i as f32) * 0.37).sin() * 10f32.powi(i % 7 - 3))
            .chain([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40])
            .collect();
        let n = values.len();
        let x = Flex::float_cast(tensor(values, Shape::from(vec![n])), FloatDType::BF16);
        let ours = f32_tensor(x.clone());
        let theirs = Flex::float_cast(x, FloatDType::F32);
        let bits = |t: &FlexTensor| {
            t.storage::<f32>()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&ours), bits(&theirs));
    }

    #[test]
    fn a_masked_score_gets_the_probability_libm_gives_it() {
        // Masked scores (-inf, about half of a causal row) take the
        // vectorised path's shortcut to +0, which is what libm gives too.
        assert_eq!(libm::expf(f32::NEG_INFINITY).to_bits(), 0.0f32.to_bits());
        let mut row = [
            f32::NEG_INFINITY,
            -1.5,
            f32::NAN,
            0.0,
            -0.25,
            -7.0,
            f32::NEG_INFINITY,
            2.0,
        ];
        let want = row.map(libm::expf);
        crate::expf::libm_exp_in_place(&mut row);
        for (got, want) in row.iter().zip(want) {
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
        }
    }

    #[test]
    fn sums_do_not_depend_on_block_or_thread_split() {
        let xs = seeded(&[300_001], 3);
        let by_blocks = xs.chunks(SUM_BLOCK).map(sum).fold(0.0f32, |t, x| t + x);
        assert_eq!(long_sum(&xs).to_bits(), by_blocks.to_bits());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(
            pool.install(|| long_sum(&xs)).to_bits(),
            by_blocks.to_bits()
        );
    }

    /// The CPU kernels agree with burn's own operations (the defaults, as a
    /// GPU backend runs them) to float rounding.
    #[test]
    fn kernels_match_burns_operations() {
        let x = t(seeded(&[6, 37], 4), [6, 37]);
        let g = t(seeded(&[6, 37], 5), [6, 37]);
        let gamma = t(seeded(&[37], 6), [37]);
        let close = |a: Tensor<B, 2>, b: Tensor<B, 2>| {
            a.into_data()
                .assert_approx_eq::<f32>(&b.into_data(), burn::tensor::Tolerance::absolute(1e-5));
        };
        close(
            crate::softmax(x.clone()),
            burn::tensor::activation::softmax(x.clone(), 1),
        );
        close(
            crate::log_softmax(x.clone()),
            burn::tensor::activation::log_softmax(x.clone(), 1),
        );
        let rms = (x.clone().square().mean_dim(1) + 1e-6).sqrt();
        close(
            crate::rms_norm(x.clone(), gamma.clone(), 1e-6),
            x.clone() / rms.clone() * gamma.clone().unsqueeze::<2>(),
        );
        let total = crate::sum(x.clone()).into_scalar();
        assert!((total - x.clone().sum().into_scalar()).abs() < 1e-4);

        // Backward passes against the default (burn-composed) formulas.
        let prim = |x: Tensor<B, 2>| x.into_primitive().tensor();
        let y = crate::softmax(x.clone());
        let default_softmax = {
            let dot = (g.clone() * y.clone()).sum_dim(1);
            y.clone() * (g.clone() - dot)
        };
        close(
            Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(
                <B as ModelBackend>::softmax_last_backward(prim(y), prim(g.clone())),
            )),
            default_softmax,
        );
        let (dx, dgamma) = <B as ModelBackend>::rms_norm_backward(
            prim(x.clone()),
            gamma.clone().into_primitive().tensor(),
            prim(g.clone()),
            1e-6,
        );
        let inv = rms.recip();
        let want_dgamma = (g.clone() * x.clone() * inv.clone()).sum_dim(0);
        close(
            Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(dgamma))
                .unsqueeze::<2>(),
            want_dgamma,
        );
        let scaled = g.clone() * gamma.unsqueeze::<2>();
        let dot = (scaled.clone() * x.clone()).sum_dim(1);
        let want_dx = scaled * inv.clone() - x * inv.powi_scalar(3) * dot / 37.0;
        close(
            Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(dx)),
            want_dx,
        );
    }

    /// AdamW writes a parameter and moments held nowhere else in place,
    /// copies those that are shared (leaving the other holder's values as
    /// they were), and gives the same bits either way.
    #[test]
    fn adamw_step_writes_unshared_tensors_in_place_and_copies_shared_ones() {
        let n = 3 * ADAMW_ELEMENTS_PER_TASK + 5;
        let shape = Shape::from(vec![n]);
        let values = |seed: u64, scale: f32| -> Vec<f32> {
            seeded(&[n], seed).iter().map(|v| v * scale).collect()
        };
        let inputs = || {
            let second_moment = values(4, 1e-3).iter().map(|v| v.abs()).collect();
            (
                tensor(values(1, 1.0), shape.clone()),
                tensor(values(2, 0.5), shape.clone()),
                tensor(values(3, 0.05), shape.clone()),
                tensor(second_moment, shape.clone()),
            )
        };
        let step = AdamWStep {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-5,
            weight_decay: 0.1,
            lr: 1e-2,
            time: 3,
        };
        let address = |x: &FlexTensor| x.bytes().as_ptr();
        let raw = |x: &FlexTensor| {
            x.storage::<f32>()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        let (param, grad, m, v) = inputs();
        let addresses = [address(&param), address(&m), address(&v)];
        let in_place = <B as ModelBackend>::adamw_step(param, grad, Some((m, v)), &step);
        for (out, before) in in_place.iter().zip(addresses) {
            assert_eq!(
                address(out),
                before,
                "an unshared tensor is updated in place"
            );
        }
        let (param, grad, m, v) = inputs();
        let kept = [param.clone(), m.clone(), v.clone()];
        let kept_bits = kept.each_ref().map(raw);
        let copied = <B as ModelBackend>::adamw_step(param, grad, Some((m, v)), &step);
        for ((out, kept), kept_bits) in copied.iter().zip(&kept).zip(&kept_bits) {
            assert_ne!(address(out), address(kept), "a shared tensor is copied");
            assert_eq!(
                &raw(kept),
                kept_bits,
                "the other holder's values are unchanged"
            );
        }
        for (a, b) in in_place.iter().zip(&copied) {
            assert_eq!(raw(a), raw(b));
        }
        assert_ne!(raw(&copied[0]), kept_bits[0], "the parameter moved");
    }

    /// The token embedding and its gradient are burn's `embedding` and
    /// `embedding_backward`, bit for bit: ids repeated (their rows summed
    /// in token order), an id at the table's end, rows no id names (zero),
    /// and gradients of `-0` (which `0 + g` turns into `+0` in both).
    #[test]
    fn embed_tokens_is_burns_embedding_bit_for_bit() {
        type A = burn::backend::Autodiff<Flex>;
        let device = Default::default();
        let (vocab, hidden) = (11, 6);
        let weights = Tensor::<A, 2>::from_data(
            TensorData::new(seeded(&[vocab, hidden], 5), [vocab, hidden]),
            &device,
        )
        .require_grad();
        let ids = vec![3i64, 7, 3, 0, 10, 3, 7, 1];
        let ids = Tensor::<A, 2, Int>::from_data(TensorData::new(ids, [2, 4]), &device);
        let mut upstream = seeded(&[2, 4, hidden], 9);
        for v in upstream.iter_mut().step_by(5) {
            *v = -0.0;
        }
        let upstream =
            Tensor::<A, 3>::from_data(TensorData::new(upstream, [2, 4, hidden]), &device);
        let ours = crate::embed_tokens(weights.clone(), ids.clone());
        let burns = burn::tensor::module::embedding(weights.clone(), ids);
        assert_eq!(bits(ours.clone().inner()), bits(burns.clone().inner()));
        let grad = |out: Tensor<A, 3>| {
            let grads = (out * upstream.clone()).sum().backward();
            bits(weights.grad(&grads).expect("the table's gradient"))
        };
        let (ours, burns) = (grad(ours), grad(burns));
        assert_eq!(ours, burns);
        assert!(
            ours[2 * hidden..3 * hidden].iter().all(|&b| b == 0),
            "row 2 is named by no id"
        );
    }

    #[test]
    #[should_panic(expected = "embed_tokens: token id 4 of row 1 is outside the vocabulary (0..4)")]
    fn embed_tokens_backward_refuses_an_id_outside_the_table() {
        let weights = t(seeded(&[4, 3], 1), [4, 3]);
        let grad = t(seeded(&[1, 2, 3], 2), [1, 2, 3]);
        let ids = Tensor::<B, 2, Int>::from_data(
            TensorData::new(vec![0i64, 4], [1, 2]),
            &Default::default(),
        );
        <B as ModelBackend>::embed_tokens_backward(
            weights.into_primitive().tensor(),
            grad.into_primitive().tensor(),
            ids.into_primitive(),
        );
    }
}
