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

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;

use crate::error::{ModelError, Result};
use crate::kernels::{self, AutodiffModelBackend, ModelBackend};
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
    let layout = PairLayout::new(model, pairs, temperature)?;
    Ok(B::run_step(|| {
        let device = model.device();
        let hidden = model.forward_hidden(layout.input(&device), &layout.window(), None);
        layout.logprobs(model, hidden, temperature)
    }))
}

/// The loss `loss(completion_logprobs(model, pairs, temperature))` and its
/// gradients with respect to the model's trainable parameters, computed one
/// decoder layer at a time (activation recomputation at layer granularity).
///
/// A forward pass without a graph keeps only each layer's input; the output
/// head's graph gives the gradient at the last layer's output; then each
/// layer, last first, is run again on a graph of its own from its saved
/// input, and back-propagates the gradient it receives to its parameters and
/// its input. The graph of one layer is alive at a time, instead of every
/// layer's: saved activations fall from about `layers x` one layer's to one
/// layer's plus a hidden state per layer, for one more forward pass of
/// compute. The gradients are the plain backward pass's, bit for bit on the
/// CPU backend: the same operations on the same shapes, and each
/// parameter's gradient terms added in the same order (tested, tied
/// embeddings and LoRA included).
///
/// `loss` returns the scalar to differentiate and anything else the caller
/// wants from the log-probs (metrics), which is passed through.
pub fn layerwise_gradients<B: AutodiffModelBackend, T>(
    model: &Transformer<B>,
    pairs: &[(impl AsRef<[u32]>, impl AsRef<[u32]>)],
    temperature: f32,
    loss: impl FnOnce(CompletionLogprobs<B>) -> (Tensor<B, 1>, T),
) -> Result<(GradientsParams, T)> {
    let layout = PairLayout::new(model, pairs, temperature)?;
    let device = model.device();
    let window = layout.window();
    let (rows, width, hidden) = (layout.batch, layout.width, model.config().hidden_size);

    // Forward without a graph, keeping each layer's input.
    let frozen = model.valid();
    let inputs = frozen.layer_inputs(&window, rows, &device);
    let mut x = frozen
        .embed(layout.input(&device))
        .reshape([rows * width, hidden]);
    let mut saved = Vec::with_capacity(frozen.layers.len());
    for layer in &frozen.layers {
        saved.push(x.clone());
        x = layer.forward(x, &inputs, None);
    }
    drop((frozen, inputs));

    // The head: the gradient at the last layer's output.
    let mut sum = GradientsAccumulator::<Transformer<B>>::new();
    let top = Tensor::<B, 2>::from_inner(x).require_grad();
    let normed = model
        .norm
        .forward(top.clone())
        .reshape([rows, width, hidden]);
    let (value, extra) = loss(layout.logprobs(model, normed, temperature));
    let grads = value.backward();
    let mut upstream = top
        .grad(&grads)
        .expect("the log-probs depend on the last hidden states");
    sum.accumulate(model, GradientsParams::from_grads(grads, model));

    // Each layer, last first, on a graph of its own.
    let inputs = model.layer_inputs(&window, rows, &device);
    for (layer, x) in model.layers.iter().zip(saved).rev() {
        let x = Tensor::<B, 2>::from_inner(x).require_grad();
        let y = layer.forward(x.clone(), &inputs, None);
        // d(sum(y * g))/dy = g exactly: the layer back-propagates `upstream`.
        let grads = (y * Tensor::from_inner(upstream)).sum().backward();
        upstream = x
            .grad(&grads)
            .expect("a layer's output depends on its input");
        sum.accumulate(model, GradientsParams::from_grads(grads, layer));
    }

    // The embeddings, when they are trained.
    if model.embed_tokens.weight.val().is_require_grad() {
        let e = model
            .embed(layout.input(&device))
            .reshape([rows * width, hidden]);
        let grads = (e * Tensor::from_inner(upstream)).sum().backward();
        sum.accumulate(
            model,
            GradientsParams::from_grads(grads, &model.embed_tokens),
        );
    }
    Ok((sum.grads(), extra))
}

/// A batch of (prompt, completion) pairs laid out as the module docs say:
/// prompts left-padded to `p_width`, completions right-padded to `c_width`.
struct PairLayout {
    batch: usize,
    /// Input columns: `p_width + c_width - 1` (the last completion token
    /// predicts nothing).
    width: usize,
    p_width: usize,
    c_width: usize,
    pad_left: Vec<usize>,
    lengths: Vec<usize>,
    tokens: Vec<i32>,
    targets: Vec<i32>,
    mask: Vec<f32>,
}

