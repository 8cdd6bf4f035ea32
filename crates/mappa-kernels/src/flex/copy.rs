//! Strided f32 views (permuted, transposed, sliced) laid out as contiguous
//! buffers. burn-flex copies layouts that do not fold into two dimensions
//! one element at a time through its strided iterator; attention's
//! `[batch, heads, seq, head_dim]` permutations are such layouts, but their
//! last dimension is contiguous, so they are copied here a row at a time.
//! Rows are copied in parallel, a task's rows at a time. Transposed
//! matrices (a row-major matrix's transpose, e.g. `Wᵀ`) are copied in square
//! tiles, which burn-flex's element-wise copy does at about 1.5 GB/s. A copy
//! moves values without arithmetic: the bits are those of the view.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, TensorMetadata};

use super::{fresh, ELEMENTS_PER_TASK};

/// The most dimensions the row copy handles (burn's tensors have at most 8).
const MAX_RANK: usize = 8;

/// The side of the square tiles a transpose is copied in: a tile's source
/// rows are 64-byte cache lines, its destination rows too.
const TILE: usize = 16;

/// `x` (f32) as a tensor that owns a contiguous buffer of exactly its
/// elements, in row-major order of its shape; `x` itself when it already is.
pub(super) fn to_contiguous(x: &FlexTensor) -> FlexTensor {
    let layout = x.layout();
    let n = layout.num_elements();
    let whole = x.bytes().len() == n * std::mem::size_of::<f32>();
    if x.is_contiguous() && layout.start_offset() == 0 && whole {
        return x.clone();
    }
    let (shape, strides) = match folded(layout.shape(), layout.strides()) {
        Some(folded) => folded,
        None => return x.to_contiguous(),
    };
    let rank = shape.len();
    if rank == 2 && strides[0] == 1 && strides[1] >= shape[0] as isize {
        return transposed(x, [shape[0], shape[1]], strides[1] as usize);
    }
    // One dimension, or another layout whose inner dimension is not
    // contiguous: burn-flex's own copy.
    if rank <= 2 || strides[rank - 1] != 1 {
        return x.to_contiguous();
    }
    let (src, start) = (x.storage::<f32>(), layout.start_offset() as isize);
    let run = shape[rank - 1];
    // Whole rows per task, about `ELEMENTS_PER_TASK` elements each.
    let rows_per_task = (ELEMENTS_PER_TASK / run).max(1);
    let chunk = rows_per_task * run;
    let (shape, strides) = (&shape, &strides);
    let dst = fresh::copied(n, chunk, |first| {
        // Odometer over the outer dimensions, from the task's first row;
        // `at` is the source offset of the current row.
        let mut index = [0usize; MAX_RANK];
        let (mut at, mut row) = (start, first / run);
        for d in (0..rank - 1).rev() {
            index[d] = row % shape[d];
            row /= shape[d];
            at += index[d] as isize * strides[d];
        }
        let rows = chunk.min(n - first) / run;
        (0..rows).map(move |_| {
            let from = at as usize;
            for d in (0..rank - 1).rev() {
                index[d] += 1;
                at += strides[d];
                if index[d] < shape[d] {
                    break;
                }
                at -= strides[d] * shape[d] as isize;
                index[d] = 0;
            }
            &src[from..from + run]
        })
    });
    FlexTensor::new(
        Bytes::from_elems(dst),
        Layout::contiguous(x.shape()),
        DType::F32,
    )
}

/// `x`, whose folded layout is `[rows, cols]` with strides `[1, stride]`
/// (the transpose of a row-major `[cols, rows]` matrix), as a contiguous
/// row-major buffer.
fn transposed(x: &FlexTensor, [rows, cols]: [usize; 2], stride: usize) -> FlexTensor {
    let src = &x.storage::<f32>()[x.layout().start_offset()..];
    let dst = transpose(src, [rows, cols], stride, cols);
    FlexTensor::new(
        Bytes::from_elems(dst),
        Layout::contiguous(x.shape()),
        DType::F32,
    )
}

