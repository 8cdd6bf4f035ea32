//! Matrix products on the CPU ([`matmul`]), through the `gemm` crate as
//! flex's own go, but never with more than [`GEMM_MAX_K`] terms per call:
//! gemm reduces up to 512 terms in one pass on every CPU and splits longer
//! reductions at a point it derives from the L1 cache. Longer reductions are
//! cut here into 512-term slices whose partial products are added in order.
//!
//! Which of gemm's kernels reduces a slice (packed FMA chains, eight-lane
//! dot products for small `x @ w^T`, plain products for one- and two-term
//! slices, matrix-vector kernels for one row or column) follows from the
//! shapes and strides alone; the tests pin each against a reference of its
//! summation order. The packed kernels keep one FMA chain per output element
//! whatever the register width, so gemm's AVX-512 kernels (its `x86-v4`
//! feature, about 1.4x faster here) give the bits of its AVX2 ones; the
//! lane-split kernels (dot products kept in eight lanes, or sixteen with
//! AVX-512) do not, so those calls run gemm's AVX2 kernels on every CPU
//! ([`GemmCall`]). A product is therefore bit-identical on every x86-64 CPU
//! with AVX2 and FMA, whatever the thread count: threads split rows and
//! columns, or a weight gradient's 512-term slices, whose partial products
//! are added in the same order either way ([`split_reduction`]).
//!
//! On 64-bit ARM gemm's NEON module has the packed kernels' order (one
//! `fmla` chain per output), but no horizontal kernels, and it drives its
//! matrix-vector kernels with one unfused lane; those calls follow x86-64's
//! order as `order.rs` writes it out, so a product has the same bits there
//! too (the determinism test's ARM variant, `crates/mappa-learner/tests/determinism.rs`).
//!
//! Products with at most eight output columns that gemm would pack (`W xᵀ`
//! in decoding) run a kernel of their own with the packed kernels' bits
//! (`narrow.rs`). A transposed right factor (`x Wᵀ`) of at most
//! [`TRANSPOSE_MAX_COLUMNS`] columns is first copied into a row-major `Wᵀ`,
//! which gemm packs faster, for the same packed kernels and bits
//! ([`copies_transposed_rhs`]).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::Shape;
use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::tensors::tensor;
use super::{copy, narrow, order, ELEMENTS_PER_TASK};

/// The most terms one `gemm` call reduces over. gemm's blocking along `k`
/// is at least 512 on every CPU, so a call with `k <= 512` is never split.
pub const GEMM_MAX_K: usize = 512;

/// The most columns of `x Wᵀ` for which [`matmul`] copies `Wᵀ` into a
/// row-major matrix first ([`copies_transposed_rhs`]).
const TRANSPOSE_MAX_COLUMNS: usize = 1536;

/// Zeros after each row of such a copy: a row stride of a power of two
/// floats maps the rows gemm reads together to the same cache sets.
const TRANSPOSE_PAD: usize = 16;

/// A stride, in f32 values, whose multiples map every row to the same L1
/// cache set (4 KiB; [`writes_column_major`]).
const ALIASING_STRIDE: isize = 1024;

/// The most columns of a row-major product for which gemm (at AVX-512's
/// width) reads its left factor in place instead of packing it
/// ([`writes_column_major`]).
const NARROW_UNPACKED_COLUMNS: usize = 128;

/// A single gemm call with at least this many multiply-adds uses threads.
pub(super) const GEMM_PARALLEL_OPS: usize = 192 * 192 * 192;

/// `lhs @ rhs` over the last two dimensions of two f32 tensors with equal
/// leading dimensions, read in place through their strides.
pub(super) fn matmul(lhs: &FlexTensor, rhs: &FlexTensor) -> FlexTensor {
    let (ll, rl) = (lhs.layout(), rhs.layout());
    let (ls, rs) = (ll.shape(), rl.shape());
    let rank = ls.len();
    assert!(
        rank >= 2 && rs.len() == rank && ls[..rank - 2] == rs[..rank - 2] && ls[rank - 1] == rs[rank - 2],
        "matmul: shapes {:?} and {:?} do not multiply (equal leading dimensions, [.., m, k] @ [.., k, n])",
        &ls[..],
        &rs[..]
    );
    let (m, k, n) = (ls[rank - 2], ls[rank - 1], rs[rank - 1]);
    let batch_dims = &ls[..rank - 2];
    let batches: usize = batch_dims.iter().product();
    let mut out_shape = ls.to_vec();
    out_shape[rank - 1] = n;
    if m == 0 || n == 0 || k == 0 {
        return tensor(vec![0.0f32; batches * m * n], Shape::from(out_shape));
    }
    if batches == 1
        && n <= narrow::MAX_COLUMNS
        && ll.strides()[rank - 1] == 1
        && ll.strides()[rank - 2] >= 0
        && !lane_split(lhs, rhs)
        && narrow::available()
    {
        // A weight matrix times a few token columns (`W xᵀ`, decoding).
        let out = narrow_product(lhs, rhs, [m, n, k]);
        return tensor(out, Shape::from(out_shape));
    }
    let copied_rhs;
    let rhs_view = if batches == 1 && copies_transposed_rhs(lhs, rhs) {
        let row_stride = n + TRANSPOSE_PAD;
        let data = &rhs.storage::<f32>()[rl.start_offset()..];
        copied_rhs = copy::transpose(data, [k, n], rl.strides()[rank - 1] as usize, row_stride);
        View {
            data: &copied_rhs,
            start: 0,
            row_stride: row_stride as isize,
            col_stride: 1,
        }
    } else {
        View::new(rhs, rl, rank)
    };
    // Not zeroed: gemm's first call (`k` from 0) writes every element of
    // `out` without reading it, and later calls add to it.
    let mut out: Vec<MaybeUninit<f32>> = Vec::with_capacity(batches * m * n);
    // SAFETY: MaybeUninit needs no initialisation.
    unsafe { out.set_len(batches * m * n) };
    let lhs_view = View::new(lhs, ll, rank);
    let offsets = |b: usize| {
        let (mut lo, mut ro, mut rest) = (0isize, 0isize, b);
        for d in (0..rank - 2).rev() {
            let i = (rest % batch_dims[d]) as isize;
            rest /= batch_dims[d];
            lo += i * ll.strides()[d];
            ro += i * rl.strides()[d];
        }
        (lo, ro)
    };
    let ops = m * n * k;
    if batches == 1 {
        if single_product(&mut out, [m, n, k], &lhs_view, &rhs_view) {
            // SAFETY: every element was written by gemm (`k > 0`), and
            // MaybeUninit<f32> has f32's size and alignment.
            let column_major =
                unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<f32>(), m * n) };
            let row_major = copy::transpose(column_major, [m, n], m, n);
            return tensor(row_major, Shape::from(out_shape));
        }
    } else {
        let batch = |(b, out): (usize, &mut [MaybeUninit<f32>])| {
            let (lo, ro) = offsets(b);
            let none = gemm::Parallelism::None;
            gemm_chunked(out, m, n, k, &lhs_view, lo, &rhs_view, ro, none, false);
        };
        if batches * ops < GEMM_PARALLEL_OPS {
            // Small batches on the calling thread (see `for_rows`).
            out.chunks_mut(m * n).enumerate().for_each(batch);
        } else {
            out.par_chunks_mut(m * n).enumerate().for_each(batch);
        }
    }
    let mut out = std::mem::ManuallyDrop::new(out);
    // SAFETY: every element was written by gemm (`k > 0`), and
    // MaybeUninit<f32> has f32's size and alignment.
    let out =
        unsafe { Vec::from_raw_parts(out.as_mut_ptr().cast::<f32>(), out.len(), out.capacity()) };
    tensor(out, Shape::from(out_shape))
}

