//! Rotary position embeddings in the HuggingFace convention ("rotate half":
//! the first and second halves of each head form the rotated pairs), with the
//! `llama3` frequency scaling of Llama 3.1+.
//!
//! Angles are computed on the host from explicit per-token positions, so
//! left-padded batches (where each row starts at its own column) and
//! KV-cached decoding need no precomputed table and no length limit.

use burn::prelude::*;

use crate::config::{Llama3RopeScaling, RopeConfig};

/// The inverse frequencies of one head, and the means to rotate queries and keys.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

/// Cosines and sines for one batch of positions.
///
/// # Shapes
/// - `cos`, `sin`: `[batch, 1, seq, head_dim / 2]`
#[derive(Debug, Clone)]
pub struct RopeAngles<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
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

    /// Angles for `positions` (row-major `[batch, seq]`).
    pub fn angles<B: Backend>(
        &self,
        positions: &[usize],
        batch: usize,
        seq: usize,
        device: &B::Device,
    ) -> RopeAngles<B> {
        debug_assert_eq!(positions.len(), batch * seq);
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let shape = [batch, 1, seq, half];
        RopeAngles {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
        }
    }
}

impl<B: Backend> RopeAngles<B> {
    /// Rotates `x`.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`; returns the same shape.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, h, s, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().slice([0..b, 0..h, 0..s, 0..half]);
        let x2 = x.slice([0..b, 0..h, 0..s, half..d]);
        let r1 = x1.clone() * self.cos.clone() - x2.clone() * self.sin.clone();
        let r2 = x2 * self.cos.clone() + x1 * self.sin.clone();
        Tensor::cat(vec![r1, r2], 3)
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
        let x = Tensor::<TestBackend, 4>::random(
            [1, 2, 3, 8],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let angles = rope.angles::<TestBackend>(&[0, 5, 9], 1, 3, &device);
        let y = angles.apply(x.clone());
        let norm =
            |t: Tensor<TestBackend, 4>| t.square().sum_dim(3).into_data().to_vec::<f32>().unwrap();
        for (a, b) in norm(x.clone()).iter().zip(norm(y.clone())) {
            assert!((a - b).abs() < 1e-4);
        }
        let x0 = x
            .slice([0..1, 0..2, 0..1, 0..8])
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let y0 = y
            .slice([0..1, 0..2, 0..1, 0..8])
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(x0, y0);
    }
}
