//! The tensor operations whose floating-point results mappa pins itself.
//!
//! A float sum depends on the order of its terms, and burn's CPU backend
//! picks that order from the machine: its GEMM splits long reductions into
//! blocks sized from the L1 cache (512 terms on a 32 KiB 8-way L1, 1024 on a
//! 48 KiB 12-way one), and its reductions keep one partial sum per SIMD lane
//! (16 with AVX-512, 8 with AVX2). Two x86-64 machines then train the same
//! manifest into weights that differ in the last bits, and sampling turns
//! that into different runs. [`ModelBackend`] routes the few operations that
//! sum (matrix products, RMSNorm, softmax, log-softmax, token
//! log-probabilities, the token embedding's gradient, full sums) through
//! kernels whose order is fixed by the shapes alone on the CPU backend
//! ([`flex`]); see the README's "Reproducibility" section for the contract
//! and how it is checked.
//!
//! The pattern is burn's backend extension: a trait over
//! [`Backend`](burn::tensor::backend::Backend) with default methods made of
//! burn's own operations (what the GPU backends use), overridden for the CPU
//! backend, and implemented for [`Autodiff`](burn::backend::Autodiff) with
//! backward passes that call the inner backend's kernels
//! (`autodiff.rs`). Model code calls the free functions below.

#![warn(missing_docs)]

pub mod alloc;
mod attention;
mod autodiff;
pub mod expf;
pub mod flex;
mod written;

use burn::prelude::*;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::IndexingUpdateOp;
use burn::tensor::TensorPrimitive;

pub use attention::{attention, dense_attention, CausalMask, ATTENTION_BLOCK_ROWS};
use attention::{
    composed_dense_attention, composed_dense_attention_backward, dense_causal_attention_backward,
    dense_causal_attention_with_lse,
};

/// The version of the kernels' summation order: raised whenever a kernel
/// sums in another order, so that anything keyed on trained weights (the
/// warm-start cache, lock files) tells results of one order from another.
pub const SUMMATION_ORDER: u32 = 1;

/// A burn backend with mappa's float-sensitive operations.
///
/// Every method works on the last dimension (or the last two, for
/// [`matmul`](ModelBackend::matmul)) of a tensor of any rank. The defaults
/// are burn's operations; the CPU backend overrides them with kernels whose
/// summation order does not depend on the machine.
pub trait ModelBackend: Backend {
    /// Whether every device index names the one device of the backend (a
    /// CPU backend), rather than a device of its own. Only then may several
    /// indices of a run share a device; elsewhere an index that maps to
    /// another index's device is refused.
    const ONE_DEVICE: bool = false;

    /// Whether dense attention should hand the causal mask to
    /// [`causal_softmax`](ModelBackend::causal_softmax) rather than add a
    /// bias tensor ([`CausalMask::bias`]) to the scores and take a plain
    /// softmax. Both give the same bits. The CPU backend masks each row as
    /// it reads it; elsewhere (the default) the model builds the bias once
    /// per forward pass and shares it between layers, where the default
    /// `causal_softmax` would build it once per layer.
    const MASKS_IN_SOFTMAX: bool = false;

    /// Runs `f`, one whole step of work on this backend (a generation, a
    /// forward pass, a training step), where its operations run fastest:
    /// on the calling thread by default; the CPU backend runs it on a
    /// thread of a kernel pool of its own (`flex/steps.rs`). Where it runs
    /// changes no result.
    fn run_step<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// `lhs @ rhs` over the last two dimensions; the leading (batch)
    /// dimensions must be equal (no broadcasting).
    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// Whether `x` is a transposed view of a matrix (its last dimension
    /// strided, the one before it contiguous), as `W` is in `x @ Wᵀ`.
    /// Backends whose tensors have no layout of their own say `false`.
    fn is_transposed(x: &FloatTensor<Self>) -> bool {
        let _ = x;
        false
    }

