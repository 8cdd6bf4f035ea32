//! Teacher-forced per-token log-probs of completions given prompts: the
//! quantity REINFORCE++/PPO needs for the policy, the frozen reference and
//! the rollout (old) policy.
//!
//! A batch of (prompt, completion) pairs is laid out with prompts left-padded
//! to a common width `P` and completions right-padded to a common width `C`:
//!
//! ```text
//! row 0:  pad pad p p p | c c c c pad
//! row 1:  p p p p p p p | c c pad pad
//! ```
//!
//! so every completion starts at column `P`, and the hidden states of columns
//! `P-1 .. P+C-1` predict completion tokens `0 .. C`. Only those columns go
//! through the output projection. Under an autodiff backend the result is
//! differentiable with respect to the model's weights.

use burn::prelude::*;

use crate::error::{ModelError, Result};
use crate::kernels::{self, ModelBackend};
use crate::transformer::{Transformer, Window};

/// Per-token log-probs of a batch of completions.
///
/// # Shapes
/// - `logprobs`: `[batch, completion_width]` (0 at padding)
/// - `mask`: `[batch, completion_width]`, 1 for real completion tokens, 0 for padding
#[derive(Debug, Clone)]
pub struct CompletionLogprobs<B: Backend> {
    /// `log_softmax(logits / T)` at each completion token.
    pub logprobs: Tensor<B, 2>,
    /// Which entries are real tokens.
    pub mask: Tensor<B, 2>,
    /// Length of each completion.
    pub lengths: Vec<usize>,
}

/// Computes `log p(completion_t | prompt, completion_<t)` for every
/// completion token of every pair, at temperature `temperature` (use the
/// sampling temperature of the rollout; 1 for greedy).
///
/// `pairs` are `(prompt, completion)` token ids in any form that borrows as
/// `[u32]`, the same as [`generate`](crate::generate())'s prompts:
/// `&[(&[u32], &[u32])]`, `&[(Vec<u32>, Vec<u32>)]`, ...
pub fn completion_logprobs<B: ModelBackend>(
    model: &Transformer<B>,
    pairs: &[(impl AsRef<[u32]>, impl AsRef<[u32]>)],
    temperature: f32,
) -> Result<CompletionLogprobs<B>> {
    let pairs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, c)| (p.as_ref(), c.as_ref()))
        .collect();
    if pairs.is_empty() {
        return Err(ModelError::Input("no (prompt, completion) pairs".into()));
    }
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(ModelError::Input(format!(
            "temperature {temperature} must be positive"
        )));
    }
    let vocab = model.config().vocab_size;
    for (i, (p, c)) in pairs.iter().enumerate() {
        if p.is_empty() {
            return Err(ModelError::Input(format!("pair {i}: the prompt is empty")));
        }
        if let Some(t) = p.iter().chain(c.iter()).find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Input(format!(
                "pair {i}: token id {t} is outside the vocabulary of {vocab}"
            )));
        }
    }
    let device = model.device();
    let batch = pairs.len();
    let p_width = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
    let c_width = pairs.iter().map(|(_, c)| c.len()).max().unwrap_or(0).max(1);
    let pad_left: Vec<usize> = pairs.iter().map(|(p, _)| p_width - p.len()).collect();
    let lengths: Vec<usize> = pairs.iter().map(|(_, c)| c.len()).collect();

    // Input columns 0 .. P+C-1: the last completion token predicts nothing.
    let width = p_width + c_width - 1;
    let mut tokens = Vec::with_capacity(batch * width);
    let mut targets = Vec::with_capacity(batch * c_width);
    let mut mask = Vec::with_capacity(batch * c_width);
    for ((p, c), &pad) in pairs.iter().zip(&pad_left) {
        let row: Vec<i32> = std::iter::repeat_n(0, pad)
            .chain(p.iter().map(|&t| t as i32))
            .chain(c.iter().map(|&t| t as i32))
            .chain(std::iter::repeat(0))
            .take(width)
            .collect();
        tokens.extend(row);
        for j in 0..c_width {
            targets.push(c.get(j).map_or(0, |&t| t as i32));
            mask.push(if j < c.len() { 1.0f32 } else { 0.0 });
        }
    }
    let input = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [batch, width]), &device);
    let window = Window {
        pad_left: &pad_left,
        start: 0,
        len: width,
    };
    let hidden = model.forward_hidden(input, &window, None);
    let h = hidden.dims()[2];
    let hidden = hidden.slice([0..batch, p_width - 1..p_width - 1 + c_width, 0..h]);
    let mut logits = model.logits(hidden);
    if temperature != 1.0 {
        logits = logits / temperature as f64;
    }
    let log_probs = kernels::log_softmax(logits);
    let targets =
        Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [batch, c_width]), &device);
    let mask = Tensor::<B, 2>::from_data(TensorData::new(mask, [batch, c_width]), &device);
    let picked = log_probs
        .gather(2, targets.unsqueeze_dim::<3>(2))
        .squeeze_dim::<2>(2);
    Ok(CompletionLogprobs {
        logprobs: picked * mask.clone(),
        mask,
        lengths,
    })
}

