//! The summation order of gemm's x86-64 kernels at AVX2's width, written
//! out in portable Rust for the calls whose kernels reduce differently on
//! other CPUs (64-bit ARM): the contract's order, whatever the CPU.
//!
//! gemm 0.19 picks a kernel for one call from its shapes and strides, once
//! it has transposed the call so that the destination is column-major
//! ([`Frame`]); then, in this order of checks ([`Kernel::of`]):
//!
//! - **horizontal** (`lhs`'s rows and `rhs`'s columns contiguous, at most
//!   256 outputs): each output one dot product in eight FMA lanes (term `p`
//!   on lane `p % 8`), its lanes added in a fixed tree. gemm's NEON module
//!   has no such kernels;
//! - **products** (`k <= 2`, gemm's `gevv`): rounded products added to the
//!   output one by one, no fused multiply-add. The same code on every CPU,
//!   so left to gemm;
//! - **column chain** (one output column, its values contiguous, gemm's
//!   column-major `gemv`): one chain per output along `k`, fused on x86-64
//!   (gemm drives it with AVX2 or AVX-512 there), unfused on ARM (where
//!   gemm drives it with its scalar type);
//! - **row vector** (one output row or column, `lhs`'s rows and `rhs`'s
//!   columns contiguous, gemm's row-major `gemv`): eight accumulators of
//!   eight lanes over blocks of 64 terms on x86-64, one lane on ARM;
//! - **packed**: one FMA chain per output element along `k` from zero,
//!   added to the output, at any register width (NEON's `fmla` included).
//!   Left to gemm.
//!
//! [`reduce`] computes the horizontal, column-chain and row-vector calls
//! in x86-64's order and leaves the rest to gemm; `matmul.rs` calls it off
//! x86-64. On x86-64 the tests hold it to gemm's own kernels, call for call
//! (`tests::the_written_order_is_gemms_on_x86_64`).

/// Lanes of an AVX2 register of f32, the width of gemm's x86-64 kernels
/// that split sums into lanes.
const LANES: usize = 8;

/// One gemm call as gemm's driver sees it, after making the destination
/// column-major: `dst (m x n) (+)= lhs (m x k) @ rhs (k x n)`, each matrix
/// a pointer and its column and row strides (in values, not negative).
#[derive(Debug, Clone, Copy)]
pub(super) struct Frame {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Add to `dst` (else overwrite it without reading it).
    pub read_dst: bool,
    pub dst: *mut f32,
    pub dst_cs: isize,
    pub dst_rs: isize,
    pub lhs: *const f32,
    pub lhs_cs: isize,
    pub lhs_rs: isize,
    pub rhs: *const f32,
    pub rhs_cs: isize,
    pub rhs_rs: isize,
}

/// Which of gemm's kernels reduces a call ([`Kernel::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    Horizontal,
    Products,
    /// gemm's column-major `gemv`; `transposed` where it runs with the
    /// factors' roles swapped (one output row).
    ColumnChain {
        transposed: bool,
    },
    RowVector,
    Packed,
}

impl Kernel {
    /// The kernel gemm 0.19's driver (`gemm_basic_generic`) gives `frame`
    /// on x86-64 with AVX2, in the order it checks.
    pub(super) fn of(f: &Frame) -> Self {
        let contiguous_dots = f.lhs_cs == 1 && f.rhs_rs == 1;
        if contiguous_dots && f.m * f.n <= 16 * 16 {
            Self::Horizontal
        } else if f.k <= 2 {
            Self::Products
        } else if f.n <= 1 && f.lhs_rs == 1 && f.dst_rs == 1 {
            Self::ColumnChain { transposed: false }
        } else if f.n <= 1 && contiguous_dots {
            Self::RowVector
        } else if f.m <= 1 && f.rhs_cs == 1 && f.dst_cs == 1 {
            Self::ColumnChain { transposed: true }
        } else if f.m <= 1 && contiguous_dots {
            Self::RowVector
        } else {
            Self::Packed
        }
    }
}

/// Reduces `frame` in the order of gemm's x86-64 kernel for it and returns
/// true, or returns false, writing nothing, for the products and packed
/// kernels (whose order gemm keeps on every CPU).
///
/// # Safety
/// The frame's pointers address every element its shapes and strides
/// reach; `dst` does not overlap `lhs` or `rhs`; `k > 0`.
pub(super) unsafe fn reduce(frame: &Frame) -> bool {
    match Kernel::of(frame) {
        // SAFETY (each arm): as for `reduce`.
        Kernel::Horizontal => unsafe { dots(frame, horizontal_dot) },
        Kernel::RowVector => unsafe { dots(frame, row_vector_dot) },
        Kernel::ColumnChain { transposed } => unsafe { column_chain(frame, transposed) },
        Kernel::Products | Kernel::Packed => return false,
    }
    true
}