/// The `[rows, cols]` matrix whose element `[r, c]` is `src[r + c * stride]`
/// (the transpose of a row-major `[cols, rows]` matrix with row stride
/// `stride`), written row-major with row stride `out_stride >= cols`; the
/// `out_stride - cols` values after each row are zeros. Tasks take whole
/// bands of [`TILE`] rows and copy them a tile at a time: a tile reads
/// [`TILE`] source rows of [`TILE`] contiguous values and writes [`TILE`]
/// destination rows.
pub(super) fn transpose(
    src: &[f32],
    [rows, cols]: [usize; 2],
    stride: usize,
    out_stride: usize,
) -> Vec<f32> {
    assert!(
        out_stride >= cols,
        "transpose: row stride {out_stride} < {cols} columns"
    );
    let bands = (ELEMENTS_PER_TASK / (TILE * out_stride).max(1)).max(1);
    let chunk = bands * TILE * out_stride;
    let simd = blocks::available();
    let fill = |first: usize, out: &mut [std::mem::MaybeUninit<f32>]| {
        let (row_0, band_rows) = (first / out_stride, out.len() / out_stride);
        for col_0 in (0..cols).step_by(TILE) {
            let tile_cols = TILE.min(cols - col_0);
            for r in (0..band_rows).step_by(TILE) {
                let tile_rows = TILE.min(band_rows - r);
                if simd && tile_rows == TILE && tile_cols == TILE {
                    for (dr, dc) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
                        let from = (col_0 + dc) * stride + row_0 + r + dr;
                        let to = (r + dr) * out_stride + col_0 + dc;
                        // SAFETY: the kernel is available; the block's 8 source
                        // runs of 8 (columns `col_0 + dc ..`, rows from
                        // `row_0 + r + dr`) lie within `src`, and its 8
                        // destination runs within this band's `out`.
                        unsafe {
                            blocks::transpose_8x8(&src[from..], stride, &mut out[to..], out_stride)
                        };
                    }
                    continue;
                }
                for c in col_0..col_0 + tile_cols {
                    let from = c * stride + row_0 + r;
                    for (i, &v) in src[from..from + tile_rows].iter().enumerate() {
                        out[(r + i) * out_stride + c].write(v);
                    }
                }
            }
        }
        for row in out.chunks_mut(out_stride) {
            row[cols..].fill(std::mem::MaybeUninit::new(0.0));
        }
    };
    // SAFETY: each task's bands cover its chunk: every row of it, every
    // column and the padding of each row.
    unsafe { fresh::written(rows * out_stride, chunk, fill) }
}

/// An 8 x 8 block transposed in vector registers, for the tiles of
/// [`transpose`]: AVX on x86-64, NEON on 64-bit ARM. The values are moved,
/// with no arithmetic, so the bits are the scalar copy's.
mod blocks {
    #[cfg(target_arch = "x86_64")]
    pub(super) use avx::transpose_8x8;
    #[cfg(target_arch = "aarch64")]
    pub(super) use neon::transpose_8x8;

