//! [`ModelBackend`] under automatic differentiation: each operation is one
//! node of burn's autodiff graph whose backward pass calls the inner
//! backend's kernels, so gradients are summed in the same fixed order as the
//! forward pass.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{binary, unary, Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Shape, TensorMetadata};

use super::{CausalMask, ModelBackend};

impl<B: ModelBackend, C: CheckpointStrategy> ModelBackend for Autodiff<B, C> {
    const ONE_DEVICE: bool = B::ONE_DEVICE;
    const MASKS_IN_SOFTMAX: bool = B::MASKS_IN_SOFTMAX;

    fn run_step<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        B::run_step(f)
    }

    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Matmul;

        impl<B: ModelBackend> Backward<B, 2> for Matmul {
            /// The left operand when the right needs a gradient, the right
            /// when the left does, and whether the right is a transposed view.
            type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, bool);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let (lhs, rhs, rhs_transposed) = ops.state;
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |grad| {
                        B::matmul(
                            grad,
                            B::float_transpose(rhs.expect("rhs kept for lhs grad")),
                        )
                    },
                    |grad| {
                        B::matmul_rhs_grad(
                            lhs.expect("lhs kept for rhs grad"),
                            grad,
                            rhs_transposed,
                        )
                    },
                );
            }
        }

        let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
        match Matmul
            .prepare::<C>([lhs.node.clone(), rhs.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (
                    rhs_tracked.then(|| lhs.primitive.clone()),
                    lhs_tracked.then(|| rhs.primitive.clone()),
                    B::is_transposed(&rhs.primitive),
                );
                prep.finish(state, B::matmul(lhs.primitive, rhs.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::matmul(lhs.primitive, rhs.primitive)),
        }
    }

    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self> {
        from_inputs::<B, C>([x, gamma], epsilon, B::rms_norm, B::rms_norm_backward)
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        from_inputs::<B, C>(
            [gate, up],
            0.0,
            |gate, up, _| B::swiglu(gate, up),
            |gate, up, grad, _| B::swiglu_backward(gate, up, grad),
        )
    }

    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        from_output::<B, C>(x, B::softmax_last, B::softmax_last_backward)
    }

    fn log_softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        from_output::<B, C>(x, B::log_softmax_last, B::log_softmax_last_backward)
    }

    fn causal_softmax(scores: FloatTensor<Self>, mask: &CausalMask) -> FloatTensor<Self> {
        from_output::<B, C>(
            scores,
            |x| B::causal_softmax(x, mask),
            B::softmax_last_backward,
        )
    }

    fn to_f32(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ToF32;

        impl<B: ModelBackend> Backward<B, 1> for ToF32 {
            /// The input's dtype.
            type State = burn::tensor::FloatDType;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let dtype = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::float_cast(grad, dtype)
                });
            }
        }

        use burn::tensor::{DType, FloatDType};
        let dtype = match x.primitive.dtype() {
            DType::F32 => return x,
            DType::F64 => FloatDType::F64,
            DType::F16 => FloatDType::F16,
            _ => FloatDType::BF16,
        };
        match ToF32
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(dtype, B::to_f32(x.primitive)),
            OpsKind::UnTracked(prep) => prep.finish(B::to_f32(x.primitive)),
        }
    }

    fn permute_contiguous(x: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct PermuteContiguous;

        impl<B: ModelBackend> Backward<B, 1> for PermuteContiguous {
            /// The inverse permutation.
            type State = Vec<usize>;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let inverse = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::permute_contiguous(grad, &inverse)
                });
            }
        }

        let output = B::permute_contiguous(x.primitive, axes);
        match PermuteContiguous
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let mut inverse = vec![0; axes.len()];
                for (i, &a) in axes.iter().enumerate() {
                    inverse[a] = i;
                }
                prep.finish(inverse, output)
            }
            OpsKind::UnTracked(prep) => prep.finish(output),
        }
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Rope;

        impl<B: ModelBackend> Backward<B, 1> for Rope {
            /// The tables and the scale.
            type State = (FloatTensor<B>, FloatTensor<B>, f64);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let (cos, sin, scale) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::rope_backward(grad, cos, sin, scale)
                });
            }
        }

        // The tables are constants: only `x` is a parent.
        let (cos, sin) = (cos.primitive, sin.primitive);
        match Rope
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let output = B::rope(x.primitive, cos.clone(), sin.clone(), scale);
                prep.finish((cos, sin, scale), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rope(x.primitive, cos, sin, scale)),
        }
    }

    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Attention;

        impl<B: ModelBackend> Backward<B, 3> for Attention {
            /// `q`, `k`, `v`, the output, the rows' log-sum-exp and the mask.
            type State = (
                FloatTensor<B>,
                FloatTensor<B>,
                FloatTensor<B>,
                FloatTensor<B>,
                FloatTensor<B>,
                CausalMask,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                to_parents::<B, _, 3>(ops, grads, |(q, k, v, out, lse, mask), grad| {
                    B::causal_attention_backward(q, k, v, out, lse, grad, &mask).into()
                });
            }
        }

        match Attention
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, lse) = B::causal_attention_with_lse(
                    q.primitive.clone(),
                    k.primitive.clone(),
                    v.primitive.clone(),
                    mask,
                );
                let state = (
                    q.primitive,
                    k.primitive,
                    v.primitive,
                    out.clone(),
                    lse,
                    mask.clone(),
                );
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::causal_attention(
                q.primitive,
                k.primitive,
                v.primitive,
                mask,
            )),
        }
    }

    fn dense_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct DenseAttention;

        impl<B: ModelBackend> Backward<B, 3> for DenseAttention {
            /// `q`, `k`, `v` and the probabilities.
            type State = (
                FloatTensor<B>,
                FloatTensor<B>,
                FloatTensor<B>,
                FloatTensor<B>,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                to_parents::<B, _, 3>(ops, grads, |(q, k, v, probs), grad| {
                    B::dense_attention_backward(q, k, v, probs, grad).into()
                });
            }
        }

        match DenseAttention
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, probs) = B::dense_attention_with_probs(
                    q.primitive.clone(),
                    k.primitive.clone(),
                    v.primitive.clone(),
                    mask,
                );
                prep.finish((q.primitive, k.primitive, v.primitive, probs), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::dense_attention(
                q.primitive,
                k.primitive,
                v.primitive,
                mask,
            )),
        }
    }

    fn embed_tokens(weights: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct EmbedTokens;

        impl<B: ModelBackend> Backward<B, 1> for EmbedTokens {
            /// The table (for its shape and device) and the token ids.
            type State = (FloatTensor<B>, IntTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let (weights, indices) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::embed_tokens_backward(weights, grad, indices)
                });
            }
        }

        match EmbedTokens
            .prepare::<C>([weights.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                (weights.primitive.clone(), indices.clone()),
                B::embed_tokens(weights.primitive, indices),
            ),
            OpsKind::UnTracked(prep) => prep.finish(B::embed_tokens(weights.primitive, indices)),
        }
    }

    fn token_log_probs(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct TokenLogProbs;

        impl<B: ModelBackend> Backward<B, 1> for TokenLogProbs {
            /// The logits, the targets and the rows' log-sum-exp.
            type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let (logits, targets, lse) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::token_log_probs_backward(logits, targets, lse, grad)
                });
            }
        }

        match TokenLogProbs
            .prepare::<C>([logits.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (picked, lse) =
                    B::token_log_probs_with_lse(logits.primitive.clone(), targets.clone());
                prep.finish((logits.primitive, targets, lse), picked)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::token_log_probs(logits.primitive, targets)),
        }
    }

    fn add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Add;

        impl<B: ModelBackend> Backward<B, 2> for Add {
            type State = ();

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                // The output's gradient reaches both operands unchanged.
                to_parents::<B, _, 2>(ops, grads, |(), grad| [grad.clone(), grad]);
            }
        }

        Add.prepare::<C>([a.node.clone(), b.node.clone()])
            .compute_bound()
            .stateless(B::add(a.primitive, b.primitive))
    }

    fn sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Sum;

        impl<B: ModelBackend> Backward<B, 1> for Sum {
            /// The input's shape.
            type State = Shape;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let shape = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    // The gradient of a sum reaches every element unchanged.
                    let ones = Shape::from(vec![1; shape.num_dims()]);
                    B::float_expand(B::float_reshape(grad, ones), shape)
                });
            }
        }

        match Sum
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let shape = x.primitive.shape();
                prep.finish(shape, B::sum(x.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::sum(x.primitive)),
        }
    }
}

