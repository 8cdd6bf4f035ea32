//! The row-wise and element-wise kernels that [`super::backend`] spreads
//! over rayon's threads: RoPE, RMSNorm, softmax and log-softmax with their
//! gradients, the masked softmax of attention, SwiGLU. Each row is computed
//! by one thread from start to end; the loops are [`widened!`] for AVX2.

use std::mem::MaybeUninit;

use burn::backend::flex::Flex;
use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;

use super::reduce::{dot, inv_rms, log_sum_exp, row_max, sum};
use super::tensors::{contiguous, tensor};
use super::{fresh, ELEMENTS_PER_TASK};
use crate::expf::{libm_exp_in_place, sigmoid_into};
use crate::written::{write_all, write_rows};

/// RoPE's forward (`turn` = [`RotateHalf::Forward`]) or backward pass over
/// `y` (the input `[batch, seq, heads, d]` or the output's gradient
/// `[batch, heads, seq, d]`), written with its two middle dimensions
/// swapped, rows in parallel; see [`rotate_rows`].
pub(super) fn rope_pass(
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
pub(super) struct RopeRows {
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
pub(super) enum RotateHalf {
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
    pub(super) fn rotate_rows<'a>(
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
    pub(super) fn rms_norm_row<'a>(
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
    pub(super) fn softmax_row<'a>(row: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
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
pub(super) fn softmax_backward_row<'a>(
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
    pub(super) fn softmax_backward_in_place(y: &[f32], grad: &mut [f32]) {
        let inner = dot(grad, y);
        for (g, &p) in grad.iter_mut().zip(y) {
            *g = p * (*g - inner);
        }
    }
}

widened! {
    /// One row's log-softmax: `x - log_sum_exp(x)`.
    pub(super) fn log_softmax_row<'a>(row: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
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
    pub(super) fn log_softmax_backward_row<'a>(
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
    pub(super) fn rms_norm_backward_rows(
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
    pub(super) fn swiglu_chunk<'a>(gate: &[f32], up: &[f32], out: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
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
    pub(super) fn swiglu_backward_chunk<'a>(
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
pub(super) fn masked_softmax_row<'a>(
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
    pub(super) fn masked_softmax_in_place(out: &mut [f32], seen: std::ops::RangeInclusive<usize>) {
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