/// `lhs @ rhs` for one matrix times a few columns, by [`narrow::matmul`]
/// (the caller checked that it applies): row-major, `m x n`.
fn narrow_product(lhs: &FlexTensor, rhs: &FlexTensor, [m, n, k]: [usize; 3]) -> Vec<f32> {
    let (ll, rl) = (lhs.layout(), rhs.layout());
    let rank = ll.shape().len();
    let (lhs_data, rhs_data) = (lhs.storage::<f32>(), rhs.storage::<f32>());
    let (rs, cs) = (rl.strides()[rank - 2], rl.strides()[rank - 1]);
    let rhs_start = rl.start_offset() as isize;
    narrow::matmul(
        m,
        n,
        k,
        &lhs_data[ll.start_offset()..],
        ll.strides()[rank - 2] as usize,
        |p, j| rhs_data[(rhs_start + p as isize * rs + j as isize * cs) as usize],
    )
}

/// One `m x n` product into `out` by gemm, on gemm's threads or with its
/// reduction split among threads ([`splits_reduction`]) when large enough;
/// returns whether `out` was written column-major ([`writes_column_major`]).
fn single_product(
    out: &mut [MaybeUninit<f32>],
    [m, n, k]: [usize; 3],
    lhs_view: &View,
    rhs_view: &View,
) -> bool {
    let ops = m * n * k;
    let parallelism = if ops >= GEMM_PARALLEL_OPS {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    let col_major = writes_column_major(m, n, lhs_view);
    let threads = rayon::current_num_threads();
    if ops >= GEMM_PARALLEL_OPS && splits_reduction([m, n, k], lhs_view, threads) {
        split_reduction(out, [m, n, k], [lhs_view, rhs_view], threads, col_major);
    } else {
        gemm_chunked(
            out,
            m,
            n,
            k,
            lhs_view,
            0,
            rhs_view,
            0,
            parallelism,
            col_major,
        );
    }
    col_major
}

/// Whether [`matmul`] shares the `GEMM_MAX_K`-term slices of a product's
/// reduction among `threads` threads ([`split_reduction`]) instead of its
/// rows and columns (gemm's own threads): where `lhs` is a transposed
/// row-major matrix (`gradᵀ @ x`, a weight's gradient), so that `k` runs
/// along the rows (tokens) of both factors, which the kernels before it
/// wrote in parts of consecutive rows, one part per thread. Not where the
/// last slice has one or two terms, which gemm adds to the output one by
/// one rather than as one sum, and not where the slices' own buffers would
/// take more memory than the two factors.
fn splits_reduction([m, n, k]: [usize; 3], lhs: &View, threads: usize) -> bool {
    let slices = k.div_ceil(GEMM_MAX_K);
    let groups = threads.min(slices);
    let own_buffers = slices - slices.div_ceil(groups);
    groups > 1
        && lhs.row_stride == 1
        && lhs.col_stride != 1
        && !matches!(k % GEMM_MAX_K, 1 | 2)
        && own_buffers * m * n <= k * (m + n)
}

/// Slices of a reduction reduced into one output: the first slice, the end
/// of the last one's terms, the output ([`split_reduction`]).
type SliceWork<'a> = (usize, usize, &'a mut [MaybeUninit<f32>]);

