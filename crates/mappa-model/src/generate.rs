//! Batched generation with a KV cache.
//!
//! Prompts of different lengths are left-padded into one batch. One prefill
//! pass fills the cache; each further step feeds one token per row. Every row
//! samples from its own [`RngStream`], so a prompt's completion does not
//! depend on which other prompts share its batch. A row stops at an EOS id, at
//! a stop string, or after `max_new_tokens`; the batch stops when every row has.

use burn::prelude::*;
use mappa_core::RngStream;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::kernels::ModelBackend;
use crate::sampling::{choose, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::transformer::{Transformer, Window};

/// What to generate and when to stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationConfig {
    /// Most new tokens per prompt.
    pub max_new_tokens: usize,
    /// Token choice.
    pub sampling: SamplingConfig,
    /// Ids that end a row (the EOS id is kept as the row's last token).
    pub eos_token_ids: Vec<u32>,
    /// Strings that end a row once the decoded completion contains one (the
    /// tokens up to the one completing it are kept). Needs a tokenizer.
    pub stop_strings: Vec<String>,
}

impl GenerationConfig {
    /// Greedy decoding of up to `max_new_tokens`, with no stop condition but length.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            sampling: SamplingConfig::greedy(),
            eos_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

/// Why a row stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// It produced an EOS id.
    Eos,
    /// It produced the given stop string.
    Stop(String),
    /// It reached `max_new_tokens`.
    Length,
}

/// One completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The new token ids (an ending EOS id included).
    pub token_ids: Vec<u32>,
    /// `log_softmax(logits / T)` of each new token (see [`crate::sampling`]).
    pub logprobs: Vec<f32>,
    /// The decoded completion, special tokens skipped (empty without a tokenizer).
    pub text: String,
    /// Why it stopped.
    pub finish: FinishReason,
}

/// Generates one completion per prompt.
///
/// `prompts` are token ids in any form that borrows as `[u32]`:
/// `&[Vec<u32>]`, `&[&[u32]]`, `&[[u32; N]]`.
/// `rngs` holds one stream per prompt (greedy decoding draws nothing from
/// them: [`generate_greedy`] needs none). `tokenizer` decodes the text and
/// checks stop strings; without one, `text` is empty and stop strings are an
/// error.
pub fn generate<B: ModelBackend>(
    model: &Transformer<B>,
    tokenizer: Option<&dyn Tokenizer>,
    prompts: &[impl AsRef<[u32]>],
    rngs: &mut [RngStream],
    config: &GenerationConfig,
) -> Result<Vec<Generation>> {
    let prompts: Vec<&[u32]> = prompts.iter().map(AsRef::as_ref).collect();
    check_inputs(model, tokenizer, &prompts, rngs, config)?;
    B::run_step(|| generate_checked(model, tokenizer, &prompts, rngs, config))
}

/// [`generate`] on inputs [`check_inputs`] accepted.
fn generate_checked<B: ModelBackend>(
    model: &Transformer<B>,
    tokenizer: Option<&dyn Tokenizer>,
    prompts: &[&[u32]],
    rngs: &mut [RngStream],
    config: &GenerationConfig,
) -> Result<Vec<Generation>> {
    let batch = prompts.len();
    if batch == 0 {
        return Ok(Vec::new());
    }
    let device = model.device();
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let pad_left: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
    let mut cache = model.new_cache(batch, width + config.max_new_tokens);

    // Prefill: the whole left-padded prompt block.
    let mut tokens = Vec::with_capacity(batch * width);
    for (&p, &pad) in prompts.iter().zip(&pad_left) {
        tokens.extend(std::iter::repeat_n(0i32, pad));
        tokens.extend(p.iter().map(|&t| t as i32));
    }
    let input = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [batch, width]), &device);
    let window = Window {
        pad_left: &pad_left,
        start: 0,
        len: width,
    };
    let hidden = model.forward_hidden(input, &window, Some(&mut cache));
    let mut logits = last_logits(model, hidden);

    let mut rows: Vec<Row> = (0..batch).map(|_| Row::default()).collect();
    for step in 0..config.max_new_tokens {
        let mut next = Vec::with_capacity(batch);
        for (r, row) in rows.iter_mut().enumerate() {
            if row.finish.is_some() {
                next.push(0);
                continue;
            }
            let token = row.step(&logits[r], r, step, &mut rngs[r], tokenizer, config)?;
            next.push(token as i32);
        }
        if rows.iter().all(|r| r.finish.is_some()) || step + 1 == config.max_new_tokens {
            break;
        }
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(next, [batch, 1]), &device);
        let window = Window {
            pad_left: &pad_left,
            start: width + step,
            len: 1,
        };
        let hidden = model.forward_hidden(input, &window, Some(&mut cache));
        logits = last_logits(model, hidden);
    }

    rows.into_iter().map(|row| row.finish(tokenizer)).collect()
}

