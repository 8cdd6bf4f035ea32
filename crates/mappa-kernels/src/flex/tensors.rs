//! Tensor helpers of the flex backend: f32 views of a tensor's storage,
//! in-place writes when nothing else holds a buffer, widening from bf16,
//! index checks, and building a tensor from values.

use burn::backend::flex::{Flex, FlexTensor, Layout};
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{Bytes, DType, FloatDType, Shape, TensorMetadata};

use super::{copy, fresh, ELEMENTS_PER_TASK};
use crate::written::write_all;

pub(super) fn last_dim(shape: &Shape) -> usize {
    shape.last().copied().unwrap_or(1)
}

/// `tensor[ranges] = value` written into `tensor`'s own buffer when it is a
/// whole, contiguous f32 buffer that nothing else shares; otherwise (or for
/// ranges that do not fit) burn's `slice_assign`, which copies it.
pub(super) fn write_slice(
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
pub(super) fn f32_tensor(x: FlexTensor) -> FlexTensor {
    match x.dtype() {
        DType::F32 => x,
        DType::BF16 => widen_bf16(x),
        _ => Flex::float_cast(x, FloatDType::F32),
    }
}

/// A bf16 tensor in f32: each value's 16 bits become the high half of an
/// f32 (exact: what `float_cast` computes through f64, without it).
pub(super) fn widen_bf16(x: FlexTensor) -> FlexTensor {
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
pub(super) struct Values {
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
pub(super) fn contiguous(x: FlexTensor) -> (Values, Shape) {
    let x = f32_tensor(x);
    let shape = x.shape();
    let tensor = copy::to_contiguous(&x);
    let start = tensor.layout().start_offset();
    let len = shape.num_elements();
    (Values { tensor, start, len }, shape)
}

/// The values of an integer tensor (i32 or i64) in row-major order, each
/// checked to lie in `0..bound`; `what` names them in the message otherwise.
pub(super) fn ids_below(x: FlexTensor, bound: usize, what: &str) -> Vec<usize> {
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
pub(super) fn writable(x: &FlexTensor) -> bool {
    x.dtype() == DType::F32
        && x.is_contiguous()
        && x.layout().start_offset() == 0
        && x.storage::<f32>().len() == x.shape().num_elements()
        && x.is_unique()
}

/// `x` as an f32 tensor that can be written in place ([`writable`]):
/// itself when it is one, otherwise a copy.
pub(super) fn owned(x: FlexTensor) -> FlexTensor {
    let x = f32_tensor(x);
    if writable(&x) {
        return x;
    }
    let (values, shape) = contiguous(x);
    tensor(values.to_vec(), shape)
}

pub(super) fn tensor(values: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(shape),
        DType::F32,
    )
}