/// `out = lhs @ rhs` ([`gemm_chunked`]'s slices of `k`, added in order) with
/// the slices shared among `threads` threads in groups of consecutive ones,
/// the first group on the calling thread. The first group reduces its
/// slices into `out` as `gemm_chunked` would; every later slice is reduced
/// into a buffer of its own, and the buffers are then added to `out` in the
/// order of `k`. The additions are gemm's (`out + slice`, one rounding
/// each) in the same order, so the bits are those of one thread's
/// `gemm_chunked`.
///
/// Why: the two threads of a step each wrote about half of the tokens'
/// rows of `gradᵀ` and `x` (the row-wise kernels split rows that way,
/// the first part on the calling thread), and a group of slices reads only
/// those rows, where gemm's threads split the output and each reads every
/// token. On a host whose two cores share no cache, reading what the
/// other core wrote costs more than twenty times as much as between cores
/// that do (`docs/experiments/speed.md`).
fn split_reduction(
    out: &mut [MaybeUninit<f32>],
    [m, n, k]: [usize; 3],
    [lhs, rhs]: [&View; 2],
    threads: usize,
    col_major: bool,
) {
    let slices = k.div_ceil(GEMM_MAX_K);
    let groups = threads.min(slices);
    let first = slices.div_ceil(groups);
    let mut own: Vec<Vec<MaybeUninit<f32>>> = (first..slices)
        .map(|_| {
            let mut buffer = Vec::with_capacity(m * n);
            // SAFETY: MaybeUninit needs no initialisation; gemm writes
            // every element (its first slice starts from `k = 0`).
            unsafe { buffer.set_len(m * n) };
            buffer
        })
        .collect();
    // Each group's slices in order, as (first slice, end of its terms,
    // output).
    let mut work: Vec<Vec<SliceWork>> = (0..groups).map(|_| Vec::new()).collect();
    work[0].push((0, k.min(first * GEMM_MAX_K), &mut *out));
    for (slice, buffer) in (first..).zip(own.iter_mut()) {
        let end = k.min((slice + 1) * GEMM_MAX_K);
        work[slice * groups / slices].push((slice, end, buffer));
    }
    let none = gemm::Parallelism::None;
    work.into_par_iter().with_max_len(1).for_each(|group| {
        for (slice, end, out) in group {
            let start = slice * GEMM_MAX_K;
            let (l, r) = (
                start as isize * lhs.col_stride,
                start as isize * rhs.row_stride,
            );
            gemm_chunked(out, m, n, end - start, lhs, l, rhs, r, none, col_major);
        }
    });
    let own: Vec<&[f32]> = own
        .iter_mut()
        // SAFETY: gemm wrote every element of each buffer (above).
        .map(|buffer| &*unsafe { crate::written::assume_init_mut(buffer) })
        .collect();
    // SAFETY: the first group's gemm calls wrote every element of `out`.
    let out = unsafe { crate::written::assume_init_mut(out) };
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .enumerate()
        .for_each(|(task, out)| {
            let at = task * ELEMENTS_PER_TASK..task * ELEMENTS_PER_TASK + out.len();
            for slice in &own {
                for (o, &s) in out.iter_mut().zip(&slice[at.clone()]) {
                    *o += s;
                }
            }
        });
}

/// Whether [`matmul`] runs `lhs @ rhs` through a lane-split gemm kernel
/// ([`GemmCall::lane_split`]), whose bits depend on the operands' layout.
pub(super) fn lane_split(lhs: &FlexTensor, rhs: &FlexTensor) -> bool {
    let (ll, rl) = (lhs.layout(), rhs.layout());
    let rank = ll.shape().len();
    GemmCall {
        m: ll.shape()[rank - 2],
        n: rl.shape()[rank - 1],
        k: ll.shape()[rank - 1],
        read_dst: false,
        lhs_cs: ll.strides()[rank - 1],
        lhs_rs: ll.strides()[rank - 2],
        rhs_cs: rl.strides()[rank - 1],
        rhs_rs: rl.strides()[rank - 2],
        parallelism: gemm::Parallelism::None,
        dst_col_major: false,
    }
    .lane_split()
}

/// Whether [`matmul`] copies a transposed right factor (`x Wᵀ`, `W`
/// row-major, `n` its rows) into a row-major `Wᵀ` before calling gemm:
/// where `n <= TRANSPOSE_MAX_COLUMNS` and gemm runs its packed kernels.
/// gemm packs a transposed factor by gathering its columns one value at a
/// time, and with two threads on one block of at most 512 columns both
/// pack all of it; from a row-major copy it packs whole runs, or reads the
/// factor in place. The product keeps its bits: the same packed kernels,
/// one FMA chain per output element in the order of `k`, whatever the
/// factors' strides. Lane-split calls (whose bits depend on the layout),
/// matrix-vector calls and gemm's one- and two-term kernels keep the
/// factors as they are. Measured (`docs/experiments/speed.md`): 1.0-1.2x
/// on the 25m model's projections with 1024 rows, 3-5x with 2 to 8 rows,
/// 1.1-1.8x on `W xᵀ` with 16 to 64 rows (`xᵀ` copied), and slower for LM
/// heads of 2048 columns or more, where the copy no longer fits in the
/// caches.
fn copies_transposed_rhs(lhs: &FlexTensor, rhs: &FlexTensor) -> bool {
    let (ll, rl) = (lhs.layout(), rhs.layout());
    let rank = ll.shape().len();
    let (m, k, n) = (
        ll.shape()[rank - 2],
        ll.shape()[rank - 1],
        rl.shape()[rank - 1],
    );
    let transposed = rl.strides()[rank - 2] == 1 && rl.strides()[rank - 1] >= k as isize;
    transposed
        && m > 1
        && (2..=TRANSPOSE_MAX_COLUMNS).contains(&n)
        && k > 2
        && !lane_split(lhs, rhs)
}

/// Whether [`matmul`] has gemm write `lhs @ rhs` column-major and then
/// transposes it: where `lhs`'s columns are a multiple of 4 KiB apart and
/// the product is tall (`m > `[`NARROW_UNPACKED_COLUMNS`]) and narrow
/// (`n <=` that). gemm computes a row-major product as its transpose, in
/// which `lhs` becomes the right factor, and reads a right factor in place,
/// unpacked, when the (transposed) product has at most twice its kernel's
/// height of rows (128 with AVX-512); so it reads `lhs` a few values from
/// each column, columns 4 KiB apart, all in the same L1 cache set. That is
/// the 1m model's LM head weight gradient (`gradᵀ x`, `grad` 2048 logits
/// wide): 160 GFLOP/s on an Intel Xeon, 240 GFLOP/s with a column-major
/// destination, for which gemm keeps the factors as they are and packs
/// `rhs` (`docs/experiments/speed.md`). The bits are the same: the packed
/// kernels' one FMA chain per output element, whatever the destination's
/// layout (`an_aliased_tall_narrow_product_keeps_its_bits`). Such a call
/// is never lane-split, which needs `lhs`'s rows contiguous.
fn writes_column_major(m: usize, n: usize, lhs: &View) -> bool {
    lhs.col_stride != 1
        && lhs.col_stride % ALIASING_STRIDE == 0
        && m > NARROW_UNPACKED_COLUMNS
        && n <= NARROW_UNPACKED_COLUMNS
}