/// A kernel of two tensors and a scalar setting (RMSNorm's epsilon; unused
/// by SwiGLU): `forward(a, b, setting)`.
type TwoInputKernel<B> = fn(FloatTensor<B>, FloatTensor<B>, f64) -> FloatTensor<B>;

/// Its backward kernel, `backward(a, b, grad, setting) -> (d_a, d_b)`.
type TwoInputBackward<B> =
    fn(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, f64) -> (FloatTensor<B>, FloatTensor<B>);

/// The backward pass of an operation of two tensors whose two gradients
/// one kernel call computes from the inputs (RMSNorm, SwiGLU).
#[derive(Debug)]
struct FromInputs<B: ModelBackend> {
    backward: TwoInputBackward<B>,
}

impl<B: ModelBackend> Backward<B, 2> for FromInputs<B> {
    /// The inputs and the setting.
    type State = (FloatTensor<B>, FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        to_parents::<B, _, 2>(ops, grads, |(a, b, setting), grad| {
            (self.backward)(a, b, grad, setting).into()
        });
    }
}

/// The backward pass of a node of `N` inputs whose gradients one kernel
/// call computes, `gradients(state, grad)`: each is registered with its
/// input where that input is tracked.
fn to_parents<B: ModelBackend, S, const N: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    gradients: impl FnOnce(S, FloatTensor<B>) -> [FloatTensor<B>; N],
) {
    let grad = grads.consume::<B>(&ops.node);
    for (parent, grad) in ops.parents.into_iter().zip(gradients(ops.state, grad)) {
        if let Some(parent) = parent {
            grads.register::<B>(parent.id, grad);
        }
    }
}

