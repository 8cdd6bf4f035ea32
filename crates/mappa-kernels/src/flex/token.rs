//! Each row's log-probability of its target token
//! ([`ModelBackend::token_log_probs`](crate::ModelBackend::token_log_probs))
//! on the CPU: the cross-entropy over the output head's logits, which for
//! a real vocabulary (SmolLM2's 49,152 tokens) is the largest tensor of a
//! training step.
//!
//! A log-softmax followed by a gather writes the whole `[rows, vocab]`
//! log-softmax, keeps it for the backward pass, and that pass builds a
//! dense one-hot gradient before the log-softmax's own backward reads all
//! three. Here the forward pass reads each row once (in place, also when
//! the logits are a slice of a larger tensor) and keeps one log-sum-exp per
//! row; the backward pass writes the logits' gradient in one pass.
//!
//! The bits are those of [`log_softmax_last`](crate::ModelBackend::log_softmax_last)
//! followed by burn's `gather`, and of their backward passes: the same
//! operations on each element in the same order. In the backward pass,
//! burn's gather gives the row `0 + g` at the target and `0` elsewhere, the
//! log-softmax's backward sums that row (exactly `0 + g`: adding zeros
//! changes no other value) and computes `grad_j - exp(y_j) * total`, with
//! `y_j = x_j - lse` recomputed here exactly as the forward pass made it.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Shape, TensorMetadata};
use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::reduce::log_sum_exp;
use super::tensors::{contiguous, f32_tensor, ids_below, tensor, writable};
use super::{copy, fresh, ROWS_PER_TASK};
use crate::expf::libm_exp_in_place;

/// `(log_softmax(x)[target], lse)` per row of `logits` (`[.., vocab]`),
/// `targets` of the leading shape.
pub(super) fn forward(logits: FlexTensor, targets: FlexTensor) -> (FlexTensor, FlexTensor) {
    let rows = Rows::new(logits);
    let ids = target_ids(targets, &rows);
    let n = rows.offsets.len();
    let chunks = [ROWS_PER_TASK; 2];
    let [picked, lse] = fresh::buffers([n, n], chunks, |task, [picked, lse]| {
        let mut exps = vec![MaybeUninit::uninit(); rows.width];
        for (i, (picked, lse)) in picked.iter_mut().zip(lse.iter_mut()).enumerate() {
            let r = task * ROWS_PER_TASK + i;
            let row = rows.row(r);
            *lse = log_sum_exp(row, &mut exps).0;
            *picked = row[ids[r]] - *lse;
        }
    });
    let leading = rows.leading_shape();
    (tensor(picked, leading.clone()), tensor(lse, leading))
}

/// The logits' gradient (contiguous, the logits' shape) given the rows'
/// log-sum-exp and the log-probabilities' gradient `grad`. Written over
/// the logits themselves when nothing else holds them (under autodiff they
/// are this operation's saved state, used once).
pub(super) fn backward(
    logits: FlexTensor,
    targets: FlexTensor,
    lse: FlexTensor,
    grad: FlexTensor,
) -> FlexTensor {
    let rows = Rows::new(logits);
    let ids = target_ids(targets, &rows);
    let (lse, _) = contiguous(lse);
    let (grad, _) = contiguous(grad);
    let (n, width, shape) = (rows.offsets.len(), rows.width, rows.shape.clone());
    assert!(
        lse.len() == n && grad.len() == n,
        "token_log_probs backward: {n} rows of logits, {} log-sum-exps, {} gradients",
        lse.len(),
        grad.len()
    );
    // Either the logits' own buffer, each row overwritten by its gradient,
    // or a new one, each row's logits read from `source`.
    let (mut out, source) = if writable(&rows.tensor) {
        (rows.tensor, None)
    } else {
        (tensor(vec![0.0f32; n * width], shape), Some(rows))
    };
    let row_task = |r: usize, out: &mut [f32]| {
        let logits = source.as_ref().map(|rows| rows.row(r));
        logits_grad_row(out, logits, lse[r], grad[r], ids[r]);
    };
    let values = out.storage_mut::<f32>();
    if n <= ROWS_PER_TASK {
        values
            .chunks_mut(width)
            .enumerate()
            .for_each(|(r, out)| row_task(r, out));
    } else {
        values
            .par_chunks_mut(width * ROWS_PER_TASK)
            .enumerate()
            .for_each(|(t, out)| {
                for (i, out) in out.chunks_mut(width).enumerate() {
                    row_task(t * ROWS_PER_TASK + i, out);
                }
            });
    }
    out
}

widened! {
    /// One row of the logits' gradient, written into `out` (which holds the
    /// row's logits unless `logits` gives them): `onehot(target) * g -
    /// exp(logits - lse) * g`, as burn's graph computes it.
    fn logits_grad_row(out: &mut [f32], logits: Option<&[f32]>, lse: f32, grad: f32, target: usize) {
        match logits {
            Some(row) => {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = v - lse;
                }
            }
            None => out.iter_mut().for_each(|o| *o -= lse),
        }
        libm_exp_in_place(out);
        // The gathered gradient as burn's scatter-add leaves it (0 + g, so
        // -0 becomes +0), which is also the sum of its row.
        let g = 0.0 + grad;
        let at_target = out[target];
        for o in out.iter_mut() {
            *o = 0.0 - *o * g;
        }
        out[target] = g - at_target * g;
    }
}