/// A strided f32 matrix view: the data, the offset of element `[0, .., 0]`,
/// and the strides of its last two dimensions.
pub(super) struct View<'a> {
    data: &'a [f32],
    start: isize,
    row_stride: isize,
    col_stride: isize,
}

impl<'a> View<'a> {
    /// The matrix at `start` of `data` with these strides (in values).
    pub(super) fn strided(
        data: &'a [f32],
        start: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        Self {
            data,
            start: start as isize,
            row_stride,
            col_stride,
        }
    }

    /// Panics, naming `which`, unless the `rows x cols` elements of the view
    /// (strides not negative) lie within its data.
    fn check_reaches(&self, rows: usize, cols: usize, which: &str) {
        let (rs, cs) = (self.row_stride, self.col_stride);
        let last = rows
            .checked_sub(1)
            .zip(cols.checked_sub(1))
            .map(|(r, c)| self.start + r as isize * rs + c as isize * cs);
        assert!(
            self.start >= 0
                && rs >= 0
                && cs >= 0
                && last.is_none_or(|l| (l as usize) < self.data.len()),
            "product: the {which} view ({rows} x {cols}, start {}, strides {rs} and {cs}) reaches past its {} values",
            self.start,
            self.data.len()
        );
    }

    fn new(tensor: &'a FlexTensor, layout: &Layout, rank: usize) -> Self {
        let strides = layout.strides();
        Self {
            data: tensor.storage::<f32>(),
            start: layout.start_offset() as isize,
            row_stride: strides[rank - 2],
            col_stride: strides[rank - 1],
        }
    }
}

/// `out (m x n, row-major) = lhs (m x k) @ rhs (k x n)` on the calling
/// thread, with `k > 0`: the gemm calls [`matmul`] makes for each matrix of
/// a batched product with these shapes and strides, so the same bits. Every
/// element of `out` is written.
pub(super) fn product(out: &mut [MaybeUninit<f32>], [m, n, k]: [usize; 3], lhs: &View, rhs: &View) {
    assert!(
        k > 0 && out.len() == m * n,
        "product: {m} x {k} @ {k} x {n} into {} values",
        out.len()
    );
    lhs.check_reaches(m, k, "lhs");
    rhs.check_reaches(k, n, "rhs");
    let none = gemm::Parallelism::None;
    gemm_chunked(out, m, n, k, lhs, 0, rhs, 0, none, false);
}

/// `out (m x n, row-major, or column-major where `dst_col_major`) =
/// lhs (m x k) @ rhs (k x n)`, in gemm calls of at
/// most [`GEMM_MAX_K`] terms, each added to `out` in order of `k`; the
/// first call overwrites `out` (its prior contents are never read).
#[allow(clippy::too_many_arguments)] // one gemm call's shapes, views and offsets, as gemm takes them
fn gemm_chunked(
    out: &mut [MaybeUninit<f32>],
    m: usize,
    n: usize,
    k: usize,
    lhs: &View,
    lhs_offset: isize,
    rhs: &View,
    rhs_offset: isize,
    parallelism: gemm::Parallelism,
    dst_col_major: bool,
) {
    let mut start = 0;
    while start < k {
        let len = GEMM_MAX_K.min(k - start);
        let l = lhs.start + lhs_offset + start as isize * lhs.col_stride;
        let r = rhs.start + rhs_offset + start as isize * rhs.row_stride;
        let call = GemmCall {
            m,
            n,
            k: len,
            read_dst: start > 0,
            lhs_cs: lhs.col_stride,
            lhs_rs: lhs.row_stride,
            rhs_cs: rhs.col_stride,
            rhs_rs: rhs.row_stride,
            parallelism,
            dst_col_major,
        };
        // SAFETY: the views' offsets and strides come from burn layouts of
        // tensors whose storage holds every element they address, or were
        // checked against their data (`product`); `out` is a dense m x n
        // buffer.
        unsafe {
            call.run(
                out.as_mut_ptr().cast::<f32>(),
                lhs.data.as_ptr().offset(l),
                rhs.data.as_ptr().offset(r),
            );
        }
        start += len;
    }
}

/// One call of gemm on a row-major `m x n` destination, `lhs` and `rhs` as
/// strided matrices (column, row strides), `alpha = beta = 1`.
#[derive(Debug, Clone, Copy)]
struct GemmCall {
    m: usize,
    n: usize,
    k: usize,
    read_dst: bool,
    lhs_cs: isize,
    lhs_rs: isize,
    rhs_cs: isize,
    rhs_rs: isize,
    parallelism: gemm::Parallelism,
    /// Write `dst` column-major (`m x n`, column stride `m`) instead of
    /// row-major.
    dst_col_major: bool,
}

impl GemmCall {
    /// Whether gemm may reduce this call with a lane-split kernel (dot
    /// products over `k` kept in SIMD lanes and added across lanes at the
    /// end: its "horizontal" kernels for at most 256 outputs, and its
    /// row-major matrix-vector kernel for one row or column), whose bits
    /// depend on the vector width. Both need `lhs`'s rows and `rhs`'s
    /// columns contiguous. Every other kernel of gemm's is a chain of
    /// fused multiply-adds per output element in the order of `k`, the same
    /// bits at any width.
    fn lane_split(&self) -> bool {
        self.lhs_cs == 1
            && self.rhs_rs == 1
            && (self.m * self.n <= 16 * 16 || self.m <= 1 || self.n <= 1)
    }