/// `forward(a, b, setting)` as one autodiff node whose backward pass is
/// `backward(a, b, grad, setting)`.
fn from_inputs<B: ModelBackend, C: CheckpointStrategy>(
    [a, b]: [FloatTensor<Autodiff<B, C>>; 2],
    setting: f64,
    forward: TwoInputKernel<B>,
    backward: TwoInputBackward<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match (FromInputs { backward })
        .prepare::<C>([a.node.clone(), b.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = (a.primitive.clone(), b.primitive.clone(), setting);
            prep.finish(state, forward(a.primitive, b.primitive, setting))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(a.primitive, b.primitive, setting)),
    }
}

/// The backward pass of a unary operation whose gradient needs only its
/// output (softmax, log-softmax): `backward(output, grad)`.
#[derive(Debug)]
struct FromOutput<B: ModelBackend> {
    backward: fn(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>,
}

impl<B: ModelBackend> Backward<B, 1> for FromOutput<B> {
    /// The output.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let y = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            (self.backward)(y, grad)
        });
    }
}

/// `forward(x)` as one autodiff node whose backward pass is `backward(output, grad)`.
fn from_output<B: ModelBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    forward: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
    backward: fn(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match (FromOutput { backward })
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = forward(x.primitive);
            prep.finish(y.clone(), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive)),
    }
}

#[cfg(test)]
mod tests {
    use crate::flex::tests::bits;
    use burn::backend::{Autodiff, Flex as Cpu};
    use burn::prelude::*;
    use burn::tensor::Tolerance;

    type CpuAutodiff = Autodiff<Cpu>;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    fn param<const D: usize>(shape: [usize; D], seed: u32) -> Tensor<CpuAutodiff, D> {
        let n = shape.iter().product();
        Tensor::from_data(TensorData::new(values(n, seed), shape), &Default::default())
            .require_grad()
    }

    fn close<const D: usize>(a: Tensor<Cpu, D>, b: Tensor<Cpu, D>) {
        a.into_data()
            .assert_approx_eq::<f32>(&b.into_data(), Tolerance::absolute(2e-5));
    }

    /// Fails, naming `what`, unless `a` and `b` hold the same bits.
    fn same<const D: usize>(what: &str, a: Tensor<Cpu, D>, b: Tensor<Cpu, D>) {
        assert_eq!(bits(a), bits(b), "{what}");
    }