impl PairLayout {
    /// Checks the pairs and the temperature, and lays them out.
    fn new<B: Backend>(
        model: &Transformer<B>,
        pairs: &[(impl AsRef<[u32]>, impl AsRef<[u32]>)],
        temperature: f32,
    ) -> Result<Self> {
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
        let batch = pairs.len();
        let p_width = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let c_width = pairs.iter().map(|(_, c)| c.len()).max().unwrap_or(0).max(1);
        let pad_left: Vec<usize> = pairs.iter().map(|(p, _)| p_width - p.len()).collect();
        let lengths: Vec<usize> = pairs.iter().map(|(_, c)| c.len()).collect();
        let width = p_width + c_width - 1;
        let mut tokens = Vec::with_capacity(batch * width);
        let mut targets = Vec::with_capacity(batch * c_width);
        let mut mask = Vec::with_capacity(batch * c_width);
        for ((p, c), &pad) in pairs.iter().zip(&pad_left) {
            tokens.extend(
                std::iter::repeat_n(0, pad)
                    .chain(p.iter().map(|&t| t as i32))
                    .chain(c.iter().map(|&t| t as i32))
                    .chain(std::iter::repeat(0))
                    .take(width),
            );
            for j in 0..c_width {
                targets.push(c.get(j).map_or(0, |&t| t as i32));
                mask.push(if j < c.len() { 1.0f32 } else { 0.0 });
            }
        }
        Ok(Self {
            batch,
            width,
            p_width,
            c_width,
            pad_left,
            lengths,
            tokens,
            targets,
            mask,
        })
    }