    /// `dst (+)= lhs @ rhs`. Lane-split calls run gemm's AVX2 kernels
    /// (eight lanes) on every CPU that has AVX2 and FMA, also where gemm
    /// itself would pick its AVX-512 kernels (sixteen lanes), so that the
    /// bits are the same on both; the rest go to gemm's fastest kernels.
    /// Off x86-64, the calls whose kernels there would sum in another order
    /// follow x86-64's order as written out in `order.rs`.
    ///
    /// # Safety
    /// `dst`, `lhs` and `rhs` must address every element their shapes and
    /// strides reach; `dst` is dense (row-major, or column-major where
    /// `dst_col_major`).
    unsafe fn run(&self, dst: *mut f32, lhs: *const f32, rhs: *const f32) {
        #[cfg(target_arch = "x86_64")]
        if self.lane_split() {
            debug_assert!(!self.dst_col_major, "lane-split calls write row-major");
            if let Some(simd) = gemm_common::simd::V3::try_new() {
                // SAFETY: as for `run`; AVX2 and FMA are present (`V3`).
                unsafe { run_avx2(simd, &self.frame(dst, lhs, rhs), self.parallelism) };
                return;
            }
        }
        // SAFETY: as for `run` (`k > 0`: gemm_chunked's slices are never
        // empty). On x86-64 gemm's own kernels are that order.
        if !cfg!(target_arch = "x86_64") && unsafe { order::reduce(&self.frame(dst, lhs, rhs)) } {
            return;
        }
        let (dst_cs, dst_rs) = self.dst_strides();
        // SAFETY: as for `run`.
        unsafe {
            gemm::gemm(
                self.m,
                self.n,
                self.k,
                dst,
                dst_cs,
                dst_rs,
                self.read_dst,
                lhs,
                self.lhs_cs,
                self.lhs_rs,
                rhs,
                self.rhs_cs,
                self.rhs_rs,
                1.0,
                1.0,
                false,
                false,
                false,
                self.parallelism,
            );
        }
    }

    /// The destination's column and row strides.
    fn dst_strides(&self) -> (isize, isize) {
        if self.dst_col_major {
            (self.m as isize, 1)
        } else {
            (1, self.n as isize)
        }
    }

    /// The call at these pointers as gemm's driver sees it: transposed
    /// where the destination's columns are closer together than its rows
    /// (gemm makes the destination column-major first).
    fn frame(&self, dst: *mut f32, lhs: *const f32, rhs: *const f32) -> order::Frame {
        let (dst_cs, dst_rs) = self.dst_strides();
        let call = order::Frame {
            m: self.m,
            n: self.n,
            k: self.k,
            read_dst: self.read_dst,
            dst,
            dst_cs,
            dst_rs,
            lhs,
            lhs_cs: self.lhs_cs,
            lhs_rs: self.lhs_rs,
            rhs,
            rhs_cs: self.rhs_cs,
            rhs_rs: self.rhs_rs,
        };
        if dst_cs.abs() < dst_rs.abs() {
            order::Frame {
                m: call.n,
                n: call.m,
                dst_cs: call.dst_rs,
                dst_rs: call.dst_cs,
                lhs: call.rhs,
                lhs_cs: call.rhs_rs,
                lhs_rs: call.rhs_cs,
                rhs: call.lhs,
                rhs_cs: call.lhs_rs,
                rhs_rs: call.lhs_cs,
                ..call
            }
        } else {
            call
        }
    }
}