    /// A contiguous permutation is burn's `permute`, forward and backward,
    /// and the merged-heads reshape after it gives the same values.
    #[test]
    fn permute_contiguous_is_burns_permute() {
        let x1 = param([2, 3, 4, 5], 3);
        let x2 =
            Tensor::<CpuAutodiff, 4>::from_data(x1.to_data(), &Default::default()).require_grad();
        let weights = param([2 * 4, 3 * 5], 4).detach();
        let mine = crate::permute_contiguous(x1.clone(), [0, 2, 1, 3]).reshape([8, 15]);
        let theirs = x2.clone().permute([0, 2, 1, 3]).reshape([8, 15]);
        assert_eq!(mine.to_data(), theirs.to_data());
        let g1 = (mine * weights.clone()).sum().backward();
        let g2 = (theirs * weights).sum().backward();
        assert_eq!(
            x1.grad(&g1).unwrap().into_data(),
            x2.grad(&g2).unwrap().into_data()
        );
    }

    /// RoPE's kernel gives the bits of the rotation-matrix product it
    /// replaced (each token's table row for all its heads, then the heads
    /// moved before the tokens), forward and backward, signed zeros
    /// included, so models trained before it existed train the same.
    #[test]
    fn rope_is_the_rotation_matrix_product_bit_for_bit() {
        // Enough rows for two threads' chunks; zeros of both signs in the
        // input and the output's gradient, where signed zeros could differ.
        let ([b, s, h], d) = ([4, 25, 3], 64);
        let (tokens, rows) = (b * s, b * s * h);
        let mut x = values(rows * d, 11);
        x[..4].copy_from_slice(&[0.0, -0.0, 0.0, -0.0]);
        x[d / 2..d / 2 + 4].copy_from_slice(&[-0.0, -0.0, 0.0, 0.0]);
        let mut weights = values(rows * d, 12);
        weights[..4].copy_from_slice(&[-0.0, 0.0, -0.0, 0.0]);
        weights[d / 2..d / 2 + 4].copy_from_slice(&[-0.0, -0.0, 0.0, 0.0]);
        // The output's layout, heads first.
        let weights = Tensor::<CpuAutodiff, 4>::from_data(
            TensorData::new(weights, [b, h, s, d]),
            &Default::default(),
        );
        let input = || {
            Tensor::<CpuAutodiff, 4>::from_data(
                TensorData::new(x.clone(), [b, s, h, d]),
                &Default::default(),
            )
            .require_grad()
        };
        // Positive table entries where the zeros sit, so that every pairing
        // of zero signs reaches the output's sign.
        let table = |seed| {
            let mut t = values(tokens * d, seed);
            t[..4].fill(0.5);
            t[d / 2..d / 2 + 4].fill(0.5);
            Tensor::<CpuAutodiff, 2>::from_data(
                TensorData::new(t, [tokens, d]),
                &Default::default(),
            )
        };
        let (cos, sin) = (table(13), table(14));
        let per_token = |t: &Tensor<CpuAutodiff, 2>| t.clone().reshape([tokens, 1, d]);
        for scale in [1.0, 1.0 / 48f64.sqrt()] {
            let (x1, x2) = (input(), input());
            let mine = crate::rope(x1.clone(), cos.clone(), sin.clone(), scale);
            let rotate = crate::rotate_half_matrix::<CpuAutodiff>(d, &Default::default());
            let rotated = crate::matmul(x2.clone().reshape([rows, d]), rotate);
            let x3 = x2.clone().reshape([tokens, h, d]);
            let rotated = rotated.reshape([tokens, h, d]);
            let mut theirs = x3 * per_token(&cos) + rotated * per_token(&sin);
            if scale != 1.0 {
                theirs = theirs * scale;
            }
            let theirs = theirs.reshape([b, s, h, d]).swap_dims(1, 2);
            assert_eq!(bits(mine.clone().inner()), bits(theirs.clone().inner()));
            let mine = (mine * weights.clone()).sum().backward();
            let theirs = (theirs * weights.clone()).sum().backward();
            same(
                &format!("x's gradient, scale {scale}"),
                x1.grad(&mine).unwrap(),
                x2.grad(&theirs).unwrap(),
            );
        }
    }