    fn window(&self) -> Window<'_> {
        Window {
            pad_left: &self.pad_left,
            start: 0,
            len: self.width,
        }
    }

    /// The input token ids, `[batch, width]`.
    fn input<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        Tensor::from_data(
            TensorData::new(self.tokens.clone(), [self.batch, self.width]),
            device,
        )
    }

    /// The completion tokens' log-probs from the final hidden states
    /// `[batch, width, hidden]` (after the last norm).
    fn logprobs<B: ModelBackend>(
        &self,
        model: &Transformer<B>,
        hidden: Tensor<B, 3>,
        temperature: f32,
    ) -> CompletionLogprobs<B> {
        let device = hidden.device();
        let (batch, c_width, p_width) = (self.batch, self.c_width, self.p_width);
        let h = hidden.dims()[2];
        let hidden = hidden.slice([0..batch, p_width - 1..p_width - 1 + c_width, 0..h]);
        let mut logits = model.logits(hidden);
        if temperature != 1.0 {
            logits = logits / temperature as f64;
        }
        let targets = Tensor::<B, 2, Int>::from_data(
            TensorData::new(self.targets.clone(), [batch, c_width]),
            &device,
        );
        let mask = Tensor::<B, 2>::from_data(
            TensorData::new(self.mask.clone(), [batch, c_width]),
            &device,
        );
        let picked = kernels::token_log_probs(logits, targets);
        CompletionLogprobs {
            logprobs: picked * mask.clone(),
            mask,
            lengths: self.lengths.clone(),
        }
    }
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

    /// Compares every parameter's gradient in `a` and `b`: returns the
    /// largest absolute difference, the largest magnitude, and how many
    /// parameters had a gradient in each.
    struct Compare<'a> {
        a: &'a GradientsParams,
        b: &'a GradientsParams,
        worst: f32,
        scale: f32,
        counts: (usize, usize),
    }

    impl<'a> Compare<'a> {
        /// `a` and `b` compared over `model`'s parameters.
        fn of(
            model: &Transformer<CpuAutodiff>,
            a: &'a GradientsParams,
            b: &'a GradientsParams,
        ) -> Self {
            let mut compare = Compare {
                a,
                b,
                worst: 0.0,
                scale: 0.0,
                counts: (0, 0),
            };
            model.visit(&mut compare);
            compare
        }
    }

    impl burn::module::ModuleVisitor<CpuAutodiff> for Compare<'_> {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<Tensor<CpuAutodiff, D>>,
        ) {
            let a = self.a.get::<crate::Cpu, D>(param.id);
            let b = self.b.get::<crate::Cpu, D>(param.id);
            self.counts.0 += a.is_some() as usize;
            self.counts.1 += b.is_some() as usize;
            if let (Some(a), Some(b)) = (a, b) {
                let diff: f32 = (a.clone() - b).abs().max().into_scalar();
                let scale: f32 = a.abs().max().into_scalar();
                self.worst = self.worst.max(diff);
                self.scale = self.scale.max(scale);
            }
        }
    }

    fn compare_layerwise(m: &Transformer<CpuAutodiff>) -> (f32, f32, (usize, usize)) {
        let pairs: [(&[u32], &[u32]); 2] =
            [(&[1, 2, 3, 4], &[5, 6, 7]), (&[9, 8], &[10, 11, 12, 13])];
        let loss_of = |out: CompletionLogprobs<CpuAutodiff>| -> Tensor<CpuAutodiff, 1> {
            // Weighted so that every position matters differently.
            let w = Tensor::<CpuAutodiff, 1>::from_floats(
                [0.5, -1.0, 2.0, 0.25],
                &out.logprobs.device(),
            );
            (out.logprobs * w.unsqueeze::<2>()).sum()
        };
        let plain_loss = loss_of(completion_logprobs(m, &pairs, 0.8).unwrap());
        let plain_value: f32 = plain_loss.clone().into_scalar();
        let plain = GradientsParams::from_grads(plain_loss.backward(), m);
        let (layerwise, value) = layerwise_gradients(m, &pairs, 0.8, |out| {
            let loss = loss_of(out);
            let value: f32 = loss.clone().into_scalar();
            (loss, value)
        })
        .unwrap();
        assert_eq!(value, plain_value);
        let compare = Compare::of(m, &plain, &layerwise);
        (compare.worst, compare.scale, compare.counts)
    }

    /// The same bits: each layer's recomputed graph runs the plain pass's
    /// operations on the same shapes, and a parameter's gradient terms add
    /// up in the same order.
    #[test]
    fn layerwise_gradients_are_the_plain_backward_passes() {
        let device = Default::default();
        for tied in [false, true] {
            let full = config()
                .with_tie_word_embeddings(tied)
                .init_with_std::<CpuAutodiff>(5, 0.4, &device);
            let (worst, scale, (a, b)) = compare_layerwise(&full);
            assert_eq!(a, b);
            assert!(a > 10, "{a} parameters with gradients");
            assert!(
                scale > 0.0 && worst == 0.0,
                "tied {tied}: {worst} against {scale}"
            );
        }

        // LoRA: only the adapters have gradients (B made non-zero so that A has one too).
        let mut rng = RngStream::from_u64(9);
        let adapted = config()
            .init_with_std::<CpuAutodiff>(5, 0.4, &device)
            .with_lora(&crate::LoraConfig::new(2, 4.0), &mut rng)
            .unwrap()
            .map(&mut NudgeB(RngStream::from_u64(3)));
        let (worst, scale, (a, b)) = compare_layerwise(&adapted);
        assert_eq!(a, b);
        assert_eq!(
            a,
            2 * 7 * config().num_layers,
            "only the adapters are trained"
        );
        assert!(scale > 0.0 && worst == 0.0, "{worst} against {scale}");
    }

    /// Gives every zero matrix (the adapters' B) small random values.
    struct NudgeB(RngStream);

    impl burn::module::ModuleMapper<CpuAutodiff> for NudgeB {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<Tensor<CpuAutodiff, D>>,
        ) -> burn::module::Param<Tensor<CpuAutodiff, D>> {
            let (id, tensor, mapper) = param.consume();
            let zero: f32 = tensor.clone().abs().max().into_scalar();
            let tensor = if D == 2 && zero == 0.0 {
                let shape = tensor.shape();
                let values: Vec<f32> = (0..shape.num_elements())
                    .map(|_| (self.0.uniform() as f32 - 0.5) * 0.2)
                    .collect();
                Tensor::from_data(TensorData::new(values, shape), &tensor.device()).require_grad()
            } else {
                tensor
            };
            burn::module::Param::from_mapped_value(id, tensor, mapper)
        }
    }

    #[test]
    fn fused_attention_computes_what_dense_attention_does() {
        use crate::transformer::AttentionKind;
        let device = Default::default();
        let dense = config().init_with_std::<CpuAutodiff>(6, 0.4, &device);
        let fused = dense.clone().with_attention(AttentionKind::Fused);
        assert_eq!(fused.valid().attention(), AttentionKind::Fused);
        // Left padding (prompts of 5 and 2), completions of 2 and 4.
        let pairs: [(&[u32], &[u32]); 2] =
            [(&[1, 2, 3, 4, 5], &[6, 7]), (&[9, 8], &[10, 11, 12, 13])];
        let run = |m: &Transformer<CpuAutodiff>| {
            let out = completion_logprobs(m, &pairs, 0.9).unwrap();
            let values = out.to_vecs();
            let grads = GradientsParams::from_grads((-out.logprobs.sum()).backward(), m);
            (values, grads)
        };
        let ((a, ga), (b, gb)) = (run(&dense), run(&fused));
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
        assert_ne!(a, b, "other bits: the kernels sum in another order");
        let compare = Compare::of(&dense, &ga, &gb);
        assert_eq!(compare.counts.0, compare.counts.1);
        assert!(
            compare.worst <= 1e-5 * compare.scale,
            "{} against {}",
            compare.worst,
            compare.scale
        );
        // Generation through the KV cache (queries after cached columns).
        let prompts = vec![vec![1, 2, 3, 4], vec![7, 8]];
        let config = GenerationConfig::greedy(5);
        let a = generate(
            &dense.valid(),
            None,
            &prompts,
            &mut [RngStream::from_u64(1), RngStream::from_u64(2)],
            &config,
        )
        .unwrap();
        let b = generate(
            &fused.valid(),
            None,
            &prompts,
            &mut [RngStream::from_u64(1), RngStream::from_u64(2)],
            &config,
        )
        .unwrap();
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.token_ids, b.token_ids);
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "{x} vs {y}");
            }
        }
    }
}
