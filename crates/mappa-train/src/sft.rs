//! Supervised fine-tuning on demonstrations (the warm start of CPU-scale
//! experiments): minimise the mean negative log-likelihood of completion
//! tokens given their prompts, with AdamW, a constant learning rate,
//! global gradient-norm clipping and a seeded shuffle per epoch.

use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use mappa_core::rng::SeedTree;
use mappa_model::kernels;
use mappa_model::AutodiffModelBackend;
use mappa_model::{
    completion_logprobs, ChatMessage, ChatRequest, ChatTemplate, HfTokenizer, Tokenizer,
    Transformer,
};
use serde::{Deserialize, Serialize};

use crate::optim::FusedAdamW;
use crate::params::clip_global_grad_norm;
use crate::TrainError;

/// Settings of a supervised run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Passes over the demonstrations.
    pub epochs: usize,
    /// Demonstrations per optimiser step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// Seed of the shuffle.
    pub seed: u64,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            epochs: 3,
            batch_size: 16,
            lr: 3e-3,
            grad_clip: 1.0,
            seed: 0,
        }
    }
}

/// One demonstration: a prompt and the completion to imitate.
pub type Demonstration = (Vec<u32>, Vec<u32>);

/// Mean completion-token NLL per epoch, after each epoch.
pub type SftLosses = Vec<f64>;

/// Fine-tune `model` on `demos`; returns the model and the mean loss of each
/// epoch. `on_epoch(epoch, mean loss)` is called after each epoch (for progress).
pub fn supervised_finetune<B: AutodiffModelBackend>(
    mut model: Transformer<B>,
    demos: &[Demonstration],
    config: &SftConfig,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> Result<(Transformer<B>, SftLosses), TrainError> {
    if demos.is_empty() || config.batch_size == 0 || config.epochs == 0 {
        return Err(TrainError::Config(
            "sft: expected demonstrations, batch_size >= 1 and epochs >= 1".into(),
        ));
    }
    if let Some(i) = demos.iter().position(|(p, c)| p.is_empty() || c.is_empty()) {
        return Err(TrainError::Input(format!(
            "sft: demonstration {i} has an empty prompt or completion"
        )));
    }
    // burn's `AdamWConfig` defaults, without weight decay.
    let mut optimizer = FusedAdamW {
        weight_decay: 0.0,
        ..FusedAdamW::default()
    }
    .init::<B, Transformer<B>>();
    let seeds = SeedTree::new(config.seed);
    let mut losses = Vec::with_capacity(config.epochs);
    for epoch in 0..config.epochs {
        let mut order: Vec<usize> = (0..demos.len()).collect();
        let mut rng = seeds.stream(&format!("sft/epoch-{epoch}"));
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let (mut total, mut tokens) = (0.0, 0usize);
        for batch in order.chunks(config.batch_size) {
            let pairs: Vec<(&[u32], &[u32])> = batch
                .iter()
                .map(|&i| (demos[i].0.as_slice(), demos[i].1.as_slice()))
                .collect();
            let count: usize = pairs.iter().map(|(_, c)| c.len()).sum();
            let out = completion_logprobs(&model, &pairs, 1.0)?;
            let loss = kernels::sum(out.logprobs * out.mask).neg() / count as f64;
            let value = loss.clone().into_scalar().elem::<f64>();
            if !value.is_finite() {
                return Err(TrainError::NonFinite(format!(
                    "sft epoch {epoch}: loss {value}"
                )));
            }
            total += value * count as f64;
            tokens += count;
            let mut grads = GradientsParams::from_grads(loss.backward(), &model);
            clip_global_grad_norm(&model, &mut grads, config.grad_clip);
            model = optimizer.step(config.lr, model, grads);
        }
        losses.push(total / tokens as f64);
        on_epoch(epoch, total / tokens as f64);
    }
    Ok((model, losses))
}
/// Tokenise one demonstration (an agent's input and the reply it should
/// give): the conversation rendered by the chat template with the
/// generation prompt, and the reply with EOS.
pub fn encode_demonstration(
    messages: &[mappa_agents::Message],
    text: &str,
    tokenizer: &HfTokenizer,
    template: &ChatTemplate,
) -> Result<(Vec<u32>, Vec<u32>), TrainError> {
    let chat: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(&m.role, &m.content))
        .collect();
    let prompt = template.render(&ChatRequest {
        messages: &chat,
        add_generation_prompt: true,
        ..Default::default()
    })?;
    let mut completion = tokenizer.encode(text)?;
    completion.extend(tokenizer.eos_token_ids().first());
    Ok((tokenizer.encode(&prompt)?, completion))
}