/// Each output of `f` as `dot` of its row of `lhs` and column of `rhs`
/// (both contiguous), added to the output where `f.read_dst`.
///
/// # Safety
/// As for [`reduce`], with `f.lhs_cs == 1 && f.rhs_rs == 1`.
unsafe fn dots(f: &Frame, dot: fn(&[f32], &[f32]) -> f32) {
    debug_assert!(f.lhs_cs == 1 && f.rhs_rs == 1);
    for i in 0..f.m {
        for j in 0..f.n {
            // SAFETY: row `i` of `lhs` and column `j` of `rhs` are
            // contiguous, `k` values each; `(i, j)` is within `dst`.
            let (x, y, out) = unsafe {
                (
                    std::slice::from_raw_parts(f.lhs.offset(i as isize * f.lhs_rs), f.k),
                    std::slice::from_raw_parts(f.rhs.offset(j as isize * f.rhs_cs), f.k),
                    &mut *f.dst.offset(i as isize * f.dst_rs + j as isize * f.dst_cs),
                )
            };
            let sum = dot(x, y);
            *out = if f.read_dst { *out + sum } else { sum };
        }
    }
}

/// gemm's horizontal kernel's dot product: eight lanes of FMA chains,
/// folded as `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
fn horizontal_dot(x: &[f32], y: &[f32]) -> f32 {
    let mut l = [0.0f32; LANES];
    let (xs, ys) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (x_tail, y_tail) = (xs.remainder(), ys.remainder());
    for (x, y) in xs.zip(ys) {
        for q in 0..LANES {
            l[q] = x[q].mul_add(y[q], l[q]);
        }
    }
    for q in 0..x_tail.len() {
        l[q] = x_tail[q].mul_add(y_tail[q], l[q]);
    }
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// gemm's row-major `gemv` dot product at AVX2's width: eight accumulators
/// of eight lanes over whole blocks of 64 terms, added pairwise, then whole
/// blocks of 8 terms into the one left, its lanes added in order, and the
/// last terms chained on.
fn row_vector_dot(x: &[f32], y: &[f32]) -> f32 {
    let k = x.len();
    let blocks = k / (LANES * LANES) * LANES * LANES;
    let mut acc = [[0.0f32; LANES]; LANES];
    for (x, y) in x[..blocks]
        .chunks_exact(LANES * LANES)
        .zip(y[..blocks].chunks_exact(LANES * LANES))
    {
        for (u, lanes) in acc.iter_mut().enumerate() {
            for (q, lane) in lanes.iter_mut().enumerate() {
                *lane = x[u * LANES + q].mul_add(y[u * LANES + q], *lane);
            }
        }
    }
    let add =
        |a: [f32; LANES], b: [f32; LANES]| std::array::from_fn::<f32, LANES, _>(|q| a[q] + b[q]);
    let mut lanes = add(
        add(add(acc[0], acc[1]), add(acc[2], acc[3])),
        add(add(acc[4], acc[5]), add(acc[6], acc[7])),
    );
    let whole = k / LANES * LANES;
    for (x, y) in x[blocks..whole]
        .chunks_exact(LANES)
        .zip(y[blocks..whole].chunks_exact(LANES))
    {
        for q in 0..LANES {
            lanes[q] = x[q].mul_add(y[q], lanes[q]);
        }
    }
    let total = lanes[1..].iter().fold(lanes[0], |total, &l| total + l);
    x[whole..]
        .iter()
        .zip(&y[whole..])
        .fold(total, |total, (&x, &y)| x.mul_add(y, total))
}

/// gemm's column-major `gemv`: the outputs (one column of `dst`, or one row
/// where `transposed`) each a chain along `k`, the first term a rounded
/// product where `dst` is not read, then fused multiply-adds onto it;
/// `k` outer, the outputs inner (contiguous).
///
/// # Safety
/// As for [`reduce`].
unsafe fn column_chain(f: &Frame, transposed: bool) {
    // The outputs, and the factor whose values run along them (`along`,
    // contiguous per term) and the one holding a term's scalar (`scalar`).
    let (count, out_stride, along, along_step, scalar, scalar_step) = if transposed {
        (f.n, f.dst_cs, f.rhs, f.rhs_rs, f.lhs, f.lhs_cs)
    } else {
        (f.m, f.dst_rs, f.lhs, f.lhs_cs, f.rhs, f.rhs_rs)
    };
    debug_assert_eq!(
        out_stride, 1,
        "the column-major gemv writes contiguous outputs"
    );
    // SAFETY: `count` contiguous outputs (stride 1, checked by `Kernel::of`).
    let out = unsafe { std::slice::from_raw_parts_mut(f.dst, count) };
    for p in 0..f.k {
        // SAFETY: term `p` of the scalar factor and `count` contiguous
        // values of the other are within their matrices.
        let (y, x) = unsafe {
            (
                *scalar.offset(p as isize * scalar_step),
                std::slice::from_raw_parts(along.offset(p as isize * along_step), count),
            )
        };
        if p == 0 && !f.read_dst {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = x * y;
            }
        } else {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = x.mul_add(y, *o);
            }
        }
    }
}