    /// The residual stream's addition gives the bits of burn's `a + b`,
    /// signed zeros included, and sends the output's gradient to both
    /// operands as burn's does, also to an operand used twice.
    #[test]
    fn add_is_burns_addition_bit_for_bit() {
        // Three tasks' chunks, so that the kernel runs on both threads.
        let shape = [300, 130];
        let n = shape[0] * shape[1];
        let operand = |seed, zeros: [f32; 4]| {
            let mut v = values(n, seed);
            v[..4].copy_from_slice(&zeros);
            move || {
                Tensor::<CpuAutodiff, 2>::from_data(
                    TensorData::new(v.clone(), shape),
                    &Default::default(),
                )
                .require_grad()
            }
        };
        let a = operand(21, [0.0, -0.0, 0.0, -0.0]);
        let b = operand(22, [0.0, 0.0, -0.0, -0.0]);
        let (w1, w2) = (param(shape, 23), param(shape, 24));
        let (a1, b1, a2, b2) = (a(), b(), a(), b());
        let mine = crate::add(a1.clone(), b1.clone());
        let theirs = a2.clone() + b2.clone();
        assert_eq!(bits(mine.clone().inner()), bits(theirs.clone().inner()));
        let loss = |sum: Tensor<CpuAutodiff, 2>, a: &Tensor<CpuAutodiff, 2>| {
            ((sum * w1.clone()).sum() + (a.clone() * w2.clone()).sum()).backward()
        };
        let (mine, theirs) = (loss(mine, &a1), loss(theirs, &a2));
        same(
            "a's gradient",
            a1.grad(&mine).unwrap(),
            a2.grad(&theirs).unwrap(),
        );
        same(
            "b's gradient",
            b1.grad(&mine).unwrap(),
            b2.grad(&theirs).unwrap(),
        );
    }

    /// SwiGLU's kernel gives the bits of burn's `silu(gate) * up`, forward
    /// and backward (both sides of zero, and where `exp` overflows), so
    /// models trained before it existed train the same.
    #[test]
    fn swiglu_is_burns_silu_times_up_bit_for_bit() {
        let mut gate = values(4 * 300, 7);
        gate[..6].copy_from_slice(&[-120.0, -88.5, -0.0, 0.0, 30.0, 95.0]);
        let gate = || {
            Tensor::<CpuAutodiff, 2>::from_data(
                TensorData::new(gate.clone(), [4, 300]),
                &Default::default(),
            )
            .require_grad()
        };
        let (g1, g2, u1) = (gate(), gate(), param([4, 300], 8));
        let u2 =
            Tensor::<CpuAutodiff, 2>::from_data(u1.to_data(), &Default::default()).require_grad();
        let weights = param([4, 300], 9).detach();
        let mine = crate::swiglu(g1.clone(), u1.clone());
        let theirs = burn::tensor::activation::silu(g2.clone()) * u2.clone();
        assert_eq!(bits(mine.clone().inner()), bits(theirs.clone().inner()));
        let mine = (mine * weights.clone()).sum().backward();
        let theirs = (theirs * weights).sum().backward();
        same(
            "gate's gradient",
            g1.grad(&mine).unwrap(),
            g2.grad(&theirs).unwrap(),
        );
        same(
            "up's gradient",
            u1.grad(&mine).unwrap(),
            u2.grad(&theirs).unwrap(),
        );
    }

    /// Each operation's gradients equal those burn's autodiff derives from
    /// burn's own operations (same loss, weighted so every output matters).
    #[test]
    fn gradients_match_burns_autodiff() {
        let weights = Tensor::<CpuAutodiff, 3>::from_data(
            TensorData::new(values(2 * 3 * 5, 9), [2, 3, 5]),
            &Default::default(),
        );
        let (a, b) = (param([2, 3, 4], 1), param([2, 4, 5], 2));
        let mine = crate::sum(crate::matmul(a.clone(), b.clone()) * weights.clone()).backward();
        let theirs = (a.clone().matmul(b.clone()) * weights.clone())
            .sum()
            .backward();
        close(a.grad(&mine).unwrap(), a.grad(&theirs).unwrap());
        close(b.grad(&mine).unwrap(), b.grad(&theirs).unwrap());

        let (x, gamma) = (param([2, 3, 5], 3), param([5], 4));
        let mine = crate::sum(crate::rms_norm(x.clone(), gamma.clone(), 1e-6) * weights.clone())
            .backward();
        let rms = (x.clone().square().mean_dim(2) + 1e-6).sqrt();
        let reference = x.clone() / rms * gamma.clone().unsqueeze::<3>();
        let theirs = (reference * weights.clone()).sum().backward();
        close(x.grad(&mine).unwrap(), x.grad(&theirs).unwrap());
        close(gamma.grad(&mine).unwrap(), gamma.grad(&theirs).unwrap());

        let x = param([2, 3, 5], 5);
        let mine = crate::sum(crate::softmax(x.clone()) * weights.clone()).backward();
        let theirs = (burn::tensor::activation::softmax(x.clone(), 2) * weights.clone())
            .sum()
            .backward();
        close(x.grad(&mine).unwrap(), x.grad(&theirs).unwrap());

        let mine = crate::sum(crate::log_softmax(x.clone()) * weights.clone()).backward();
        let theirs = (burn::tensor::activation::log_softmax(x.clone(), 2) * weights)
            .sum()
            .backward();
        close(x.grad(&mine).unwrap(), x.grad(&theirs).unwrap());
    }