    /// `lhsᵀ @ grad`, the gradient of [`matmul`](ModelBackend::matmul)'s
    /// right operand. Where that operand `is_transposed`, the backend may
    /// compute it as `(gradᵀ @ lhs)ᵀ`, in the operand's own layout, when that
    /// gives the same bits: the gradient of a weight used as `Wᵀ` then comes
    /// back to `W` contiguous, and the optimiser's element-wise passes read
    /// it in order rather than through strides.
    fn matmul_rhs_grad(
        lhs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        rhs_transposed: bool,
    ) -> FloatTensor<Self> {
        let _ = rhs_transposed;
        Self::matmul(Self::float_transpose(lhs), grad)
    }

    /// `x / sqrt(mean(x², last dim) + epsilon) * gamma`, `gamma` of the last
    /// dimension's size.
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self> {
        let (x, shape) = rows::<Self>(x);
        let rms = (x.clone().square().mean_dim(1) + epsilon).sqrt();
        let y = x / rms * float::<Self, 1>(gamma).unsqueeze::<2>();
        Self::float_reshape(primitive(y), shape)
    }

    /// The gradients of [`rms_norm`](ModelBackend::rms_norm) with respect to
    /// `x` and `gamma`, given the output's gradient `grad`.
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, shape) = rows::<Self>(x);
        let (grad, _) = rows::<Self>(grad);
        let d = x.dims()[1] as f64;
        let inv = (x.clone().square().mean_dim(1) + epsilon).sqrt().recip();
        let gamma = float::<Self, 1>(gamma);
        let dgamma = (grad.clone() * x.clone() * inv.clone())
            .sum_dim(0)
            .squeeze_dim::<1>(0);
        let scaled = grad * gamma.unsqueeze::<2>();
        let dot = (scaled.clone() * x.clone()).sum_dim(1);
        let dx = scaled * inv.clone() - x * inv.powi_scalar(3) * dot / d;
        (
            Self::float_reshape(primitive(dx), shape),
            dgamma.into_primitive().tensor(),
        )
    }

    /// SwiGLU's gating: `silu(gate) * up`, with burn's `silu(g) = g * sigmoid(g)`
    /// (finite gradients everywhere), element-wise over tensors of one shape.
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let gate = float::<Self, 1>(gate);
        primitive(burn::tensor::activation::silu(gate) * float::<Self, 1>(up))
    }

    /// The gradients of [`swiglu`](ModelBackend::swiglu) with respect to
    /// `gate` and `up`, given the output's gradient `grad`: what burn's
    /// autodiff derives from `silu(gate) * up`, term by term.
    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (gate, up, grad) = (
            float::<Self, 1>(gate),
            float::<Self, 1>(up),
            float::<Self, 1>(grad),
        );
        let s = burn::tensor::activation::sigmoid(gate.clone());
        let d_silu = grad.clone() * up;
        let d_sigmoid = Self::sigmoid_backward(
            primitive(s.clone()),
            primitive(d_silu.clone() * gate.clone()),
        );
        let d_gate = d_silu * s.clone() + float::<Self, 1>(d_sigmoid);
        let d_up = grad * (gate * s);
        (primitive(d_gate), primitive(d_up))
    }

    /// Rotary position embedding in HF's "rotate half" form, then a scale,
    /// with the heads brought before the tokens: `x` is `[batch, seq,
    /// heads, d]` (projected queries or keys, token-major) and the result
    /// `(x * cos + rotate_half(x) * sin) * scale` is `[batch, heads, seq,
    /// d]`, where `rotate_half(x)` is `[-x₂, x₁]` for the halves `[x₁, x₂]`
    /// of the last dimension and a token's row of `cos` and `sin` (`[batch *
    /// seq, d]`) serves all its heads. A scale of 1 is no operation. `cos`
    /// and `sin` are constants (no gradient flows to them). The default is
    /// burn's operations, with `rotate_half` as a product with a signed
    /// permutation matrix, then [`permute_contiguous`](ModelBackend::permute_contiguous);
    /// the CPU backend does it in one pass with the same bits.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        let [b, s, h, d] = burn::tensor::TensorMetadata::shape(&x).dims::<4>();
        let x = float::<Self, 4>(x).reshape([b * s, h, d]);
        let rotated = float::<Self, 2>(Self::matmul(
            primitive(x.clone().reshape([b * s * h, d])),
            primitive(rotate_half_matrix::<Self>(d, &x.device())),
        ));
        let per_token = |table| float::<Self, 2>(table).reshape([b * s, 1, d]);
        let mut y = x * per_token(cos) + rotated.reshape([b * s, h, d]) * per_token(sin);
        if scale != 1.0 {
            y = y * scale;
        }
        Self::permute_contiguous(primitive(y.reshape([b, s, h, d])), &[0, 2, 1, 3])
    }

    /// The gradient of [`rope`](ModelBackend::rope) with respect to `x`
    /// (`[batch, seq, heads, d]`), given the output's gradient `grad`
    /// (`[batch, heads, seq, d]`): what burn's autodiff derives from the
    /// default's operations, `g * cos + rotate_half⁻¹(g * sin)` with `g =
    /// grad * scale` brought back to token-major order.
    fn rope_backward(
        grad: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        let [b, h, s, d] = burn::tensor::TensorMetadata::shape(&grad).dims::<4>();
        let grad = Self::permute_contiguous(grad, &[0, 2, 1, 3]);
        let mut grad = float::<Self, 4>(grad).reshape([b * s, h, d]);
        if scale != 1.0 {
            grad = grad * scale;
        }
        let per_token = |table| float::<Self, 2>(table).reshape([b * s, 1, d]);
        let rotate = rotate_half_matrix::<Self>(d, &grad.device());
        let back = float::<Self, 2>(Self::matmul(
            primitive((grad.clone() * per_token(sin)).reshape([b * s * h, d])),
            primitive(rotate.transpose()),
        ));
        let dx = grad * per_token(cos) + back.reshape([b * s, h, d]);
        primitive(dx.reshape([b, s, h, d]))
    }

    /// Softmax over the last dimension.
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, shape) = rows::<Self>(x);
        Self::float_reshape(primitive(burn::tensor::activation::softmax(x, 1)), shape)
    }

    /// The gradient of [`softmax`](ModelBackend::softmax_last) given its output `y`
    /// and the output's gradient: `y * (grad - sum(grad * y))`.
    fn softmax_last_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let (y, shape) = rows::<Self>(y);
        let (grad, _) = rows::<Self>(grad);
        let dot = (grad.clone() * y.clone()).sum_dim(1);
        Self::float_reshape(primitive(y * (grad - dot)), shape)
    }

    /// Softmax over the last dimension of attention scores under a causal
    /// mask, for [`causal_softmax`]: see there for the shapes. The bits of
    /// [`softmax_last`](ModelBackend::softmax_last) of the scores plus the
    /// mask's additive bias ([`CausalMask::bias`]), which is what the
    /// default computes. The CPU backend never makes the bias and
    /// exponentiates only the keys each row sees. The backward pass is
    /// [`softmax_last_backward`](ModelBackend::softmax_last_backward).
    fn causal_softmax(scores: FloatTensor<Self>, mask: &CausalMask) -> FloatTensor<Self> {
        let shape = burn::tensor::TensorMetadata::shape(&scores);
        let (heads, rows) = (shape[1], shape[2]);
        let bias = mask.bias::<Self>(heads, 0..rows, &Self::float_device(&scores));
        Self::softmax_last(Self::float_add(scores, primitive(bias)))
    }

    /// Log-softmax over the last dimension.
    fn log_softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, shape) = rows::<Self>(x);
        Self::float_reshape(
            primitive(burn::tensor::activation::log_softmax(x, 1)),
            shape,
        )
    }

    /// The gradient of [`log_softmax`](ModelBackend::log_softmax_last) given its
    /// output `y`: `grad - exp(y) * sum(grad)`.
    fn log_softmax_last_backward(
        y: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (y, shape) = rows::<Self>(y);
        let (grad, _) = rows::<Self>(grad);
        let total = grad.clone().sum_dim(1);
        Self::float_reshape(primitive(grad - y.exp() * total), shape)
    }

    /// Each row's log-probability of its target, `log_softmax(logits)[target]`
    /// over the last dimension, and each row's log-sum-exp (what the
    /// backward pass needs instead of the log-softmax's full output), for
    /// [`token_log_probs`]: see there for the shapes. The default is burn's
    /// operations; the CPU backend reads each row once and keeps no
    /// vocabulary-wide output.
    fn token_log_probs_with_lse(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        ops_token_log_probs_with_lse::<Self>(logits, targets)
    }

    /// [`token_log_probs_with_lse`](ModelBackend::token_log_probs_with_lse)'s
    /// log-probabilities alone.
    fn token_log_probs(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        Self::token_log_probs_with_lse(logits, targets).0
    }

    /// The gradient of [`token_log_probs`](ModelBackend::token_log_probs)
    /// with respect to the logits, given the rows' log-sum-exp `lse` and the
    /// log-probabilities' gradient `grad`: in each row,
    /// `onehot(target) * g - exp(logits - lse) * g`, what burn's autodiff
    /// derives for a log-softmax followed by a gather.
    fn token_log_probs_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        ops_token_log_probs_backward::<Self>(logits, targets, lse, grad)
    }

    /// The rows of a `[vocab, hidden]` table named by `indices`, for
    /// [`embed_tokens`]: burn's `embedding`.
    fn embed_tokens(weights: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        Self::embedding(weights, indices)
    }

    /// The gradient of [`embed_tokens`](ModelBackend::embed_tokens) with
    /// respect to the table `weights` (read for its shape and device only),
    /// given the output's gradient `grad`: starting from zeros, each
    /// token's gradient row is added to its id's row, in token order. The
    /// default is burn's `embedding_backward`; the CPU backend gives its
    /// bits without filling and copying a table-sized buffer first, and
    /// writes only the rows of ids that occur.
    fn embed_tokens_backward(
        weights: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::embedding_backward(weights, grad, indices)
    }

    /// [`dense_attention`]'s output and the probabilities it computes (the
    /// softmax of the masked scores, which its backward pass reads): see
    /// there for the shapes. The default is [`matmul`](ModelBackend::matmul),
    /// [`causal_softmax`](ModelBackend::causal_softmax) and `matmul` one
    /// after the other; the CPU backend computes each key/value head's
    /// products and softmax on one thread, with the same bits.
    fn dense_attention_with_probs(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed_dense_attention::<Self>(q, k, v, mask)
    }

    /// [`dense_attention`] as one operation: under autodiff, one node whose
    /// backward pass is [`dense_attention_backward`](ModelBackend::dense_attention_backward).
    fn dense_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> FloatTensor<Self> {
        Self::dense_attention_with_probs(q, k, v, mask).0
    }

    /// The gradients of [`dense_attention`] with respect to `q`, `k` and
    /// `v`, given the probabilities `probs` and the output's gradient
    /// `grad`: the bits of the backward passes of its three operations (the
    /// default runs them).
    fn dense_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed_dense_attention_backward::<Self>(q, k, v, probs, grad)
    }

    /// Causal attention `softmax(q k^T + mask) v` and each query row's
    /// log-sum-exp of its scores, for [`attention`]: see there for the
    /// shapes. The default (burn's operations) holds the scores of
    /// [`ATTENTION_BLOCK_ROWS`] query rows at a time; the CPU backend
    /// computes one row at a time.
    fn causal_attention_with_lse(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        dense_causal_attention_with_lse::<Self>(q, k, v, mask, ATTENTION_BLOCK_ROWS)
    }

    /// [`attention`] as one operation: under autodiff, one node whose
    /// backward pass is [`causal_attention_backward`](ModelBackend::causal_attention_backward).
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> FloatTensor<Self> {
        Self::causal_attention_with_lse(q, k, v, mask).0
    }

    /// The gradients of [`attention`] with respect to `q`, `k` and `v`,
    /// given its output `out`, the rows' log-sum-exp `lse` and the output's
    /// gradient `grad`; the probabilities are recomputed from `q`, `k` and
    /// `lse`, never saved.
    #[allow(clippy::too_many_arguments)] // q, k, v, the saved output and log-sum-exp, the gradient, the mask
    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        mask: &CausalMask,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        dense_causal_attention_backward::<Self>(q, k, v, out, lse, grad, mask, ATTENTION_BLOCK_ROWS)
    }

    /// `x` with its dimensions permuted (as burn's `permute`: output
    /// dimension `i` is input dimension `axes[i]`), laid out contiguously
    /// where the backend would otherwise copy it later, element by element
    /// (the CPU backend). Under autodiff the gradient goes back the same way.
    fn permute_contiguous(x: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        Self::float_permute(x, axes)
    }

    /// `x` in f32 (itself when it is already): how frozen weights stored in
    /// a half-precision dtype enter the f32 computation. The CPU backend
    /// widens bf16 by moving its bits (exact, in parallel).
    fn to_f32(x: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::tensor::TensorMetadata;
        if x.dtype() == burn::tensor::DType::F32 {
            x
        } else {
            Self::float_cast(x, burn::tensor::FloatDType::F32)
        }
    }

    /// `a + b`, element by element, for two tensors of one shape: the
    /// residual stream's additions. The CPU backend spreads them over its
    /// threads (burn-flex's own addition runs on one thread below 4M
    /// elements); each element is the same single rounding either way.
    fn add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_add(a, b)
    }

    /// The sum of all elements, as a tensor of shape `[1]`.
    fn sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_sum(x)
    }

    /// One AdamW update of `param` given its gradient `grad` and the moments
    /// before it (`None` at the first update), with the arithmetic of
    /// burn's `AdamW` (no AMSGrad, plain decoupled weight decay) term by
    /// term; returns the parameter and the two moments after it. Any shape,
    /// all four alike. The CPU backend fuses it into one pass.
    fn adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: &AdamWStep,
    ) -> [FloatTensor<Self>; 3] {
        let (factor_1, factor_2) = (1.0 - step.beta_1, 1.0 - step.beta_2);
        let grad = float::<Self, 1>(grad);
        let (moment_1, moment_2) = match moments {
            Some((m, v)) => (
                float::<Self, 1>(m)
                    .mul_scalar(step.beta_1)
                    .add(grad.clone().mul_scalar(factor_1)),
                float::<Self, 1>(v)
                    .mul_scalar(step.beta_2)
                    .add(grad.square().mul_scalar(factor_2)),
            ),
            None => (
                grad.clone().mul_scalar(factor_1),
                grad.square().mul_scalar(factor_2),
            ),
        };
        let [correction_1, correction_2] = step.corrections();
        let delta = moment_1.clone().div_scalar(correction_1).div(
            moment_2
                .clone()
                .div_scalar(correction_2)
                .sqrt()
                .add_scalar(step.epsilon),
        );
        let param = float::<Self, 1>(param);
        let decay_rate = step.decay_rate();
        let decayed = if decay_rate == 0.0 {
            param
        } else {
            param.mul_scalar(1.0 - decay_rate)
        };
        [
            primitive(decayed - delta.mul_scalar(step.lr)),
            primitive(moment_1),
            primitive(moment_2),
        ]
    }

    /// `tensor[ranges] = value` (burn's `slice_assign`, one range per
    /// dimension), reusing `tensor`'s buffer when nothing else holds it: a
    /// KV cache appends a column without copying the whole cache.
    fn write_slice(
        tensor: FloatTensor<Self>,
        ranges: &[std::ops::Range<usize>],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let slices: Vec<burn::tensor::Slice> = ranges.iter().cloned().map(Into::into).collect();
        Self::float_slice_assign(tensor, &slices, value)
    }
}