/// The state of one row during generation.
#[derive(Default)]
struct Row {
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
}

impl Row {
    /// Choose this row's next token (row `r`, generation step `step`) from
    /// its `logits`, and note whether it ends the row: EOS, a stop string,
    /// or the length limit.
    fn step(
        &mut self,
        logits: &[f32],
        r: usize,
        step: usize,
        rng: &mut RngStream,
        tokenizer: Option<&dyn Tokenizer>,
        config: &GenerationConfig,
    ) -> Result<u32> {
        if let Some(i) = logits.iter().position(|l| !l.is_finite()) {
            return Err(ModelError::NonFinite(format!(
                "logit {i} of prompt {r} is {} at generation step {step}",
                logits[i]
            )));
        }
        let choice = choose(logits, &config.sampling, rng);
        self.push(choice.token, choice.logprob);
        if config.eos_token_ids.contains(&choice.token) {
            self.finish = Some(FinishReason::Eos);
        } else if let (Some(tok), false) = (tokenizer, config.stop_strings.is_empty()) {
            let text = tok.decode(&self.token_ids, false)?;
            if let Some(stop) = config
                .stop_strings
                .iter()
                .find(|s| text.contains(s.as_str()))
            {
                self.finish = Some(FinishReason::Stop(stop.clone()));
            }
        }
        if self.finish.is_none() && self.token_ids.len() == config.max_new_tokens {
            self.finish = Some(FinishReason::Length);
        }
        Ok(choice.token)
    }

    /// The finished generation, its text decoded when there is a tokenizer.
    fn finish(self, tokenizer: Option<&dyn Tokenizer>) -> Result<Generation> {
        let text = match tokenizer {
            Some(tok) => tok.decode(&self.token_ids, true)?,
            None => String::new(),
        };
        Ok(Generation {
            token_ids: self.token_ids,
            logprobs: self.logprobs,
            text,
            finish: self.finish.unwrap_or(FinishReason::Length),
        })
    }

    fn push(&mut self, token: u32, logprob: f32) {
        self.token_ids.push(token);
        self.logprobs.push(logprob);
    }
}