    /// Whether this CPU has the registers: AVX on x86-64; NEON, part of
    /// 64-bit ARM's base instruction set.
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx")
        }
        #[cfg(target_arch = "aarch64")]
        {
            true
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            false
        }
    }

    /// Panics unless `src` and `dst` hold an 8 x 8 block at these strides.
    fn check_block(src: usize, src_stride: usize, dst: usize, dst_stride: usize) {
        assert!(
            src >= 7 * src_stride + 8 && dst >= 7 * dst_stride + 8,
            "an 8 x 8 block past its slices"
        );
    }

    #[cfg(target_arch = "x86_64")]
    mod avx {
        use std::mem::MaybeUninit;

        /// `dst[i * dst_stride + j] = src[j * src_stride + i]` for `i, j < 8`.
        ///
        /// # Safety
        /// The CPU has AVX ([`super::available`]); `src` holds
        /// `7 * src_stride + 8` values and `dst` `7 * dst_stride + 8`.
        #[target_feature(enable = "avx")]
        pub(in super::super) unsafe fn transpose_8x8(
            src: &[f32],
            src_stride: usize,
            dst: &mut [MaybeUninit<f32>],
            dst_stride: usize,
        ) {
            use std::arch::x86_64::*;
            super::check_block(src.len(), src_stride, dst.len(), dst_stride);
            let (src, dst) = (src.as_ptr(), dst.as_mut_ptr().cast::<f32>());
            // SAFETY: every run of 8 is within the slices (asserted above).
            unsafe {
                let v: [__m256; 8] =
                    std::array::from_fn(|j| _mm256_loadu_ps(src.add(j * src_stride)));
                // Pairs of rows interleaved, then pairs of pairs, then halves.
                let t: [__m256; 8] = std::array::from_fn(|i| {
                    let (a, b) = (v[i / 2 * 2], v[i / 2 * 2 + 1]);
                    if i % 2 == 0 {
                        _mm256_unpacklo_ps(a, b)
                    } else {
                        _mm256_unpackhi_ps(a, b)
                    }
                });
                let s: [__m256; 8] = std::array::from_fn(|i| {
                    let (a, b) = (t[i / 4 * 4 + i % 4 / 2], t[i / 4 * 4 + i % 4 / 2 + 2]);
                    if i % 2 == 0 {
                        _mm256_shuffle_ps::<0x44>(a, b)
                    } else {
                        _mm256_shuffle_ps::<0xEE>(a, b)
                    }
                });
                for i in 0..4 {
                    let low = _mm256_permute2f128_ps::<0x20>(s[i], s[i + 4]);
                    let high = _mm256_permute2f128_ps::<0x31>(s[i], s[i + 4]);
                    _mm256_storeu_ps(dst.add(i * dst_stride), low);
                    _mm256_storeu_ps(dst.add((i + 4) * dst_stride), high);
                }
            }
        }
    }

    #[cfg(target_arch = "aarch64")]
    mod neon {
        use std::arch::aarch64::*;
        use std::mem::MaybeUninit;

        /// `dst[i * dst_stride + j] = src[j * src_stride + i]` for `i, j < 8`,
        /// as four 4 x 4 blocks, each transposed in four NEON registers.
        ///
        /// # Safety
        /// `src` holds `7 * src_stride + 8` values and `dst`
        /// `7 * dst_stride + 8`.
        pub(in super::super) unsafe fn transpose_8x8(
            src: &[f32],
            src_stride: usize,
            dst: &mut [MaybeUninit<f32>],
            dst_stride: usize,
        ) {
            super::check_block(src.len(), src_stride, dst.len(), dst_stride);
            let (src, dst) = (src.as_ptr(), dst.as_mut_ptr().cast::<f32>());
            for (bj, bi) in [(0, 0), (0, 4), (4, 0), (4, 4)] {
                // SAFETY: every run of 4 is within the slices (asserted
                // above); NEON is part of aarch64's base set.
                unsafe {
                    let r: [float32x4_t; 4] =
                        std::array::from_fn(|j| vld1q_f32(src.add((bj + j) * src_stride + bi)));
                    // Pairs of rows interleaved, then pairs of pairs.
                    let (t0, t1) = (vtrn1q_f32(r[0], r[1]), vtrn2q_f32(r[0], r[1]));
                    let (t2, t3) = (vtrn1q_f32(r[2], r[3]), vtrn2q_f32(r[2], r[3]));
                    let wide = |v: float32x4_t| vreinterpretq_f64_f32(v);
                    let columns = [
                        vtrn1q_f64(wide(t0), wide(t2)),
                        vtrn1q_f64(wide(t1), wide(t3)),
                        vtrn2q_f64(wide(t0), wide(t2)),
                        vtrn2q_f64(wide(t1), wide(t3)),
                    ];
                    for (i, column) in columns.into_iter().enumerate() {
                        vst1q_f32(
                            dst.add((bi + i) * dst_stride + bj),
                            vreinterpretq_f32_f64(column),
                        );
                    }
                }
            }
        }
    }
}