/// `tensor[ranges] = value`, in place when `tensor` is the only owner of its
/// buffer ([`ModelBackend::write_slice`]).
///
/// # Shapes
/// - `value`: the lengths of `ranges`; returns `tensor`'s shape.
pub fn write_slice<B: ModelBackend, const D: usize>(
    tensor: Tensor<B, D>,
    ranges: [std::ops::Range<usize>; D],
    value: Tensor<B, D>,
) -> Tensor<B, D> {
    float(B::write_slice(primitive(tensor), &ranges, primitive(value)))
}

/// The settings of one AdamW update ([`ModelBackend::adamw_step`]), as
/// burn's `AdamWConfig` names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// Decay of the first moment.
    pub beta_1: f32,
    /// Decay of the second moment.
    pub beta_2: f32,
    /// Added to the second moment's square root.
    pub epsilon: f32,
    /// Decoupled weight decay (scaled by the learning rate).
    pub weight_decay: f32,
    /// The learning rate.
    pub lr: f64,
    /// The update's number, from 1 (bias correction).
    pub time: usize,
}

impl AdamWStep {
    /// The bias corrections `1 - beta^time` of the two moments, in f32 as
    /// burn computes them.
    pub fn corrections(&self) -> [f32; 2] {
        let time = self.time as i32;
        [1f32 - self.beta_1.powi(time), 1f32 - self.beta_2.powi(time)]
    }