/// Logits of the last column of each row, on the host.
fn last_logits<B: ModelBackend>(model: &Transformer<B>, hidden: Tensor<B, 3>) -> Vec<Vec<f32>> {
    let [batch, len, h] = hidden.dims();
    let last = hidden.slice([0..batch, len - 1..len, 0..h]);
    let (vocab, values) = logits_on_host(model.logits(last));
    values.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// `[batch, len, vocab]` logits copied to the host as f32, row-major, with the vocabulary size.
pub(crate) fn logits_on_host<B: ModelBackend>(logits: Tensor<B, 3>) -> (usize, Vec<f32>) {
    let vocab = logits.dims()[2];
    let values = logits
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 logits");
    (vocab, values)
}

/// Greedy decoding of one completion per prompt, with no random streams.
///
/// The same as [`generate`] with any streams: greedy decoding draws nothing,
/// so the result is token-for-token what `generate` returns. `config.sampling`
/// must be greedy ([`GenerationConfig::greedy`] builds such a config; set
/// `eos_token_ids` and, with a tokenizer, `stop_strings` on it as needed).
pub fn generate_greedy<B: ModelBackend>(
    model: &Transformer<B>,
    tokenizer: Option<&dyn Tokenizer>,
    prompts: &[impl AsRef<[u32]>],
    config: &GenerationConfig,
) -> Result<Vec<Generation>> {
    if !config.sampling.is_greedy() {
        return Err(ModelError::Input(format!(
            "generate_greedy needs greedy sampling (temperature 0), not temperature {}: \
             use `generate` with one random stream per prompt to sample",
            config.sampling.temperature
        )));
    }
    // Never drawn from: `choose` returns before touching the stream when greedy.
    let mut unused: Vec<RngStream> = (0..prompts.len()).map(|_| RngStream::from_u64(0)).collect();
    generate(model, tokenizer, prompts, &mut unused, config)
}

fn check_inputs<B: Backend>(
    model: &Transformer<B>,
    tokenizer: Option<&dyn Tokenizer>,
    prompts: &[&[u32]],
    rngs: &[RngStream],
    config: &GenerationConfig,
) -> Result<()> {
    config.sampling.validate().map_err(ModelError::Input)?;
    if rngs.len() != prompts.len() {
        return Err(ModelError::Input(format!(
            "{} random streams for {} prompts: one per prompt is needed",
            rngs.len(),
            prompts.len()
        )));
    }
    if tokenizer.is_none() && !config.stop_strings.is_empty() {
        return Err(ModelError::Input("stop strings need a tokenizer".into()));
    }
    let vocab = model.config().vocab_size;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(ModelError::Input(format!("prompt {i} is empty")));
        }
        if let Some(t) = p.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Input(format!(
                "prompt {i} holds token id {t}, outside the vocabulary of {vocab}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Family, TransformerConfig};
    use crate::TestBackend;

    fn model() -> Transformer<TestBackend> {
        TransformerConfig::for_family(Family::Qwen3, 64, 32, 64, 2, 4, 2, 8).init_with_std(
            11,
            0.5,
            &Default::default(),
        )
    }

    /// Greedy decoding by full recomputation, without a cache.
    fn greedy_uncached(
        model: &Transformer<TestBackend>,
        prompt: &[u32],
        n: usize,
    ) -> (Vec<u32>, Vec<f32>) {
        let mut seq: Vec<u32> = prompt.to_vec();
        let mut lps = Vec::new();
        for _ in 0..n {
            let input = Tensor::<TestBackend, 2, Int>::from_data(
                TensorData::new(seq.iter().map(|&t| t as i32).collect(), [1, seq.len()]),
                &Default::default(),
            );
            let logits = model.forward(input);
            let row = last_logits_of(logits);
            let c = choose(&row, &SamplingConfig::greedy(), &mut RngStream::from_u64(0));
            seq.push(c.token);
            lps.push(c.logprob);
        }
        (seq[prompt.len()..].to_vec(), lps)
    }

    fn last_logits_of(logits: Tensor<TestBackend, 3>) -> Vec<f32> {
        let [_, s, v] = logits.dims();
        logits
            .slice([0..1, s - 1..s, 0..v])
            .into_data()
            .into_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn cached_greedy_equals_recomputation_and_batching_is_invisible() {
        let m = model();
        let prompts = vec![vec![1, 2, 3], vec![5, 6, 7, 8, 9, 10], vec![4]];
        let mut rngs: Vec<_> = (0..3).map(RngStream::from_u64).collect();
        let batched =
            generate(&m, None, &prompts, &mut rngs, &GenerationConfig::greedy(8)).unwrap();
        for (p, g) in prompts.iter().zip(&batched) {
            let (ids, lps) = greedy_uncached(&m, p, 8);
            assert_eq!(g.token_ids, ids);
            assert_eq!(g.finish, FinishReason::Length);
            for (a, b) in g.logprobs.iter().zip(&lps) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
            let alone = generate(
                &m,
                None,
                std::slice::from_ref(p),
                &mut [RngStream::from_u64(0)],
                &GenerationConfig::greedy(8),
            )
            .unwrap();
            assert_eq!(alone[0].token_ids, g.token_ids);
        }
    }

    #[test]
    fn sampling_repeats_with_the_same_seed_and_ignores_batch_mates() {
        let m = model();
        let mut config = GenerationConfig::greedy(10);
        config.sampling = SamplingConfig {
            temperature: 1.0,
            top_k: 20,
            top_p: 0.95,
        };
        let prompts = vec![vec![1, 2, 3], vec![9, 8]];
        let run = |prompts: &[Vec<u32>], seeds: &[u64]| {
            let mut rngs: Vec<_> = seeds.iter().map(|&s| RngStream::from_u64(s)).collect();
            generate(&m, None, prompts, &mut rngs, &config).unwrap()
        };
        let a = run(&prompts, &[1, 2]);
        let b = run(&prompts, &[1, 2]);
        assert_eq!(a, b);
        let alone = run(&prompts[1..], &[2]);
        assert_eq!(alone[0].token_ids, a[1].token_ids);
        let other = run(&prompts, &[3, 4]);
        assert_ne!(other, a);
    }

    /// Where a generation runs (the CPU backend's step pool, or a thread of
    /// a one-thread pool, where it runs in place with every kernel on that
    /// thread) changes no bit of its tokens or log-probs.
    #[test]
    fn where_a_generation_runs_changes_no_bit() {
        let m = model();
        let mut config = GenerationConfig::greedy(12);
        config.sampling = SamplingConfig::with_temperature(0.8);
        let prompts = vec![vec![1, 2, 3], vec![7, 5, 3, 1, 2]];
        let run = || {
            let mut rngs: Vec<_> = (0..2).map(RngStream::from_u64).collect();
            generate(&m, None, &prompts, &mut rngs, &config).unwrap()
        };
        let bits = |gs: Vec<Generation>| -> Vec<(Vec<u32>, Vec<u32>)> {
            gs.into_iter()
                .map(|g| {
                    (
                        g.token_ids,
                        g.logprobs.iter().map(|l| l.to_bits()).collect(),
                    )
                })
                .collect()
        };
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(bits(run()), bits(one_thread.install(run)));
    }

    #[test]
    fn eos_stops_a_row_and_keeps_the_id() {
        let m = model();
        let prompt = vec![vec![1, 2, 3]];
        let free = generate(
            &m,
            None,
            &prompt,
            &mut [RngStream::from_u64(0)],
            &GenerationConfig::greedy(6),
        )
        .unwrap();
        let eos = free[0].token_ids[2];
        let first = free[0].token_ids.iter().position(|&t| t == eos).unwrap();
        let mut config = GenerationConfig::greedy(6);
        config.eos_token_ids = vec![eos];
        let stopped = generate(&m, None, &prompt, &mut [RngStream::from_u64(0)], &config).unwrap();
        assert_eq!(stopped[0].finish, FinishReason::Eos);
        assert_eq!(stopped[0].token_ids, free[0].token_ids[..=first]);
        // An EOS on the last token allowed ended the row; it was not cut
        // (as vLLM and SGLang report it: "stop", not "length").
        let mut at_cap = GenerationConfig::greedy(first + 1);
        at_cap.eos_token_ids = vec![eos];
        let ended = generate(&m, None, &prompt, &mut [RngStream::from_u64(0)], &at_cap).unwrap();
        assert_eq!(ended[0].finish, FinishReason::Eos);
        assert_eq!(ended[0].token_ids.len(), first + 1);
    }

    #[test]
    fn bad_inputs_are_refused() {
        let m = model();
        let config = GenerationConfig::greedy(2);
        let err =
            generate(&m, None, &[vec![]], &mut [RngStream::from_u64(0)], &config).unwrap_err();
        assert!(err.to_string().contains("prompt 0 is empty"));
        let err = generate(
            &m,
            None,
            &[vec![64]],
            &mut [RngStream::from_u64(0)],
            &config,
        )
        .unwrap_err();
        assert!(err.to_string().contains("token id 64"));
        let err = generate(&m, None, &[vec![1]], &mut [], &config).unwrap_err();
        assert!(err.to_string().contains("one per prompt"));
    }
}
