//! Matrix products with at most eight output columns, as decoding makes
//! them: `W xᵀ` for a weight matrix `W` (`[out, in]`, rows contiguous) and
//! the few token rows of `x`. gemm packs the whole of `W` for every such
//! call and then runs a kernel sized for wide outputs; here `W` is read
//! once, in place, eight rows at a time, against `xᵀ` packed into one AVX2
//! register per term (the eight columns; two NEON registers on 64-bit ARM,
//! where the compiler vectorises the plain-Rust kernel).
//!
//! The bits are those of gemm's packed kernels ([`super::GEMM_MAX_K`]-term
//! slices, each one chain of fused multiply-adds per output in the order of
//! `k` from zero, a slice of one or two terms as plain products and sums,
//! the slices added in order): the register's lanes are the outputs, never
//! parts of one sum. Calls that gemm would give to a lane-split kernel are
//! not taken here (see [`super::GemmCall::lane_split`]).

use rayon::prelude::*;

use super::GEMM_MAX_K;

/// The most output columns (token rows of `x`) a call may have.
pub(super) const MAX_COLUMNS: usize = 8;

/// Rows of `lhs` reduced together: eight independent chains keep both FMA
/// units busy through their latency.
const BLOCK: usize = 8;

/// Rows of `lhs` per thread's task when the call is split across threads.
const ROWS_PER_TASK: usize = 64;

/// At least this many multiply-adds (`m * n * k`) use threads.
const PARALLEL_OPS: usize = 1 << 19;

/// Whether this CPU runs the kernel: on x86-64 where it has AVX2 and FMA
/// (elsewhere callers keep to gemm, which gives the same bits there), and
/// on every other architecture, whose fused multiply-add is part of the
/// base instruction set (NEON's `fmla` on 64-bit ARM), and where gemm would
/// give a one-row product to a kernel of another order (see `order.rs`).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// `out (m x n, row-major) = lhs (m x k) @ rhs (k x n)` for `n <=`
/// [`MAX_COLUMNS`], where `lhs`'s rows are contiguous: row `i` starts at
/// `lhs[i * lhs_rs]`, and `rhs[p, j]` is `rhs_at(p, j)`.
///
/// # Panics
/// If `n` exceeds [`MAX_COLUMNS`], `lhs` is too short for its rows, or
/// the CPU lacks AVX2 or FMA ([`available`]).
pub(super) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    lhs: &[f32],
    lhs_rs: usize,
    rhs_at: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    assert!(n <= MAX_COLUMNS && available(), "narrow matmul: n = {n}");
    assert!(
        m == 0 || (m - 1) * lhs_rs + k <= lhs.len(),
        "narrow matmul: lhs too short"
    );
    // rhs as k registers of eight lanes (zero past `n`).
    let mut packed = vec![0.0f32; k * MAX_COLUMNS];
    for (p, lanes) in packed.chunks_exact_mut(MAX_COLUMNS).enumerate() {
        for (j, lane) in lanes[..n].iter_mut().enumerate() {
            *lane = rhs_at(p, j);
        }
    }
    let mut out = vec![0.0f32; m * n];
    let rows = |(task, out): (usize, &mut [f32])| {
        let first = task * ROWS_PER_TASK;
        let mut i = 0;
        let count = out.len() / n.max(1);
        while i < count {
            let take = (count - i).min(BLOCK);
            let row = |r: usize| &lhs[(first + i + r.min(take - 1)) * lhs_rs..][..k];
            // The rows after these, up to the last: read from memory while
            // these are reduced.
            let next = |r: usize| &lhs[(first + i + take + r).min(m - 1) * lhs_rs..][..k];
            let results = block(
                std::array::from_fn(row),
                std::array::from_fn(next),
                &packed,
                k,
            );
            for (r, result) in results.iter().take(take).enumerate() {
                out[(i + r) * n..][..n].copy_from_slice(&result[..n]);
            }
            i += take;
        }
    };
    if n == 0 {
        return out;
    }
    if m * n * k >= PARALLEL_OPS {
        out.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(rows);
    } else {
        out.chunks_mut(ROWS_PER_TASK * n).enumerate().for_each(rows);
    }
    out
}