    /// `lr * weight_decay`, the parameter's decay this update.
    pub fn decay_rate(&self) -> f64 {
        self.lr * self.weight_decay as f64
    }
}

/// One AdamW update ([`ModelBackend::adamw_step`]): the parameter and the
/// two moments after it.
pub fn adamw_step<B: ModelBackend, const D: usize>(
    param: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
    step: &AdamWStep,
) -> [Tensor<B, D>; 3] {
    let shape = param.shape();
    let moments = moments.map(|(m, v)| (primitive(m), primitive(v)));
    B::adamw_step(primitive(param), primitive(grad), moments, step)
        .map(|x| float::<B, D>(x).reshape(shape.clone()))
}

/// A training backend: automatic differentiation over a [`ModelBackend`],
/// itself a [`ModelBackend`] (what the trainer and anything that calls
/// `.valid()` on a model needs).
pub trait AutodiffModelBackend:
    burn::tensor::backend::AutodiffBackend<InnerBackend: ModelBackend> + ModelBackend
{
}

impl<B> AutodiffModelBackend for B
where
    B: burn::tensor::backend::AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
}

/// `rotate_half` as a matrix `R` (`[d, d]`): `(x R)[j] = -x[j + d/2]` for
/// `j < d/2`, `x[j - d/2]` otherwise.
fn rotate_half_matrix<B: Backend>(d: usize, device: &B::Device) -> Tensor<B, 2> {
    let half = d / 2;
    let mut rotate = vec![0.0f32; d * d];
    for j in 0..half {
        rotate[(j + half) * d + j] = -1.0;
        rotate[j * d + j + half] = 1.0;
    }
    Tensor::from_data(TensorData::new(rotate, [d, d]), device)
}

