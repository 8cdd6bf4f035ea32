//! [`ModelBackend`] for burn's `flex` CPU backend: each operation's
//! tensors unpacked, the work handed to the kernels of the sibling modules,
//! the result packed back.

use burn::backend::flex::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor, ModuleOps};
use burn::tensor::{DType, Shape, TensorMetadata};
use rayon::prelude::*;

use super::adamw::{AdamWScalars, ADAMW_ELEMENTS_PER_TASK};
use super::matmul::{lane_split, matmul};
use super::reduce::{axpy, dot, long_sum, row_max, sum};
use super::rows::{
    log_softmax_backward_row, log_softmax_row, masked_softmax_row, rms_norm_backward_rows,
    rms_norm_row, rope_pass, softmax_backward_row, softmax_row, swiglu_backward_chunk,
    swiglu_chunk, RotateHalf,
};
use super::tensors::{contiguous, f32_tensor, ids_below, last_dim, owned, tensor, write_slice};
use super::{attention, copy, fresh, steps, token, ELEMENTS_PER_TASK, ROWS_PER_TASK};
use crate::expf::libm_exp_in_place;
use crate::written::{write_all, write_rows};
use crate::{AdamWStep, CausalMask, ModelBackend};

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