/// The layout with size-1 dimensions dropped and neighbours that form one
/// run through memory merged; none when a stride is negative or the rank is
/// too large for the row copy.
fn folded(shape: &[usize], strides: &[isize]) -> Option<(Vec<usize>, Vec<isize>)> {
    if shape.len() > MAX_RANK || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let (mut dims, mut steps): (Vec<usize>, Vec<isize>) = (Vec::new(), Vec::new());
    for (&size, &stride) in shape.iter().zip(strides) {
        if size == 1 {
            continue;
        }
        match (dims.last_mut(), steps.last_mut()) {
            (Some(d), Some(s)) if *s == stride * size as isize => {
                *d *= size;
                *s = stride;
            }
            _ => {
                dims.push(size);
                steps.push(stride);
            }
        }
    }
    Some((dims, steps))
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};

    use super::*;

    type B = burn::backend::flex::Flex;

    fn flex(t: Tensor<B, 5>) -> FlexTensor {
        match t.into_primitive() {
            TensorPrimitive::Float(x) => x,
            TensorPrimitive::QFloat(_) => unreachable!(),
        }
    }

    fn values(x: &FlexTensor) -> Vec<f32> {
        x.storage::<f32>().to_vec()
    }

    fn ramp(shape: [usize; 5]) -> Tensor<B, 5> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        Tensor::<B, 5>::from_data(TensorData::new(data, shape), &Default::default())
    }

    #[test]
    fn permuted_views_copy_as_burn_flex_does() {
        // Large enough to be split into tasks (rows of 33 elements, so a
        // task's first row starts mid-way through the outer dimensions).
        let large = ramp([2, 40, 4, 4, 33]);
        for axes in [[0, 2, 3, 1, 4], [0, 3, 1, 2, 4]] {
            let view = flex(large.clone().permute(axes));
            assert_eq!(values(&to_contiguous(&view)), values(&view.to_contiguous()));
        }
        let x = ramp([2, 3, 2, 2, 4]);
        for axes in [
            [0, 2, 3, 1, 4],
            [0, 3, 1, 2, 4],
            [1, 0, 2, 3, 4],
            [0, 1, 2, 4, 3],
        ] {
            let view = flex(x.clone().permute(axes));
            let ours = to_contiguous(&view);
            let theirs = view.to_contiguous();
            assert!(ours.is_contiguous() && ours.layout().start_offset() == 0);
            assert_eq!(ours.shape(), theirs.shape(), "{axes:?}");
            assert_eq!(values(&ours), values(&theirs), "{axes:?}");
        }
        // A slice in the middle (offset, gaps between rows).
        let view = flex(
            x.clone()
                .slice([0..2, 1..3, 0..2, 0..2, 1..3])
                .permute([0, 2, 1, 3, 4]),
        );
        assert_eq!(values(&to_contiguous(&view)), values(&view.to_contiguous()));
        // Transposed matrices, in one tile and in several tasks' bands
        // with partial tiles, from a slice with an offset.
        for (rows, cols) in [(3, 5), (40, 1030), (1030, 21)] {
            let m = ramp([1, 1, 1, cols, rows + 2]).slice([0..1, 0..1, 0..1, 0..cols, 1..rows + 1]);
            let view = flex(m.swap_dims(3, 4));
            assert_eq!(view.shape().dims::<5>(), [1, 1, 1, rows, cols]);
            assert_eq!(values(&to_contiguous(&view)), values(&view.to_contiguous()));
        }
        // Already contiguous: no copy.
        let whole = flex(x);
        assert!(std::sync::Arc::ptr_eq(
            &to_contiguous(&whole).data_arc(),
            &whole.data_arc()
        ));
    }
}
