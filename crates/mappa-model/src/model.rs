//! [`Model`]: a loaded language model with a plain-Rust interface, for
//! clients that want logits or greedy ids from `u32` token ids without
//! handling tensors, tokenizers or random streams.
//!
//! [`Model::load`] reads only `config.json` and the safetensors weights of a
//! HF checkpoint directory; no tokenizer file is needed. (Loading the
//! tokenizer and chat template as well is [`Checkpoint::load`](crate::Checkpoint::load).)
//!
//! ```no_run
//! use mappa_model::Model;
//!
//! let model = Model::load("fixtures/models/qwen3-tiny")?;
//! let logits = model.logits(&[1, 2, 3])?; // [3 positions, vocab]
//! let next = logits.top(logits.positions() - 1, 5); // 5 best (id, logit) pairs
//! let ids = model.greedy(&[1, 2, 3], 8, None)?; // up to 8 new ids
//! # Ok::<(), mappa_model::ModelError>(())
//! ```

use std::path::Path;

use burn::prelude::*;

use crate::backend;
use crate::config::TransformerConfig;
use crate::error::{ModelError, Result};
use crate::generate::{generate_greedy, logits_on_host, GenerationConfig};
use crate::kernels::ModelBackend;
use crate::transformer::Transformer;
use crate::weights::load_transformer;

/// A [`Transformer`] with the device its weights live on, taking and
/// returning plain Rust data.
///
/// `B` defaults to the CPU backend ([`backend::Cpu`]); the tensor-level API
/// stays available through [`Model::transformer`] (for [`generate`](crate::generate())
/// and [`completion_logprobs`](crate::completion_logprobs)).
pub struct Model<B: Backend = backend::Cpu> {
    transformer: Transformer<B>,
    device: B::Device,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    /// The architecture and device, not the weights.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", self.config())
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Model<backend::Cpu> {
    /// Loads `config.json` and the safetensors weights of the HF checkpoint
    /// directory `dir` onto the default CPU device. Tokenizer files are
    /// neither needed nor read.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_on(dir, &Default::default())
    }
}

impl<B: Backend> Model<B> {
    /// Loads `config.json` and the safetensors weights of `dir` onto
    /// `device` (for another backend: `Model::<Cuda>::load_on(dir, &device)`).
    /// Tokenizer files are neither needed nor read.
    pub fn load_on(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self> {
        Ok(Self::new(load_transformer(dir.as_ref(), device)?))
    }

    /// Wraps an already built model (for instance [`Checkpoint::model`](crate::Checkpoint::model)).
    pub fn new(transformer: Transformer<B>) -> Self {
        let device = transformer.device();
        Self {
            transformer,
            device,
        }
    }

    /// The tensor-level model.
    pub fn transformer(&self) -> &Transformer<B> {
        &self.transformer
    }

    /// Unwraps the tensor-level model.
    pub fn into_transformer(self) -> Transformer<B> {
        self.transformer
    }

    /// The architecture (vocabulary size, layers, ...).
    pub fn config(&self) -> &TransformerConfig {
        self.transformer.config()
    }

    /// The device the weights live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The vocabulary size: token ids are `0 .. vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        self.transformer.config().vocab_size
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(ModelError::Input("no token ids".into()));
        }
        let vocab = self.vocab_size();
        if let Some((i, t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(ModelError::Input(format!(
                "token id {t} at position {i} is outside the vocabulary of {vocab}"
            )));
        }
        Ok(())
    }
}

impl<B: Backend> From<Transformer<B>> for Model<B> {
    fn from(transformer: Transformer<B>) -> Self {
        Self::new(transformer)
    }
}

impl<B: ModelBackend> Model<B> {
    /// The logits at every position of the sequence `ids` (position `i`
    /// scores the token after `ids[..=i]`), as host `f32` values.
    ///
    /// The values are exactly those of [`Transformer::forward`] on `[1, len]`.
    /// Errors when `ids` is empty or holds an id outside the vocabulary.
    pub fn logits(&self, ids: &[u32]) -> Result<Logits> {
        self.check_ids(ids)?;
        let tokens: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let input =
            Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [1, ids.len()]), &self.device);
        let (vocab, values) = logits_on_host(self.transformer.forward(input));
        Ok(Logits { vocab, values })
    }

    /// Greedy (argmax) decoding of up to `max_new_tokens` new ids after
    /// `prompt`; no random stream is involved. Stops early after `eos`, which
    /// is then kept as the last id.
    ///
    /// Returns only the new ids, token-for-token those of
    /// [`generate`](crate::generate()) with [`GenerationConfig::greedy`]
    /// (first maximum wins ties, as `torch.argmax` does).
    pub fn greedy(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        eos: Option<u32>,
    ) -> Result<Vec<u32>> {
        self.check_ids(prompt)?;
        let mut config = GenerationConfig::greedy(max_new_tokens);
        config.eos_token_ids.extend(eos);
        let mut out = generate_greedy(&self.transformer, None, &[prompt], &config)?;
        Ok(out.pop().map(|g| g.token_ids).unwrap_or_default())
    }
}

/// Per-position logits of one sequence, on the host.
///
/// `values` is row-major `[positions, vocab]`: row `i` scores the token that
/// follows the first `i + 1` input ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    /// The vocabulary size (the length of one row).
    pub vocab: usize,
    /// All rows, one after another.
    pub values: Vec<f32>,
}

