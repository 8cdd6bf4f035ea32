//! RMSNorm, as the Qwen and Llama families use it, through mappa's
//! fixed-order kernel ([`kernels::rms_norm`]).

use burn::module::Param;
use burn::prelude::*;

use crate::kernels::{self, ModelBackend};

/// Root-mean-square normalisation over the last dimension, then a learned
/// per-feature scale: `x / sqrt(mean(x²) + epsilon) * gamma`.
///
/// The field names are burn-nn's `RmsNorm`'s, so that records written before
/// mappa had its own kernel still load.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// The per-feature scale (HF's `weight`), `[d]`.
    pub gamma: Param<Tensor<B, 1>>,
    /// Added to the mean square before the square root.
    pub epsilon: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// An RMSNorm with the given scale.
    pub fn new(gamma: Tensor<B, 1>, epsilon: f64) -> Self {
        Self {
            gamma: Param::from_tensor(gamma),
            epsilon,
        }
    }
}

impl<B: ModelBackend> RmsNorm<B> {
    /// # Shapes
    /// - `x`: `[..., d]`; returns the same shape.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        kernels::rms_norm(x, self.gamma.val(), self.epsilon)
    }
}
