//! Sums and maxima in an order fixed by the length alone: [`LANES`]
//! running partial sums in plain arrays, added in a fixed tree, so that
//! any vectorisation gives the same bits; long sums in fixed-size blocks.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::expf::libm_exp_in_place;
use crate::written::write_all;

/// Partial sums kept apart in [`sum`] and [`dot`].
pub const LANES: usize = 16;

/// Elements per block of a long sum: blocks are summed on their own (in
/// parallel), then added in order.
pub(super) const SUM_BLOCK: usize = 1 << 16;

/// `acc += a * x`, element by element (no sum, so any vectorisation gives
/// the same bits).
#[inline(always)]
pub(super) fn axpy(acc: &mut [f32], a: f32, x: &[f32]) {
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
pub(super) fn fold_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// The largest value of `row` that is not NaN (`-inf` if none), in
/// [`LANES`] running maxima that vectorise. A maximum of values, NaN
/// ignored, is the same in any order, but for the sign of a zero maximum
/// (`f32::max` may return either zero), which no caller's result shows:
/// each subtracts it from values and exponentiates, or adds it to a
/// logarithm that is at least `+0`.
#[inline(always)]
pub(super) fn row_max(row: &[f32]) -> f32 {
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
    pub(super) fn log_sum_exp<'a>(row: &[f32], scratch: &'a mut [MaybeUninit<f32>]) -> (f32, &'a mut [f32]) {
        let max = row_max(row);
        let scratch = write_all(scratch, row.iter().map(|&v| v - max));
        libm_exp_in_place(scratch);
        (max + libm::logf(sum(scratch)), scratch)
    }
}

#[inline(always)]
pub(super) fn inv_rms(row: &[f32], epsilon: f64) -> f32 {
    let mean = dot(row, row) / row.len() as f32;
    1.0 / (mean + epsilon as f32).sqrt()
}