impl Logits {
    /// The number of positions (rows).
    pub fn positions(&self) -> usize {
        self.values.len().checked_div(self.vocab).unwrap_or(0)
    }

    /// The logits at position `i`.
    ///
    /// # Panics
    /// If `i >= self.positions()`.
    pub fn row(&self, i: usize) -> &[f32] {
        assert!(
            i < self.positions(),
            "position {i} out of range: {} positions",
            self.positions()
        );
        &self.values[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The logits at the last position: the scores of the next token.
    ///
    /// # Panics
    /// If there are no positions ([`Model::logits`] never returns such a value).
    pub fn last(&self) -> &[f32] {
        self.row(self.positions().saturating_sub(1))
    }

    /// All rows in order.
    pub fn rows(&self) -> impl Iterator<Item = &[f32]> + '_ {
        self.values.chunks_exact(self.vocab.max(1))
    }

    /// The `k` highest `(token id, logit)` pairs at position `i`, best
    /// first; ties go to the lower id.
    ///
    /// # Panics
    /// If `i >= self.positions()`.
    pub fn top(&self, i: usize, k: usize) -> Vec<(u32, f32)> {
        let mut pairs: Vec<(u32, f32)> = self
            .row(i)
            .iter()
            .enumerate()
            .map(|(t, &l)| (t as u32, l))
            .collect();
        pairs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        pairs.truncate(k);
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::generate::{generate, Generation};
    use crate::sampling::SamplingConfig;
    use crate::TestBackend;
    use mappa_core::RngStream;

    fn model() -> Model<TestBackend> {
        Model::new(
            TransformerConfig::for_family(Family::Qwen3, 64, 32, 64, 2, 4, 2, 8).init_with_std(
                11,
                0.5,
                &Default::default(),
            ),
        )
    }

    #[test]
    fn logits_are_the_forward_pass_bit_for_bit() {
        let m = model();
        let ids = [3u32, 1, 4, 1, 5, 9];
        let logits = m.logits(&ids).unwrap();
        let input = Tensor::<TestBackend, 2, Int>::from_data(
            TensorData::new(ids.iter().map(|&t| t as i32).collect(), [1, ids.len()]),
            &Default::default(),
        );
        let expected = m
            .transformer()
            .forward(input)
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        assert_eq!(logits.vocab, 64);
        assert_eq!(logits.positions(), ids.len());
        assert_eq!(logits.values, expected);
        assert_eq!(logits.last(), &expected[5 * 64..]);
        assert_eq!(logits.rows().count(), ids.len());
        assert_eq!(logits.rows().nth(2).unwrap(), logits.row(2));
    }

    #[test]
    fn greedy_matches_generate_and_stops_at_eos() {
        let m = model();
        let prompt = [1u32, 2, 3];
        let mut rngs = [RngStream::from_u64(7)];
        let reference = generate(
            m.transformer(),
            None,
            &[prompt],
            &mut rngs,
            &GenerationConfig::greedy(6),
        )
        .unwrap();
        let ids = m.greedy(&prompt, 6, None).unwrap();
        assert_eq!(ids, reference[0].token_ids);
        // The first token is the argmax of the last position's logits.
        let top = m.logits(&prompt).unwrap().top(2, 1)[0].0;
        assert_eq!(ids[0], top);

        let eos = ids[2];
        let first = ids.iter().position(|&t| t == eos).unwrap();
        assert_eq!(m.greedy(&prompt, 6, Some(eos)).unwrap(), ids[..=first]);
    }

    #[test]
    fn generate_greedy_needs_no_streams_and_refuses_sampling() {
        let m = model();
        let prompts: [&[u32]; 2] = [&[1, 2, 3], &[9]];
        let config = GenerationConfig::greedy(5);
        let mut rngs = [RngStream::from_u64(1), RngStream::from_u64(2)];
        let with: Vec<Generation> =
            generate(m.transformer(), None, &prompts, &mut rngs, &config).unwrap();
        let without = generate_greedy(m.transformer(), None, &prompts, &config).unwrap();
        assert_eq!(with, without);

        let mut sampling = config;
        sampling.sampling = SamplingConfig::with_temperature(0.7);
        let err = generate_greedy(m.transformer(), None, &prompts, &sampling).unwrap_err();
        assert!(err.to_string().contains("greedy sampling"), "{err}");
    }

    #[test]
    fn bad_ids_are_refused() {
        let m = model();
        let err = m.logits(&[]).unwrap_err();
        assert!(err.to_string().contains("no token ids"), "{err}");
        let err = m.logits(&[1, 64]).unwrap_err();
        assert!(
            err.to_string().contains("token id 64 at position 1"),
            "{err}"
        );
        let err = m.greedy(&[], 3, None).unwrap_err();
        assert!(err.to_string().contains("no token ids"), "{err}");
        assert!(m.greedy(&[1], 0, None).unwrap().is_empty());
    }

    #[test]
    fn top_orders_by_logit_then_id() {
        let l = Logits {
            vocab: 4,
            values: vec![0.5, 2.0, 2.0, -1.0],
        };
        assert_eq!(l.positions(), 1);
        assert_eq!(l.top(0, 3), vec![(1, 2.0), (2, 2.0), (0, 0.5)]);
        assert_eq!(l.top(0, 10).len(), 4);
    }
}