/// `x` as a `[rows, last]` tensor, and its original shape.
fn rows<B: Backend>(x: FloatTensor<B>) -> (Tensor<B, 2>, Shape) {
    use burn::tensor::TensorMetadata;
    let shape = x.shape();
    let last = shape.last().copied().unwrap_or(1);
    let rows = shape.num_elements() / last.max(1);
    let tensor =
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x)).reshape::<2, _>([rows, last]);
    (tensor, shape)
}

/// Target token ids of any shape as a `[rows, 1]` tensor for `gather`.
fn token_targets<B: Backend>(targets: IntTensor<B>, rows: usize) -> Tensor<B, 2, Int> {
    Tensor::<B, 1, Int>::from_primitive(targets).reshape([rows, 1])
}

fn float<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn primitive<B: Backend, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// `lhs @ rhs` over the last two dimensions, with equal leading dimensions.
///
/// # Shapes
/// - `lhs`: `[..., m, k]`, `rhs`: `[..., k, n]`; returns `[..., m, n]`.
pub fn matmul<B: ModelBackend, const D: usize>(
    lhs: Tensor<B, D>,
    rhs: Tensor<B, D>,
) -> Tensor<B, D> {
    let (l, r) = (lhs.dims(), rhs.dims());
    assert!(
        D >= 2 && l[..D - 2] == r[..D - 2] && l[D - 1] == r[D - 2],
        "matmul: shapes {l:?} and {r:?} do not multiply (equal leading dimensions, [.., m, k] @ [.., k, n])"
    );
    float(B::matmul(primitive(lhs), primitive(rhs)))
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + epsilon) * gamma`.
///
/// # Shapes
/// - `x`: `[..., d]`, `gamma`: `[d]`; returns the shape of `x`.
pub fn rms_norm<B: ModelBackend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> Tensor<B, D> {
    float(B::rms_norm(primitive(x), primitive(gamma), epsilon))
}

/// SwiGLU's gating: `silu(gate) * up`, element-wise.
///
/// # Shapes
/// - `gate`, `up`: the same shape, returned.
pub fn swiglu<B: ModelBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    assert_eq!(
        gate.dims(),
        up.dims(),
        "swiglu: gate and up must have the same shape"
    );
    float(B::swiglu(primitive(gate), primitive(up)))
}

/// Rotary position embedding ("rotate half"), then a scale, with the heads
/// brought before the tokens: `(x * cos + rotate_half(x) * sin) * scale`
/// (see [`ModelBackend::rope`]).
///
/// # Shapes
/// - `x`: `[batch, seq, heads, head_dim]` (token-major), `head_dim` even
/// - `cos`, `sin`: `[batch * seq, head_dim]` (one row per token)
/// - returns `[batch, heads, seq, head_dim]`
pub fn rope<B: ModelBackend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    scale: f64,
) -> Tensor<B, 4> {
    let [b, s, _, d] = x.dims();
    assert!(
        d % 2 == 0 && cos.dims() == [b * s, d] && sin.dims() == [b * s, d],
        "rope: x {:?} needs an even last dimension and cos {:?} and sin {:?} one row per token ({} x {d})",
        x.dims(),
        cos.dims(),
        sin.dims(),
        b * s
    );
    float(B::rope(primitive(x), primitive(cos), primitive(sin), scale))
}

/// Softmax over the last dimension.
pub fn softmax<B: ModelBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    float(B::softmax_last(primitive(x)))
}

/// Softmax over the keys of attention scores under a causal mask: the same
/// bits as [`softmax`] of the scores plus [`CausalMask::bias`] (0 where a
/// query sees a key, `-inf` elsewhere), as one operation whose backward
/// pass is the softmax's.
///
/// # Shapes
/// - `scores`: `[batch, kv_heads, group * seq, start + seq]` (the mask's
///   batch rows, query rows stacked head-major as in [`attention`], and
///   keys); returns the same shape.
pub fn causal_softmax<B: ModelBackend>(scores: Tensor<B, 4>, mask: &CausalMask) -> Tensor<B, 4> {
    let [b, _, rows, keys] = scores.dims();
    assert!(
        mask.fits(b, rows, keys),
        "causal_softmax: the mask ({} rows, start {}, seq {}) does not fit scores {:?}",
        mask.pad_left.len(),
        mask.start,
        mask.seq,
        scores.dims()
    );
    float(B::causal_softmax(primitive(scores), mask))
}

/// Log-softmax over the last dimension.
pub fn log_softmax<B: ModelBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    float(B::log_softmax_last(primitive(x)))
}

/// The rows of the table `weights` named by `indices` (a token embedding),
/// as burn's `embedding` computes them; its backward pass is
/// [`ModelBackend::embed_tokens_backward`], which on the CPU backend gives
/// the bits of burn's while writing only the rows of ids that occur.
///
/// # Shapes
/// - `weights`: `[vocab, hidden]`, `indices`: `[batch, seq]` (ids below
///   `vocab`); returns `[batch, seq, hidden]`.
pub fn embed_tokens<B: ModelBackend>(
    weights: Tensor<B, 2>,
    indices: Tensor<B, 2, Int>,
) -> Tensor<B, 3> {
    float(B::embed_tokens(
        primitive(weights),
        indices.into_primitive(),
    ))
}

/// Each position's log-probability of its target token,
/// `log_softmax(logits)[.., target]`, as one operation: the log-softmax's
/// vocabulary-wide output is never made (under autodiff the backward pass
/// recomputes what it needs from the logits and each row's log-sum-exp).
/// On the CPU backend the same bits as [`log_softmax`] followed by burn's
/// `gather`, forward and backward.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`, `targets`: `[batch, seq]` (ids below
///   `vocab`); returns `[batch, seq]`.
pub fn token_log_probs<B: ModelBackend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 2> {
    let ([b, s, _], t) = (logits.dims(), targets.dims());
    assert_eq!(
        [b, s],
        t,
        "token_log_probs: logits {:?} and targets {t:?} differ in their leading dimensions",
        logits.dims()
    );
    float(B::token_log_probs(
        primitive(logits),
        targets.into_primitive(),
    ))
}

/// `x` with its dimensions permuted (output dimension `i` is input
/// dimension `axes[i]`) and laid out contiguously: the reshapes that follow
/// (merging heads, splitting them) are then free, forward and backward.
/// Values are moved, never computed: the same bits as `permute`.
pub fn permute_contiguous<B: ModelBackend, const D: usize>(
    x: Tensor<B, D>,
    axes: [usize; D],
) -> Tensor<B, D> {
    let mut seen = [false; D];
    for &a in &axes {
        assert!(
            a < D && !std::mem::replace(&mut seen[a], true),
            "permute_contiguous: {axes:?} is not a permutation of 0..{D}"
        );
    }
    float(B::permute_contiguous(primitive(x), &axes))
}

/// `x` in f32: half-precision storage widened for computation (a no-op
/// for f32 tensors).
pub fn to_f32<B: ModelBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    float(B::to_f32(primitive(x)))
}