/// The eight outputs of each of [`BLOCK`] `lhs` rows: slices of at most
/// [`GEMM_MAX_K`] terms added in order. `next` are the rows to be reduced
/// after these, which the kernel asks the CPU to fetch.
fn block(
    rows: [&[f32]; BLOCK],
    next: [&[f32]; BLOCK],
    packed: &[f32],
    k: usize,
) -> [[f32; MAX_COLUMNS]; BLOCK] {
    let mut total = [[0.0f32; MAX_COLUMNS]; BLOCK];
    let mut start = 0;
    while start < k {
        let len = GEMM_MAX_K.min(k - start);
        let terms = &packed[start * MAX_COLUMNS..][..len * MAX_COLUMNS];
        let slice = rows.map(|row| &row[start..start + len]);
        if len <= 2 {
            // gemm's short slices: the products, then their sum after the
            // running total.
            for (total, row) in total.iter_mut().zip(slice) {
                for (j, t) in total.iter_mut().enumerate() {
                    let product = |p: usize| row[p] * terms[p * MAX_COLUMNS + j];
                    let first = if start == 0 {
                        product(0)
                    } else {
                        product(0) + *t
                    };
                    *t = if len == 2 { product(1) + first } else { first };
                }
            }
        } else {
            let next = next.map(|row| &row[start..start + len]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available()` was checked by `matmul`; every row
            // slice and `terms` hold `len` terms.
            let chains = unsafe { avx2::chains(slice, next, terms, len) };
            #[cfg(not(target_arch = "x86_64"))]
            let chains = portable::chains(slice, next, terms, len);
            for (total, chain) in total.iter_mut().zip(chains) {
                for (t, c) in total.iter_mut().zip(chain) {
                    *t = if start == 0 { c } else { *t + c };
                }
            }
        }
        start += len;
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, MAX_COLUMNS};

    /// Values of a row per 64-byte cache line.
    const LINE: usize = 16;

    /// For each of [`BLOCK`] rows, the eight chains `fma(row[p], terms[p][j],
    /// acc)` over `p` in order from zero. Each cache line of the rows is
    /// met with a prefetch of the same line of `next`'s rows: the hardware
    /// prefetchers, which follow a few long streams, fall behind on eight
    /// rows of a few KiB read side by side, and the kernel then waits for
    /// memory (decoding's products ran at about half the bandwidth).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; each row and each of `next` holds `len`
    /// values, and `terms` `len * 8`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn chains(
        rows: [&[f32]; BLOCK],
        next: [&[f32]; BLOCK],
        terms: &[f32],
        len: usize,
    ) -> [[f32; MAX_COLUMNS]; BLOCK] {
        debug_assert!(rows.iter().chain(&next).all(|r| r.len() >= len));
        debug_assert!(terms.len() >= len * MAX_COLUMNS);
        let mut acc = [_mm256_setzero_ps(); BLOCK];
        let t = terms.as_ptr();
        let r = rows.map(|row| row.as_ptr());
        for line in (0..len).step_by(LINE) {
            for row in &next {
                _mm_prefetch::<_MM_HINT_T0>(row[line..].as_ptr().cast());
            }
            for p in line..len.min(line + LINE) {
                // SAFETY: `p < len`, within every row and `terms`.
                unsafe {
                    let b = _mm256_loadu_ps(t.add(p * MAX_COLUMNS));
                    for q in 0..BLOCK {
                        acc[q] = _mm256_fmadd_ps(_mm256_set1_ps(*r[q].add(p)), b, acc[q]);
                    }
                }
            }
        }
        // SAFETY: __m256 and [f32; 8] have the same size.
        acc.map(|a| unsafe { std::mem::transmute::<__m256, [f32; 8]>(a) })
    }
}

/// The kernel in plain Rust, for CPUs whose fused multiply-add is in the
/// base instruction set: the compiler keeps each row's eight chains in
/// vector registers (two of NEON's four lanes each) and fuses nothing else.
#[cfg(not(target_arch = "x86_64"))]
mod portable {
    use super::{BLOCK, MAX_COLUMNS};

    /// As `avx2::chains` on x86-64: for each of [`BLOCK`] rows, the eight
    /// chains `fma(row[p], terms[p][j], acc)` over `p` in order from zero.
    /// `next` is not prefetched here.
    pub(super) fn chains(
        rows: [&[f32]; BLOCK],
        _next: [&[f32]; BLOCK],
        terms: &[f32],
        len: usize,
    ) -> [[f32; MAX_COLUMNS]; BLOCK] {
        let mut acc = [[0.0f32; MAX_COLUMNS]; BLOCK];
        for (p, b) in terms[..len * MAX_COLUMNS]
            .chunks_exact(MAX_COLUMNS)
            .enumerate()
        {
            for (acc, row) in acc.iter_mut().zip(&rows) {
                let x = row[p];
                for (a, &b) in acc.iter_mut().zip(b) {
                    *a = x.mul_add(b, *a);
                }
            }
        }
        acc
    }
}