    /// Attention's inputs for the tests below: 2 batch rows, 2 key/value
    /// heads, groups of 2 query heads, 3 queries after 2 cached columns
    /// (the second row with 3 padding columns), head size 20 (a dot
    /// product's lanes and tail). `q`, `k`, `v` twice each (two graphs of
    /// the same values), and weights for a loss over the output.
    struct AttentionCase {
        mask: crate::CausalMask,
        heads: usize,
        rows: usize,
        first: [Tensor<CpuAutodiff, 4>; 3],
        second: [Tensor<CpuAutodiff, 4>; 3],
        weights: Tensor<CpuAutodiff, 4>,
    }

    impl AttentionCase {
        fn new(seed: u32) -> Self {
            let (b, h, group, seq, start, d) = (2, 2, 2, 3, 2, 20);
            let (rows, keys) = (group * seq, start + seq);
            let mask = crate::CausalMask {
                pad_left: vec![0, 3],
                start,
                seq,
            };
            let inputs = || {
                [
                    param([b, h, rows, d], seed),
                    param([b, h, keys, d], seed + 1),
                    param([b, h, keys, d], seed + 2),
                ]
            };
            Self {
                mask,
                heads: h,
                rows,
                first: inputs(),
                second: inputs(),
                weights: param([b, h, rows, d], seed + 3).detach(),
            }
        }
    }

    /// Dense attention as one node gives the output and gradients of the
    /// three nodes it replaces (the scores' product, the masked softmax and
    /// the output's product), bit for bit.
    #[test]
    fn dense_attention_is_its_three_operations_under_autodiff() {
        let case = AttentionCase::new(21);
        let [q1, k1, v1] = case.first.clone();
        let [q2, k2, v2] = case.second.clone();
        let one = crate::dense_attention(q1, k1, v1, &case.mask);
        let scores = crate::matmul(q2, k2.swap_dims(2, 3));
        let three = crate::matmul(crate::causal_softmax(scores, &case.mask), v2);
        assert_eq!(bits(one.clone().inner()), bits(three.clone().inner()));
        let one = (one * case.weights.clone()).sum().backward();
        let three = (three * case.weights).sum().backward();
        for (mine, theirs) in case.first.iter().zip(&case.second) {
            let (mine, theirs) = (mine.grad(&one).unwrap(), theirs.grad(&three).unwrap());
            assert_eq!(bits(mine), bits(theirs));
        }
    }