/// `a + b`, element by element (see [`ModelBackend::add`]).
///
/// # Shapes
/// - `a`, `b`: one shape (no broadcasting); returns it.
pub fn add<B: ModelBackend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    assert_eq!(
        a.dims(),
        b.dims(),
        "add: the operands' shapes differ (no broadcasting here)"
    );
    float(B::add(primitive(a), primitive(b)))
}

/// The bits of a tensor's values as f32, in row-major order: what the
/// bit-for-bit checks of mappa's kernels, optimisers and runs compare.
pub fn bits<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<u32> {
    let values = x.into_data().convert::<f32>().to_vec::<f32>();
    values
        .expect("f32 values after conversion")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The sum of all elements.
///
/// # Shapes
/// - returns `[1]`.
pub fn sum<B: ModelBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, 1> {
    float(B::sum(primitive(x)))
}

/// [`ModelBackend::token_log_probs_with_lse`] by burn's operations (the
/// trait's default, what GPU backends run).
fn ops_token_log_probs_with_lse<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, shape) = rows::<B>(logits);
    let targets = token_targets::<B>(targets, x.dims()[0]);
    let max = x.clone().max_dim(1);
    let lse = max.clone() + (x.clone() - max).exp().sum_dim(1).log();
    let picked = x.gather(1, targets) - lse.clone();
    let leading = Shape::from(shape[..shape.len() - 1].to_vec());
    (
        B::float_reshape(primitive(picked), leading.clone()),
        B::float_reshape(primitive(lse), leading),
    )
}

/// [`ModelBackend::token_log_probs_backward`] by burn's operations (the
/// trait's default).
fn ops_token_log_probs_backward<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    lse: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let (x, shape) = rows::<B>(logits);
    let n = x.dims()[0];
    let targets = token_targets::<B>(targets, n);
    let lse = float::<B, 1>(lse).reshape([n, 1]);
    let grad = float::<B, 1>(grad).reshape([n, 1]);
    let onehot = x
        .zeros_like()
        .scatter(1, targets, grad.clone(), IndexingUpdateOp::Add);
    let dx = onehot - (x - lse).exp() * grad;
    B::float_reshape(primitive(dx), shape)
}

#[cfg(feature = "ndarray")]
impl ModelBackend for burn::backend::NdArray {
    const ONE_DEVICE: bool = true;
}

#[cfg(feature = "wgpu")]
impl ModelBackend for burn::backend::Wgpu {}

#[cfg(feature = "cuda")]
impl ModelBackend for burn::backend::Cuda {}

#[cfg(feature = "tch")]
impl ModelBackend for burn::backend::LibTorch {}