/// The rows of a `[.., width]` f32 tensor, read in place where each row is
/// contiguous (the logits themselves, or a slice of them along a leading
/// dimension); other layouts are copied first.
struct Rows {
    tensor: FlexTensor,
    shape: Shape,
    width: usize,
    /// Where each row starts in the tensor's storage.
    offsets: Vec<usize>,
}

impl Rows {
    fn new(x: FlexTensor) -> Self {
        let x = f32_tensor(x);
        let shape = x.shape();
        let rank = shape.len();
        assert!(
            rank >= 1 && shape[rank - 1] > 0,
            "token_log_probs: logits of shape {:?} have no vocabulary dimension",
            &shape[..]
        );
        let width = shape[rank - 1];
        let strides = x.layout().strides();
        let in_place = strides[rank - 1] == 1 && strides[..rank - 1].iter().all(|&s| s >= 0);
        let x = if in_place { x } else { copy::to_contiguous(&x) };
        let (strides, start) = (x.layout().strides().to_vec(), x.layout().start_offset());
        let n = shape.num_elements() / width;
        let mut offsets = Vec::with_capacity(n);
        let mut index = vec![0usize; rank - 1];
        for _ in 0..n {
            let offset: isize = index
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| i as isize * s)
                .sum();
            offsets.push(start + offset as usize);
            for d in (0..rank - 1).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Self {
            tensor: x,
            shape,
            width,
            offsets,
        }
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.tensor.storage::<f32>()[self.offsets[r]..][..self.width]
    }

    /// The shape without its last (vocabulary) dimension.
    fn leading_shape(&self) -> Shape {
        Shape::from(self.shape[..self.shape.len() - 1].to_vec())
    }
}