    /// Causal attention as one node (the CPU kernel, one row at a time) and
    /// as burn's operations on the full score matrix give the same output
    /// and gradients: left padding, a KV-cache offset and grouped heads.
    #[test]
    fn causal_attention_matches_softmax_of_biased_scores() {
        let AttentionCase {
            mask,
            heads: h,
            rows,
            first: [q1, k1, v1],
            second: [q2, k2, v2],
            weights,
        } = AttentionCase::new(11);
        let mine = crate::attention(q1.clone(), k1.clone(), v1.clone(), &mask);
        let bias = mask.bias::<CpuAutodiff>(h, 0..rows, &Default::default());
        let probs = burn::tensor::activation::softmax(
            q2.clone().matmul(k2.clone().swap_dims(2, 3)) + bias,
            3,
        );
        let theirs = probs.matmul(v2.clone());
        close(mine.clone().inner(), theirs.clone().inner());
        let mine = (mine * weights.clone()).sum().backward();
        let theirs = (theirs * weights).sum().backward();
        close(q1.grad(&mine).unwrap(), q2.grad(&theirs).unwrap());
        close(k1.grad(&mine).unwrap(), k2.grad(&theirs).unwrap());
        close(v1.grad(&mine).unwrap(), v2.grad(&theirs).unwrap());

        // The trait's defaults (burn's operations, what GPU backends run)
        // agree with the CPU kernels, forward and backward.
        use burn::tensor::TensorPrimitive::Float;
        let inner = |t: &Tensor<CpuAutodiff, 4>| t.clone().inner().into_primitive().tensor();
        let [q, k, v, g] = [&q1, &k1, &v1, &param(q1.dims(), 15)].map(inner);
        let (out, lse) = <Cpu as crate::ModelBackend>::causal_attention_with_lse(
            q.clone(),
            k.clone(),
            v.clone(),
            &mask,
        );
        // Blocks of 5 of the 6 rows: two blocks, the last one short.
        let block = 5;
        let (dense_out, dense_lse) = crate::dense_causal_attention_with_lse::<Cpu>(
            q.clone(),
            k.clone(),
            v.clone(),
            &mask,
            block,
        );
        let four = |t| Tensor::<Cpu, 4>::from_primitive(Float(t));
        close(four(out.clone()), four(dense_out));
        close(
            Tensor::<Cpu, 3>::from_primitive(Float(lse.clone())),
            Tensor::<Cpu, 3>::from_primitive(Float(dense_lse)),
        );
        let args = (q, k, v, out, lse, g);
        let cpu = <Cpu as crate::ModelBackend>::causal_attention_backward(
            args.0.clone(),
            args.1.clone(),
            args.2.clone(),
            args.3.clone(),
            args.4.clone(),
            args.5.clone(),
            &mask,
        );
        let dense = crate::dense_causal_attention_backward::<Cpu>(
            args.0, args.1, args.2, args.3, args.4, args.5, &mask, block,
        );
        close(four(cpu.0), four(dense.0));
        close(four(cpu.1), four(dense.1));
        close(four(cpu.2), four(dense.2));
    }

    /// The CPU's masked softmax gives the bits of a softmax of the scores
    /// plus the mask's bias (the trait's default), forward and backward:
    /// left padding, a KV-cache offset, grouped heads, negative zeros, and
    /// a row whose every visible score is `-inf` (NaN either way).
    #[test]
    fn causal_softmax_is_the_softmax_of_biased_scores_bit_for_bit() {
        use crate::CausalMask;
        let (b, h, group, seq, start) = (2, 2, 2, 3, 2);
        let (rows, keys) = (group * seq, start + seq);
        let mask = CausalMask {
            pad_left: vec![0, 3],
            start,
            seq,
        };
        let mut values = values(b * h * rows * keys, 21);
        values[3] = -0.0;
        values[keys + 1] = -0.0;
        // Batch row 1, head 0, query row 0 sees key 2 alone.
        values[(h * rows) * keys + 2] = f32::NEG_INFINITY;
        let scores = || {
            Tensor::<CpuAutodiff, 4>::from_data(
                TensorData::new(values.clone(), [b, h, rows, keys]),
                &Default::default(),
            )
            .require_grad()
        };
        let (mine_in, theirs_in) = (scores(), scores());
        let weights = param([b, h, rows, keys], 22).detach();
        let mine = crate::causal_softmax(mine_in.clone(), &mask);
        let bias = mask.bias::<CpuAutodiff>(h, 0..rows, &Default::default());
        let theirs = crate::softmax(theirs_in.clone() + bias);
        let nan_row =
            &mine.clone().inner().into_data().to_vec::<f32>().unwrap()[(h * rows) * keys..][..keys];
        assert!(nan_row.iter().all(|v| v.is_nan()), "{nan_row:?}");
        assert_eq!(bits(mine.clone().inner()), bits(theirs.clone().inner()));
        let mine = (mine * weights.clone()).sum().backward();
        let theirs = (theirs * weights).sum().backward();
        same(
            "the input's gradient",
            mine_in.grad(&mine).unwrap(),
            theirs_in.grad(&theirs).unwrap(),
        );
    }
}
