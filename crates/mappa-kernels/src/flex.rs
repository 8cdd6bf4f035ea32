//! [`ModelBackend`] on burn's `flex` CPU backend: kernels whose summation
//! order is fixed by the shapes alone.
//!
//! - **Matrix products** go to the `gemm` crate in calls of at most
//!   [`GEMM_MAX_K`] terms, each through a kernel that its shapes and strides
//!   choose, so that a product has the same bits on every x86-64 CPU with
//!   AVX2 and FMA (`matmul.rs`) and, where gemm's ARM kernels would sum in
//!   another order, x86-64's order written out (`order.rs`) on 64-bit ARM. A transposed weight's gradient is computed
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

/// `fn name(args) body`, compiled twice on x86-64: for AVX2, run where the
/// CPU has it, and for the baseline (SSE2); once elsewhere (on 64-bit ARM
/// the baseline already has NEON's 128-bit registers). The target feature only widens the
/// registers the loops run in: nothing is fused (FMA is not enabled) and
/// nothing is reordered, so both copies give the same bits. What the body
/// calls is widened with it only if inlined: the helpers it uses here are
/// `#[inline(always)]`.
macro_rules! widened {
    ($(#[$meta:meta])* $vis:vis fn $name:ident $(<$($lt:lifetime),+>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name $(<$($lt),+>)? ($($arg: $ty),*) $(-> $ret)? {
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

mod adamw;
mod attention;
mod backend;
mod copy;
mod fresh;
mod matmul;
mod narrow;
mod order;
mod reduce;
mod rows;
mod steps;
mod tensors;
mod token;
pub use matmul::GEMM_MAX_K;
pub use reduce::{dot, long_sum, sum, LANES};

/// Rows handled by one rayon task in the row-wise kernels.
const ROWS_PER_TASK: usize = 16;

/// Elements handled by one rayon task in the element-wise kernels.
const ELEMENTS_PER_TASK: usize = 1 << 14;

#[cfg(test)]
pub(super) mod tests {
    use burn::backend::flex::{Flex, FlexTensor};
    use burn::prelude::*;
    use burn::tensor::FloatDType;

    use super::adamw::ADAMW_ELEMENTS_PER_TASK;
    use super::reduce::{long_sum, sum, SUM_BLOCK};
    use super::tensors::{f32_tensor, tensor};
    use crate::{AdamWStep, ModelBackend};

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

    pub(crate) use crate::bits;

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