/// The target ids of an integer tensor, one per row, each checked against
/// the vocabulary.
fn target_ids(targets: FlexTensor, rows: &Rows) -> Vec<usize> {
    let n = rows.offsets.len();
    assert_eq!(
        targets.shape().num_elements(),
        n,
        "token_log_probs: targets of shape {:?} for {n} rows of logits",
        &targets.shape()[..]
    );
    ids_below(targets, rows.width, "token_log_probs: target")
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::prelude::*;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{TensorPrimitive, Tolerance};

    use crate::{bits, ModelBackend};

    type Ad = Autodiff<Flex>;

    /// Logits `[b, s + 1, v]` over a wide range (some rows far from zero),
    /// targets `[b, s]` covering both ends of the vocabulary, and weights
    /// for the log-probabilities with zeros of both signs (masked tokens).
    fn case(b: usize, s: usize, v: usize, seed: u64) -> (Vec<f32>, Vec<i32>, Vec<f32>) {
        let mut rng = mappa_test_rng(seed);
        let logits = (0..b * (s + 1) * v)
            .map(|i| {
                let scale = [1.0, 8.0, 60.0][(i / v) % 3];
                (rng() - 0.5) * scale + if (i / v) % 5 == 4 { -300.0 } else { 0.0 }
            })
            .collect();
        let targets = (0..b * s)
            .map(|i| match i % 7 {
                0 => 0,
                1 => v as i32 - 1,
                _ => (rng() * v as f32) as i32 % v as i32,
            })
            .collect();
        let weights = (0..b * s)
            .map(|i| match i % 6 {
                0 => 0.0,
                1 => -0.0,
                _ => rng() * 2.0 - 1.0,
            })
            .collect();
        (logits, targets, weights)
    }

    /// A small deterministic generator of values in [0, 1) for the cases.
    fn mappa_test_rng(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// The fused operation gives the bits of a log-softmax followed by
    /// burn's gather, forward and backward, on a slice of the logits (as a
    /// next-token loss takes them), with rows on one thread and on several,
    /// and with masked (zero-weight) tokens of both signs.
    #[test]
    fn token_log_probs_are_log_softmax_then_gather_bit_for_bit() {
        for (b, s, v, seed) in [(1, 5, 37, 1), (3, 7, 301, 2), (2, 24, 1000, 3)] {
            let (logits, targets, weights) = case(b, s, v, seed);
            let device = Default::default();
            let full = || {
                Tensor::<Ad, 3>::from_data(TensorData::new(logits.clone(), [b, s + 1, v]), &device)
                    .require_grad()
            };
            let targets =
                Tensor::<Ad, 2, Int>::from_data(TensorData::new(targets, [b, s]), &device);
            let weights = Tensor::<Ad, 2>::from_data(TensorData::new(weights, [b, s]), &device);
            let (x1, x2) = (full(), full());

            let fused =
                crate::token_log_probs(x1.clone().slice([0..b, 0..s, 0..v]), targets.clone());
            let composed = crate::log_softmax(x2.clone().slice([0..b, 0..s, 0..v]))
                .gather(2, targets.unsqueeze_dim::<3>(2))
                .squeeze_dim::<2>(2);
            assert_eq!(bits(fused.clone().inner()), bits(composed.clone().inner()));

            let g1 = (fused * weights.clone()).sum().backward();
            let g2 = (composed * weights).sum().backward();
            let (d1, d2) = (x1.grad(&g1).unwrap(), x2.grad(&g2).unwrap());
            assert_eq!(bits(d1), bits(d2), "logits' gradient, case {b}x{s}x{v}");
        }
    }

    /// The backward pass writes the gradient over logits held nowhere else
    /// and into a new buffer when they are shared (leaving them as they
    /// were), with the same bits either way; rows on several threads.
    #[test]
    fn the_backward_pass_reuses_logits_held_nowhere_else() {
        let (b, s, v) = (2, 40, 301);
        let (logits, _, _) = case(b, s, v, 5);
        let (_, targets, grad) = case(b, s + 1, v, 6);
        let device = Default::default();
        let held = || {
            let x = Tensor::<Flex, 3>::from_data(
                TensorData::new(logits.clone(), [b, s + 1, v]),
                &device,
            );
            x.into_primitive().tensor()
        };
        let targets =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(targets, [b, s + 1]), &device)
                .into_primitive();
        let grad = Tensor::<Flex, 2>::from_data(TensorData::new(grad, [b, s + 1]), &device)
            .into_primitive()
            .tensor();
        let raw = |x: &FloatTensor<Flex>| -> Vec<u32> {
            x.storage::<f32>().iter().map(|v| v.to_bits()).collect()
        };
        let (_, lse) = Flex::token_log_probs_with_lse(held(), targets.clone());

        let unshared = held();
        let address = unshared.bytes().as_ptr();
        let in_place =
            Flex::token_log_probs_backward(unshared, targets.clone(), lse.clone(), grad.clone());
        assert_eq!(
            in_place.bytes().as_ptr(),
            address,
            "written over the logits"
        );

        let shared = held();
        let kept = shared.clone();
        let copied = Flex::token_log_probs_backward(shared, targets, lse, grad);
        assert_ne!(
            copied.bytes().as_ptr(),
            kept.bytes().as_ptr(),
            "a new buffer"
        );
        assert_eq!(raw(&kept), raw(&held()), "the shared logits are unchanged");
        assert_eq!(raw(&in_place), raw(&copied));
    }

    /// The trait's default (burn's operations, what GPU backends run)
    /// computes the same values as the CPU kernel, within rounding.
    #[test]
    fn the_default_operations_match_the_cpu_kernel() {
        let (b, s, v) = (2, 9, 257);
        let (logits, targets, weights) = case(b, s + 1, v, 4);
        let device = Default::default();
        let float =
            |x: FloatTensor<Flex>| Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(x));
        let logits = Tensor::<Flex, 3>::from_data(TensorData::new(logits, [b, s + 2, v]), &device)
            .slice([0..b, 0..s + 1, 0..v]);
        let targets =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(targets, [b, s + 1]), &device);
        let grad = Tensor::<Flex, 2>::from_data(TensorData::new(weights, [b, s + 1]), &device);
        let logits = logits.into_primitive().tensor();
        let targets = targets.into_primitive();

        let (p1, l1) = Flex::token_log_probs_with_lse(logits.clone(), targets.clone());
        let (p2, l2) = crate::ops_token_log_probs_with_lse::<Flex>(logits.clone(), targets.clone());
        let tolerance = Tolerance::absolute(1e-4);
        float(p1)
            .into_data()
            .assert_approx_eq::<f32>(&float(p2).into_data(), tolerance);
        float(l1.clone())
            .into_data()
            .assert_approx_eq::<f32>(&float(l2).into_data(), tolerance);

        let grad = grad.into_primitive().tensor();
        let d1 = Flex::token_log_probs_backward(
            logits.clone(),
            targets.clone(),
            l1.clone(),
            grad.clone(),
        );
        let d2 = crate::ops_token_log_probs_backward::<Flex>(logits, targets, l1, grad);
        let float3 =
            |x: FloatTensor<Flex>| Tensor::<Flex, 3>::from_primitive(TensorPrimitive::Float(x));
        float3(d1)
            .into_data()
            .assert_approx_eq::<f32>(&float3(d2).into_data(), Tolerance::absolute(1e-6));
    }

    /// A target outside the vocabulary is refused, naming the row.
    #[test]
    #[should_panic(expected = "target 5 of row 1 is outside the vocabulary (0..5)")]
    fn a_target_outside_the_vocabulary_is_refused() {
        let device = Default::default();
        let logits = Tensor::<Flex, 3>::zeros([1, 2, 5], &device);
        let targets =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(vec![0, 5], [1, 2]), &device);
        crate::token_log_probs(logits, targets);
    }
}