/// `frame` through gemm's generic driver with its AVX2 kernels, as
/// `gemm::gemm` runs it on a CPU whose best kernels are AVX2's.
///
/// # Safety
/// As for [`GemmCall::run`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_avx2(simd: gemm_common::simd::V3, f: &order::Frame, parallelism: gemm::Parallelism) {
    use gemm_f32::microkernel::fma::f32::{H_M, H_N, H_UKR, MR_DIV_N, NR, UKR};
    /// f32 lanes of an AVX2 register.
    const LANES_AVX2: usize = 8;
    // SAFETY: as for `run`.
    unsafe {
        gemm_common::gemm::gemm_basic_generic::<
            _,
            f32,
            LANES_AVX2,
            { MR_DIV_N * LANES_AVX2 },
            NR,
            MR_DIV_N,
            H_M,
            H_N,
        >(
            simd,
            f.m,
            f.n,
            f.k,
            f.dst,
            f.dst_cs,
            f.dst_rs,
            f.read_dst,
            f.lhs,
            f.lhs_cs,
            f.lhs_rs,
            f.rhs,
            f.rhs_cs,
            f.rhs_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            |a, b, c| a * b + c,
            &UKR,
            &H_UKR,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flex::tests::{bits, seeded, t, B};
    use crate::ModelBackend;
    use burn::prelude::*;
    use burn::tensor::ops::FloatTensorOps;
    use proptest::prelude::*;

    /// Which of gemm's kernels (x86-64 with FMA, gemm 0.19, at AVX2's width)
    /// reduces a product of shape `m x k @ k x n`: the contract's order,
    /// which other CPUs follow through `order.rs`.
    #[derive(Clone, Copy)]
    enum Path {
        /// The packed kernel: one FMA chain along `k` from zero, added to the
        /// output. A slice of at most two terms goes to gemm's `gevv`
        /// instead, which adds each rounded product to the output in turn
        /// (no fused multiply-add).
        Packed,
        /// Row-major lhs, column-major rhs and `m * n <= 256`: eight lanes of
        /// FMA chains (term `p` on lane `p % 8`), folded as
        /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, added to the output.
        Horizontal,
        /// Row-major lhs, column-major rhs, one row or one column and more
        /// than 256 outputs (the matrix-vector kernel): eight accumulators
        /// of eight lanes over blocks of 64 terms, added pairwise, then
        /// whole blocks of 8 terms into the one left, its lanes added in
        /// order, the last terms chained on; `out + sum` after the first slice.
        /// A slice of at most two terms goes to `gevv`, as for `Packed`.
        RowVector,
        /// One output row times a row-major rhs, or one output column of a
        /// column-major lhs (gemm's column-major matrix-vector kernel): one
        /// chain per output, its first term a rounded product, then fused
        /// multiply-adds, continuing from the output after the first slice.
        /// A slice of at most two terms goes to `gevv`, as for `Packed`.
        ColumnChain,
    }

    /// [`Path::RowVector`]'s dot product of one slice.
    fn row_vector_dot(terms: &[(f32, f32)]) -> f32 {
        let k = terms.len();
        let mut acc = [[0.0f32; 8]; 8];
        let mut depth = 0;
        while depth < k / 64 * 64 {
            for (u, lanes) in acc.iter_mut().enumerate() {
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let (x, y) = terms[depth + u * 8 + l];
                    *lane = x.mul_add(y, *lane);
                }
            }
            depth += 64;
        }
        let add = |a: [f32; 8], b: [f32; 8]| std::array::from_fn::<f32, 8, _>(|l| a[l] + b[l]);
        let (a01, a23) = (add(acc[0], acc[1]), add(acc[2], acc[3]));
        let (a45, a67) = (add(acc[4], acc[5]), add(acc[6], acc[7]));
        let mut lanes = add(add(a01, a23), add(a45, a67));
        while depth < k / 8 * 8 {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let (x, y) = terms[depth + l];
                *lane = x.mul_add(y, *lane);
            }
            depth += 8;
        }
        let mut total = lanes[1..].iter().fold(lanes[0], |acc, &l| acc + l);
        for &(x, y) in &terms[depth..] {
            total = x.mul_add(y, total);
        }
        total
    }

    /// The reference for [`Path`]: each output element reduced by the
    /// path's kernel, restarted every [`GEMM_MAX_K`] terms, the slices added
    /// in order.
    fn reference_on(path: Path, a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let term = |p: usize| (a[i * k + p], b[p * n + j]);
                let mut total = 0.0f32;
                for start in (0..k).step_by(GEMM_MAX_K) {
                    let slice = start..k.min(start + GEMM_MAX_K);
                    total = match path {
                        Path::Packed | Path::RowVector | Path::ColumnChain if slice.len() <= 2 => {
                            let mut terms = slice.map(|p| term(p).0 * term(p).1);
                            let first = terms.next().expect("a slice is never empty");
                            let acc = if start == 0 { first } else { first + total };
                            terms.fold(acc, |acc, product| product + acc)
                        }
                        Path::Packed => {
                            let chain = slice
                                .map(term)
                                .fold(0.0f32, |acc, (x, y)| x.mul_add(y, acc));
                            if start == 0 {
                                chain
                            } else {
                                total + chain
                            }
                        }
                        Path::ColumnChain => {
                            let mut terms = slice.map(term);
                            let (x, y) = terms.next().expect("a slice is never empty");
                            let first = if start == 0 {
                                x * y
                            } else {
                                x.mul_add(y, total)
                            };
                            terms.fold(first, |acc, (x, y)| x.mul_add(y, acc))
                        }
                        Path::RowVector => {
                            let terms: Vec<(f32, f32)> = slice.map(term).collect();
                            let dot = row_vector_dot(&terms);
                            if start == 0 {
                                dot
                            } else {
                                dot + total
                            }
                        }
                        Path::Horizontal => {
                            let mut l = [0.0f32; 8];
                            for (q, p) in slice.enumerate() {
                                let (x, y) = term(p);
                                l[q % 8] = x.mul_add(y, l[q % 8]);
                            }
                            let chain =
                                ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
                            if start == 0 {
                                chain
                            } else {
                                total + chain
                            }
                        }
                    };
                }
                out[i * n + j] = total;
            }
        }
        out
    }

    fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        reference_on(Path::Packed, a, b, m, k, n)
    }

    /// A `[rows, cols]` tensor read through a transposed (column-major) view
    /// of the same values.
    fn column_major(values: Vec<f32>, rows: usize, cols: usize) -> Tensor<B, 2> {
        let stored = t(values, [rows, cols]).transpose().into_data();
        Tensor::<B, 2>::from_data(stored, &Default::default()).transpose()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// A product is the reference of gemm's kernel for its layout, bit
        /// for bit: with `k` cut at 512 it cannot depend on the CPU's caches
        /// or thread count. (The shapes include slices of one or two terms,
        /// which gemm reduces differently.)
        #[test]
        fn matmul_is_the_fma_chain_reference(
            m in 2usize..40,
            k in prop_oneof![1usize..1300, 511usize..515, 1023usize..1027],
            n in 2usize..40,
            seed in 0u64..1000
        ) {
            let (a, b) = (seeded(&[m, k], seed), seeded(&[k, n], seed + 1));
            let bits_of = |v: Vec<f32>| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            let packed = bits_of(reference_on(Path::Packed, &a, &b, m, k, n));
            let got = crate::matmul(t(a.clone(), [m, k]), t(b.clone(), [k, n]));
            prop_assert_eq!(bits(got), packed.clone());
            // Both operands read through transposed (strided) views.
            let got = crate::matmul(column_major(a.clone(), m, k), column_major(b.clone(), k, n));
            prop_assert_eq!(bits(got), packed.clone());
            // A row-major lhs times a column-major rhs (`x @ w^T`).
            let got = crate::matmul(t(a.clone(), [m, k]), column_major(b.clone(), k, n));
            let want = if m * n <= 256 {
                bits_of(reference_on(Path::Horizontal, &a, &b, m, k, n))
            } else {
                packed
            };
            prop_assert_eq!(bits(got), want);
        }

        /// At most eight output columns (`W xᵀ` in decoding): the narrow
        /// kernel, where it runs, has the bits of gemm's packed kernels.
        #[test]
        fn a_narrow_product_is_the_fma_chain_reference(
            m in prop_oneof![2usize..20, 200usize..300],
            k in prop_oneof![3usize..600, 511usize..516, 1024usize..1027],
            n in 1usize..=8,
            seed in 0u64..1000
        ) {
            let (a, b) = (seeded(&[m, k], seed), seeded(&[k, n], seed + 1));
            let bits_of = |v: Vec<f32>| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            let packed = bits_of(reference_on(Path::Packed, &a, &b, m, k, n));
            // `xᵀ` read through a view, as decoding reads it: gemm's
            // lane-split kernels where they apply, else the narrow kernel.
            let path = if m * n <= 256 {
                Path::Horizontal
            } else if n == 1 {
                Path::RowVector
            } else {
                Path::Packed
            };
            let want = bits_of(reference_on(path, &a, &b, m, k, n));
            let got = crate::matmul(t(a.clone(), [m, k]), column_major(b.clone(), k, n));
            prop_assert_eq!(bits(got), want.clone());
            // A row-major `rhs` (one column is laid out as a column-major one).
            let got = crate::matmul(t(a, [m, k]), t(b, [k, n]));
            prop_assert_eq!(bits(got), if n == 1 { want } else { packed });
        }

        /// The gradient of `x @ Wᵀ` for `Wᵀ`, computed in `Wᵀ`'s own layout
        /// (`(gradᵀ @ x)ᵀ`), has the bits of `xᵀ @ grad`, and reaches `W`
        /// contiguous where that order is taken (not lane-split).
        #[test]
        fn a_transposed_operands_gradient_keeps_its_bits(
            rows in prop_oneof![1usize..80, 500usize..1100],
            d_in in 1usize..40,
            d_out in 1usize..40,
            seed in 0u64..1000
        ) {
            let x = t(seeded(&[rows, d_in], seed), [rows, d_in]).into_primitive().tensor();
            let g = t(seeded(&[rows, d_out], seed + 1), [rows, d_out]).into_primitive().tensor();
            let w_t = column_major(seeded(&[d_in, d_out], seed + 2), d_in, d_out)
                .into_primitive()
                .tensor();
            prop_assert_eq!(B::is_transposed(&w_t), d_in > 1 && d_out > 1);
            let want = B::matmul(B::float_transpose(x.clone()), g.clone());
            let got = B::matmul_rhs_grad(x, g, B::is_transposed(&w_t));
            let as_tensor =
                |p| Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(p));
            let w_grad = B::float_transpose(got.clone());
            if d_in * d_out > 256 {
                prop_assert_eq!(w_grad.layout().strides(), &[d_in as isize, 1][..]);
            }
            prop_assert_eq!(bits(as_tensor(got)), bits(as_tensor(want)));
        }

        /// One row or one column. Times a column-major rhs (`x @ w^T`, as
        /// in decoding one sequence): gemm's eight-lane kernels on every CPU
        /// with AVX2, also where gemm would pick its sixteen-lane AVX-512
        /// ones. One row times a row-major rhs (`x W`), or one column of a
        /// column-major lhs (`gradᵀ g`): gemm's column-major matrix-vector
        /// kernel, fused on x86-64 and unfused on ARM (so `order.rs`
        /// there), except that at most eight columns of one row go to the
        /// narrow kernel, in the packed order.
        #[test]
        fn a_row_or_column_product_is_its_kernels_reference(
            long in 2usize..600,
            k in prop_oneof![1usize..200, 500usize..1100],
            row in proptest::bool::ANY,
            seed in 0u64..1000
        ) {
            let (m, n) = if row { (1, long) } else { (long, 1) };
            let (a, b) = (seeded(&[m, k], seed), seeded(&[k, n], seed + 1));
            let bits_of = |v: Vec<f32>| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            let path = if m * n <= 256 { Path::Horizontal } else { Path::RowVector };
            let want = bits_of(reference_on(path, &a, &b, m, k, n));
            let got = crate::matmul(t(a.clone(), [m, k]), column_major(b.clone(), k, n));
            prop_assert_eq!(bits(got), want);
            let path = if row && n <= narrow::MAX_COLUMNS { Path::Packed } else { Path::ColumnChain };
            let want = bits_of(reference_on(path, &a, &b, m, k, n));
            let lhs = if row { t(a, [m, k]) } else { column_major(a, m, k) };
            let got = crate::matmul(lhs, t(b, [k, n]));
            prop_assert_eq!(bits(got), want);
        }
    }

    /// On x86-64, `order.rs`'s written order is gemm's own, call for call:
    /// every layout of one gemm call (each factor row- or column-major, the
    /// output row- or column-major, read or not) over shapes that reach each
    /// kernel it writes out. (Elsewhere `GemmCall::run` is `order.rs` for
    /// those calls, and the references above check it.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_written_order_is_gemms_on_x86_64() {
        use super::order::{reduce, Kernel};
        let mut reached = std::collections::BTreeSet::new();
        let sides = [1usize, 2, 3, 17, 300];
        let grid = sides.iter().flat_map(|&m| {
            let ks = [3, 9, 64, 71, 200, 512];
            sides.iter().flat_map(move |&n| ks.map(|k| (m, n, k)))
        });
        for (m, n, k) in grid {
            let (a, b) = (
                seeded(&[m * k], (m * n + k) as u64),
                seeded(&[k * n], k as u64),
            );
            let init = seeded(&[m * n], 3);
            for layout in 0..16u8 {
                let [lhs_row, rhs_row, dst_row, read_dst] =
                    [1, 2, 4, 8].map(|bit| layout & bit != 0);
                let (lhs_cs, lhs_rs) = if lhs_row {
                    (1, k as isize)
                } else {
                    (m as isize, 1)
                };
                let (rhs_cs, rhs_rs) = if rhs_row {
                    (1, n as isize)
                } else {
                    (k as isize, 1)
                };
                let call = GemmCall {
                    m,
                    n,
                    k,
                    read_dst,
                    lhs_cs,
                    lhs_rs,
                    rhs_cs,
                    rhs_rs,
                    parallelism: gemm::Parallelism::None,
                    dst_col_major: !dst_row,
                };
                if call.lane_split() && !dst_row {
                    continue; // never made: lane-split calls write row-major
                }
                let (mut by_gemm, mut written) = (init.clone(), init.clone());
                // SAFETY: every buffer holds its matrix in the strides given.
                unsafe { call.run(by_gemm.as_mut_ptr(), a.as_ptr(), b.as_ptr()) };
                let frame = call.frame(written.as_mut_ptr(), a.as_ptr(), b.as_ptr());
                // SAFETY: as above.
                if unsafe { reduce(&frame) } {
                    reached.insert(format!("{:?}", Kernel::of(&frame)));
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&written), bits(&by_gemm), "{call:?}");
                }
            }
        }
        let kernels: Vec<&str> = reached.iter().map(String::as_str).collect();
        assert_eq!(
            kernels,
            [
                "ColumnChain { transposed: false }",
                "ColumnChain { transposed: true }",
                "Horizontal",
                "RowVector"
            ]
        );
    }

    /// A tall, narrow product whose left factor's columns are 4 KiB apart
    /// (the 1m LM head's weight gradient, `gradᵀ x`), written column-major
    /// by gemm and transposed ([`writes_column_major`]), and its neighbours
    /// on either side of the rule: the packed kernels' bits every way.
    #[test]
    fn an_aliased_tall_narrow_product_keeps_its_bits() {
        let k = 600;
        for (m, n, column_major_written) in [
            (ALIASING_STRIDE as usize, 24, true),
            (ALIASING_STRIDE as usize, NARROW_UNPACKED_COLUMNS, true),
            (ALIASING_STRIDE as usize, NARROW_UNPACKED_COLUMNS + 1, false),
            (ALIASING_STRIDE as usize - 8, 24, false),
            (NARROW_UNPACKED_COLUMNS, 24, false),
        ] {
            let (a, b) = (seeded(&[m, k], 5), seeded(&[k, n], 6));
            // `lhs` as `gradᵀ`: a transposed view of a row-major [k, m].
            let lhs = column_major(a.clone(), m, k);
            let primitive = lhs.clone().into_primitive().tensor();
            let view = View::new(&primitive, primitive.layout(), 2);
            assert_eq!(
                writes_column_major(m, n, &view),
                column_major_written,
                "{m} x {n}"
            );
            let got = crate::matmul(lhs, t(b.clone(), [k, n]));
            let want: Vec<u32> = reference(&a, &b, m, k, n)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(bits(got), want, "{m} x {k} x {n}");
        }
    }

    /// A weight's gradient (`gradᵀ @ x`) large enough for threads, on one
    /// thread and on two: its reduction's slices shared between the two
    /// ([`split_reduction`]: two, three and four slices, a last slice of
    /// three terms, a column-major output) or not (a last slice of two
    /// terms, which gemm adds to the output one at a time), the FMA chain
    /// reference's bits every time.
    #[test]
    fn a_reduction_shared_between_threads_keeps_its_bits() {
        let pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool")
        };
        let (one, two) = (pool(1), pool(2));
        for (m, n, k, shared) in [
            (96, 80, 1024, true),
            (72, 80, 1536, true),
            (64, 60, 2048, true),
            (96, 80, 1027, true),
            (96, 80, 1026, false),
            (ALIASING_STRIDE as usize, 24, 1024, true),
        ] {
            assert!(
                m * n * k >= GEMM_PARALLEL_OPS,
                "{m} x {k} x {n} is threaded"
            );
            let (a, b) = (seeded(&[m, k], 7), seeded(&[k, n], 8));
            let lhs = column_major(a.clone(), m, k);
            let primitive = lhs.clone().into_primitive().tensor();
            let view = View::new(&primitive, primitive.layout(), 2);
            assert_eq!(
                splits_reduction([m, n, k], &view, 2),
                shared,
                "{m} x {k} x {n}"
            );
            let want: Vec<u32> = reference(&a, &b, m, k, n)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            for pool in [&one, &two] {
                let got = pool.install(|| crate::matmul(lhs.clone(), t(b.clone(), [k, n])));
                assert_eq!(bits(got), want, "{m} x {k} x {n}");
            }
        }
    }

    /// `x Wᵀ` on either side of [`TRANSPOSE_MAX_COLUMNS`] (a row-major copy
    /// of `Wᵀ` below, the view above), over a `k` of two gemm calls: the
    /// packed kernels' bits either way.
    #[test]
    fn a_transposed_weight_copied_or_not_gives_the_packed_bits() {
        let (m, k) = (5, 600);
        for n in [TRANSPOSE_MAX_COLUMNS - 1, TRANSPOSE_MAX_COLUMNS + 1] {
            let (a, b) = (seeded(&[m, k], 3), seeded(&[k, n], 4));
            let (x, w_t) = (t(a.clone(), [m, k]), column_major(b.clone(), k, n));
            let primitive = |x: &Tensor<B, 2>| x.clone().into_primitive().tensor();
            let copied = copies_transposed_rhs(&primitive(&x), &primitive(&w_t));
            assert_eq!(copied, n <= TRANSPOSE_MAX_COLUMNS, "n = {n}");
            let got = crate::matmul(x, w_t);
            let want: Vec<u32> = reference(&a, &b, m, k, n)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(bits(got), want, "n = {n}");
        }
    }

    #[test]
    #[should_panic(expected = "reaches past its 6 values")]
    fn a_product_refuses_a_view_past_its_data() {
        let data = [1.0f32; 6];
        let mut out = [MaybeUninit::new(0.0f32); 4];
        // 2 x 3 rows of stride 3 fit; 2 x 4 with columns 1 apart do not.
        let (fits, past) = (View::strided(&data, 0, 3, 1), View::strided(&data, 0, 3, 1));
        product(&mut out, [2, 2, 3], &fits, &View::strided(&data, 0, 2, 1));
        product(
            &mut out[..2],
            [2, 1, 4],
            &past,
            &View::strided(&data, 0, 1, 1),
        );
    }

    #[test]
    fn batched_matmul_multiplies_each_batch() {
        let (a, b) = (seeded(&[3, 2, 4, 700], 1), seeded(&[3, 2, 700, 5], 2));
        let got = crate::matmul(t(a.clone(), [3, 2, 4, 700]), t(b.clone(), [3, 2, 700, 5]));
        let got = got.into_data().to_vec::<f32>().unwrap();
        for batch in 0..6 {
            let want = reference(
                &a[batch * 2800..(batch + 1) * 2800],
                &b[batch * 3500..(batch + 1) * 3500],
                4,
                700,
                5,
            );
            assert_eq!(&got[batch * 20..(batch + 1) * 20], &want[..]);
        }
    }

    #[test]
    #[should_panic(expected = "do not multiply")]
    fn matmul_refuses_broadcasting() {
        crate::matmul(
            t(seeded(&[2, 3, 4], 0), [2, 3, 4]),
            t(seeded(&[1, 4, 5], 0), [1, 4, 5]),
        );
    }
}
