//! Rotary position embeddings in the HuggingFace convention ("rotate half":
//! the first and second halves of each head form the rotated pairs), with the
//! `llama3` frequency scaling of Llama 3.1+.
//!
//! Angles are computed on the host from explicit per-token positions, so
//! left-padded batches (where each row starts at its own column) and
//! KV-cached decoding need no precomputed table and no length limit.

use burn::prelude::*;

use crate::config::{Llama3RopeScaling, RopeConfig};
use crate::kernels::{self, ModelBackend};

/// The inverse frequencies of one head, and the means to rotate queries and keys.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

/// Cosines and sines of the tokens of one forward call, one row per token
/// (batch-major), which serves all the token's query and key heads: rotation
/// ([`kernels::rope`]: one pass on the CPU backend) reads them as they are.
///
/// # Shapes
/// - `cos`, `sin`: `[tokens, head_dim]`
#[derive(Debug, Clone)]
pub struct RopeTables<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

impl Rope {
    /// The frequencies for heads of width `head_dim`.
    pub fn new(config: &RopeConfig, head_dim: usize) -> Self {
        let half = head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| {
                // As HF: base^(2i/d) in f32.
                let exponent = (2 * i) as f32 / head_dim as f32;
                1.0 / (config.theta as f32).powf(exponent)
            })
            .map(|f| match &config.llama3_scaling {
                Some(s) => llama3_scale(f, s),
                None => f,
            })
            .collect();
        Self { inv_freq }
    }

    /// The inverse frequencies, one per rotated pair.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Tables for tokens at `positions` (one per token, in batch-major
    /// order).
    pub fn tables<B: Backend>(&self, positions: &[usize], device: &B::Device) -> RopeTables<B> {
        let half = self.inv_freq.len();
        let dim = 2 * half;
        let rows = positions.len();
        let mut cos = vec![0.0f32; rows * dim];
        let mut sin = vec![0.0f32; rows * dim];
        let table_rows = cos.chunks_mut(dim).zip(sin.chunks_mut(dim));
        for ((cos_row, sin_row), &p) in table_rows.zip(positions) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                // As HF: the angle is computed in f32, then duplicated for both halves.
                let angle = p as f32 * f;
                let (s, c) = angle.sin_cos();
                cos_row[i] = c;
                cos_row[i + half] = c;
                sin_row[i] = s;
                sin_row[i + half] = s;
            }
        }
        RopeTables {
            cos: Tensor::from_data(TensorData::new(cos, [rows, dim]), device),
            sin: Tensor::from_data(TensorData::new(sin, [rows, dim]), device),
        }
    }
}

impl<B: ModelBackend> RopeTables<B> {
    /// Rotates `x` (`x * cos + rotate_half(x) * sin`) and brings its heads
    /// before its tokens, as attention reads them.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, heads, head_dim]`, `batch * seq` the tables' tokens
    /// - returns `[batch, heads, seq, head_dim]`
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.apply_scaled(x, 1.0)
    }

    /// [`apply`](Self::apply), then a multiplication by `scale` (the
    /// attention's `1/sqrt(head_dim)` on the queries), in one operation.
    ///
    /// # Shapes
    /// As [`apply`](Self::apply).
    pub fn apply_scaled(&self, x: Tensor<B, 4>, scale: f64) -> Tensor<B, 4> {
        kernels::rope(x, self.cos.clone(), self.sin.clone(), scale)
    }
}

/// Llama 3.1 frequency scaling: low frequencies are slowed by `factor`, high
/// ones kept, and the band between interpolated smoothly.
fn llama3_scale(inv_freq: f32, s: &Llama3RopeScaling) -> f32 {
    let old_ctx = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_ctx / s.low_freq_factor as f32;
    let high_freq_wavelen = old_ctx / s.high_freq_factor as f32;
    let factor = s.factor as f32;
    let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
    if wavelen > low_freq_wavelen {
        inv_freq / factor
    } else if wavelen < high_freq_wavelen {
        inv_freq
    } else {
        let smooth = (old_ctx / wavelen - s.low_freq_factor as f32)
            / (s.high_freq_factor as f32 - s.low_freq_factor as f32);
        (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestBackend;

    #[test]
    fn llama3_scaling_bands() {
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        // Short wavelength: unchanged. Long wavelength: divided by factor.
        assert_eq!(llama3_scale(1.0, &s), 1.0);
        let long = 2.0 * std::f32::consts::PI / 20_000.0;
        assert!((llama3_scale(long, &s) - long / 8.0).abs() < 1e-12);
        // In between: strictly between the two.
        let mid = 2.0 * std::f32::consts::PI / 4000.0;
        let scaled = llama3_scale(mid, &s);
        assert!(scaled < mid && scaled > mid / 8.0);
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let device = Default::default();
        let rope = Rope::new(
            &RopeConfig {
                theta: 10_000.0,
                llama3_scaling: None,
            },
            8,
        );
        // Three tokens at positions 0, 5, 9 (batch 1); two heads each.
        let x = Tensor::<TestBackend, 4>::random(
            [1, 3, 2, 8],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let y = rope
            .tables::<TestBackend>(&[0, 5, 9], &device)
            .apply(x.clone());
        // Heads come first in the result; back to one row per token and head.
        assert_eq!(y.dims(), [1, 2, 3, 8]);
        let y = y.swap_dims(1, 2).reshape([6, 8]);
        let x = x.reshape([6, 8]);
        let norm =
            |t: Tensor<TestBackend, 2>| t.square().sum_dim(1).into_data().to_vec::<f32>().unwrap();
        for (a, b) in norm(x.clone()).iter().zip(norm(y.clone())) {
            assert!((a - b).abs() < 1e-4);
        }
        let x0 = x
            .clone()
            .slice([0..2, 0..8])
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let y0 = y
            .clone()
            .slice([0..2, 0..8])
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(x0, y0);
        // Against the rotate-half definition: pair (i, i + 4) rotates by angle p * inv_freq[i].
        let (xv, yv) = (
            x.into_data().to_vec::<f32>().unwrap(),
            y.into_data().to_vec::<f32>().unwrap(),
        );
        let row = 2; // token at position 5, head 0
        for i in 0..4 {
            let a = 5.0 * rope.inv_freq()[i];
            let (x1, x2) = (xv[row * 8 + i], xv[row * 8 + i + 4]);
            assert!((yv[row * 8 + i] - (x1 * a.cos() - x2 * a.sin())).abs() < 1e-5);
            assert!((yv[row * 8 + i + 4] - (x2 * a.cos() + x1 * a.sin())).abs() < 1e-5);
        }
    }
}