impl<B: Backend> CompletionLogprobs<B> {
    /// The log-probs of each completion on the host, padding dropped.
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        let width = self.logprobs.dims()[1];
        let values = self
            .logprobs
            .to_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 log-probs");
        values
            .chunks(width)
            .zip(&self.lengths)
            .map(|(row, &n)| row[..n].to_vec())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuAutodiff;
    use crate::config::{Family, TransformerConfig};
    use crate::generate::{generate, GenerationConfig};
    use crate::sampling::SamplingConfig;
    use crate::TestBackend;
    use mappa_core::RngStream;

    fn config() -> TransformerConfig {
        TransformerConfig::for_family(Family::Qwen2, 48, 32, 64, 2, 4, 2, 8)
    }

    #[test]
    fn matches_the_sampler_logprobs() {
        let m = config().init_with_std::<TestBackend>(2, 0.4, &Default::default());
        let prompts = vec![vec![1, 2, 3, 4], vec![7, 8]];
        let mut gen_config = GenerationConfig::greedy(6);
        gen_config.sampling = SamplingConfig::with_temperature(0.7);
        let mut rngs = vec![RngStream::from_u64(1), RngStream::from_u64(2)];
        let gens = generate(&m, None, &prompts, &mut rngs, &gen_config).unwrap();
        let pairs: Vec<(&[u32], &[u32])> = prompts
            .iter()
            .zip(&gens)
            .map(|(p, g)| (p.as_slice(), g.token_ids.as_slice()))
            .collect();
        let tf = completion_logprobs(&m, &pairs, 0.7).unwrap();
        for (g, lp) in gens.iter().zip(tf.to_vecs()) {
            assert_eq!(g.logprobs.len(), lp.len());
            for (a, b) in g.logprobs.iter().zip(&lp) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn padding_does_not_change_a_row() {
        let m = config().init_with_std::<TestBackend>(3, 0.4, &Default::default());
        let (p0, c0): (&[u32], &[u32]) = (&[1, 2, 3, 4, 5], &[6, 7]);
        let (p1, c1): (&[u32], &[u32]) = (&[9], &[10, 11, 12, 13]);
        let both = completion_logprobs(&m, &[(p0, c0), (p1, c1)], 1.0)
            .unwrap()
            .to_vecs();
        let alone0 = completion_logprobs(&m, &[(p0, c0)], 1.0).unwrap().to_vecs();
        let alone1 = completion_logprobs(&m, &[(p1, c1)], 1.0).unwrap().to_vecs();
        for (a, b) in both[0]
            .iter()
            .chain(&both[1])
            .zip(alone0[0].iter().chain(&alone1[0]))
        {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn gradients_flow_to_the_weights() {
        let device = Default::default();
        let m = config().init_with_std::<CpuAutodiff>(4, 0.4, &device);
        let out = completion_logprobs(&m, &[(&[1, 2, 3], &[4, 5])], 1.0).unwrap();
        let loss = -out.logprobs.sum();
        let grads = loss.backward();
        let g = m
            .embed_tokens
            .weight
            .grad(&grads)
            .expect("embedding gradient");
        let norm: f32 = g.square().sum().into_scalar();
        assert!(norm > 0.0 && norm.is_finite());
        let g = m.layers[0]
            .self_attn
            .q_proj
            .weight
            .grad(&grads)
            .expect("q_proj gradient");
        assert!(g.abs().sum().into_scalar() > 0.0);
    }
}
