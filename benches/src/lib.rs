//! The workloads of mappa's speed benchmarks, shared by the criterion benches
//! (`benches/model.rs`) and the JSON timing runner (`bench_json`) that
//! `just bench-vs-torch` compares with PyTorch (`torch_bench.py`).
//!
//! Two Qwen3-shaped configs (about 1M and 26M parameters, tied embeddings),
//! the real SmolLM2-135M-Instruct (from `just models`) at batch 1 and 8, and
//! three workloads: a full forward pass, a training step (forward, next-token
//! cross-entropy, backward, Adam), and greedy KV-cache generation. Shapes and
//! hyper-parameters match `torch_bench.py` exactly. [`products`] lists a
//! training step's matrix products, which `matmul_bench` and
//! `torch_matmul.py` time on their own (`just bench-matmul`). [`core_distance`]
//! measures how far apart the machine runs two threads, and [`cpu_speed`]
//! how fast each of its CPUs computes right now; `bench_json` records both
//! with each timing. [`memory`] measures the peak memory of training
//! updates and inference phases against the memory plan (`just
//! bench-memory`, `mappa doctor`).

#![warn(missing_docs)]

pub mod core_distance;
pub mod counting;
pub mod cpu_speed;
pub mod memory;
pub mod products;

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use mappa_train::optim::FusedAdamW;

use mappa_core::RngStream;
use mappa_model::kernels;
use mappa_model::{
    generate, AutodiffModelBackend, Family, GenerationConfig, ModelBackend, Transformer,
    TransformerConfig,
};

/// Batch size of every workload of the random-weight sizes.
pub const BATCH: usize = 8;
/// Sequence length of the forward and training workloads.
pub const SEQ: usize = 128;
/// Prompt length of the generation workload.
pub const PROMPT: usize = 16;
/// New tokens per prompt in the generation workload.
pub const NEW_TOKENS: usize = 64;

/// A named benchmark model size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Size {
    /// About 1M parameters.
    #[value(name = "1m")]
    M1,
    /// About 26M parameters.
    #[value(name = "25m")]
    M25,
    /// SmolLM2-135M's shape (Qwen3 layers), random weights: about 135M
    /// parameters. For GPUs (`mappa doctor`).
    #[value(name = "135m")]
    M135,
    /// Qwen2.5-0.5B's shape (Qwen3 layers), random weights: about 0.5B
    /// parameters. For GPUs (`mappa doctor`).
    #[value(name = "500m")]
    M500,
}

impl Size {
    /// The sizes the CPU benchmarks time.
    pub const ALL: [Size; 2] = [Size::M1, Size::M25];
    /// The sizes a GPU is timed at (`mappa doctor`).
    pub const GPU: [Size; 3] = [Size::M25, Size::M135, Size::M500];

    /// The name used in reports (`1m`, `25m`).
    pub fn name(self) -> &'static str {
        match self {
            Size::M1 => "1m",
            Size::M25 => "25m",
            Size::M135 => "135m",
            Size::M500 => "500m",
        }
    }

    /// The model config (Qwen3 family, tied embeddings).
    pub fn config(self) -> TransformerConfig {
        let (vocab, hidden, inter, layers, heads, kv, head_dim) = match self {
            Size::M1 => (2048, 128, 384, 4, 4, 2, 32),
            Size::M25 => (8192, 512, 1536, 7, 8, 4, 64),
            // SmolLM2-135M's config.json (HuggingFaceTB/SmolLM2-135M).
            Size::M135 => (49152, 576, 1536, 30, 9, 3, 64),
            // Qwen2.5-0.5B's config.json (Qwen/Qwen2.5-0.5B).
            Size::M500 => (151936, 896, 4864, 24, 14, 2, 64),
        };
        TransformerConfig::for_family(
            Family::Qwen3,
            vocab,
            hidden,
            inter,
            layers,
            heads,
            kv,
            head_dim,
        )
        .with_tie_word_embeddings(true)
        .with_max_position_embeddings(512)
    }
}

/// Where `just models` installs the real model, from the workspace root.
pub const SMOL_DIR: &str = "models/SmolLM2-135M-Instruct";

/// A configuration `bench_json` times: a random-weight size at batch
/// [`BATCH`], or the real model at a given batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchConfig {
    /// A random-weight Qwen3-shaped model.
    Sized(Size),
    /// SmolLM2-135M-Instruct loaded from [`SMOL_DIR`], with this batch size.
    Smol {
        /// Sequences per forward pass, training step and generation.
        batch: usize,
    },
}

impl BenchConfig {
    /// Every configuration the CPU benchmarks time by default, in report order.
    pub const ALL: [BenchConfig; 4] = [
        BenchConfig::Sized(Size::M1),
        BenchConfig::Sized(Size::M25),
        BenchConfig::Smol { batch: 1 },
        BenchConfig::Smol { batch: 8 },
    ];
    /// The larger random-weight sizes, named on request (`135m`, `500m`).
    pub const LARGE: [BenchConfig; 2] = [
        BenchConfig::Sized(Size::M135),
        BenchConfig::Sized(Size::M500),
    ];

    /// The name in reports and on the command line (`1m`, `25m`, `smol-b1`, `smol-b8`).
    pub fn name(self) -> String {
        match self {
            BenchConfig::Sized(size) => size.name().to_string(),
            BenchConfig::Smol { batch } => format!("smol-b{batch}"),
        }
    }

    /// Sequences per workload.
    pub fn batch(self) -> usize {
        match self {
            BenchConfig::Sized(_) => BATCH,
            BenchConfig::Smol { batch } => batch,
        }
    }
}

impl std::str::FromStr for BenchConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let all = || BenchConfig::ALL.into_iter().chain(BenchConfig::LARGE);
        all().find(|c| c.name() == s).ok_or_else(|| {
            let names: Vec<String> = all().map(|c| c.name()).collect();
            format!("unknown config {s:?}; expected one of {}", names.join(", "))
        })
    }
}

/// The median wall time of `iters` runs of `f`, after `warmup` untimed runs.
pub fn median_seconds(warmup: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Token ids `[rows, cols]` drawn uniformly from the vocabulary with a fixed seed.
pub fn random_tokens(vocab: usize, rows: usize, cols: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = RngStream::from_u64(seed);
    (0..rows)
        .map(|_| (0..cols).map(|_| rng.below(vocab as u64) as u32).collect())
        .collect()
}

/// The ids as a `[rows, cols]` int tensor.
pub fn to_tensor<B: Backend>(ids: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2, Int> {
    let cols = ids[0].len();
    let flat: Vec<i32> = ids.iter().flatten().map(|&t| t as i32).collect();
    Tensor::from_data(TensorData::new(flat, [ids.len(), cols]), device)
}

/// Full-sequence logits, synchronised (the result is read back to the host);
/// run as one step ([`ModelBackend::run_step`]), as mappa's forward passes are.
pub fn forward<B: ModelBackend>(model: &Transformer<B>, tokens: &Tensor<B, 2, Int>) -> f32 {
    B::run_step(|| {
        let logits = model.forward(tokens.clone());
        let [b, s, v] = logits.dims();
        logits
            .slice([b - 1..b, s - 1..s, v - 1..v])
            .into_scalar()
            .elem()
    })
}

/// A model and its Adam optimiser (betas 0.9, 0.95, no weight decay): the
/// optimiser mappa trains with ([`FusedAdamW`]), whose update without weight
/// decay is Adam's.
pub struct Trainer<B: AutodiffModelBackend> {
    /// The model being trained; `None` only while the optimiser holds it.
    model: Option<Transformer<B>>,
    optim: OptimizerAdaptor<FusedAdamW, Transformer<B>, B>,
}

impl<B: AutodiffModelBackend> Trainer<B> {
    /// A trainer for a freshly initialised model of `config`.
    pub fn new(config: &TransformerConfig, device: &B::Device) -> Self {
        Self::from_model(config.init(0, device))
    }

    /// A trainer for `model` (e.g. a loaded checkpoint).
    pub fn from_model(model: Transformer<B>) -> Self {
        let optim = FusedAdamW {
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.0,
        }
        .init();
        Self {
            model: Some(model),
            optim,
        }
    }

    /// One step of next-token training on `tokens`; returns the loss. Run
    /// as one step ([`ModelBackend::run_step`]), as the learner's are.
    pub fn step(&mut self, tokens: &Tensor<B, 2, Int>) -> f32 {
        B::run_step(|| self.step_here(tokens))
    }

    /// [`step`](Self::step) on the calling thread.
    fn step_here(&mut self, tokens: &Tensor<B, 2, Int>) -> f32 {
        let [b, s] = tokens.dims();
        let logits = self.model().forward(tokens.clone());
        // Every position's next token, the last position's a placeholder
        // weighted 0 (as HF's loss pads its labels with an ignored index):
        // the logits go to the loss whole, without a sliced copy.
        let device = tokens.device();
        let targets = Tensor::cat(
            vec![
                tokens.clone().slice([0..b, 1..s]),
                Tensor::zeros([b, 1], &device),
            ],
            1,
        );
        let weights: Vec<f32> = (0..b * s)
            .map(|i| if i % s == s - 1 { 0.0 } else { 1.0 })
            .collect();
        let weights = Tensor::<B, 2>::from_data(TensorData::new(weights, [b, s]), &device);
        let picked = kernels::token_log_probs(logits, targets) * weights;
        let loss = -kernels::sum(picked) / (b * (s - 1)) as f64;
        let value: f32 = loss.clone().into_scalar().elem();
        let grads = GradientsParams::from_grads(loss.backward(), self.model());
        // Handed over, not cloned: the optimiser updates weights held
        // nowhere else in place.
        let model = self.model.take().expect("the trainer holds its model");
        self.model = Some(self.optim.step(1e-4, model, grads));
        value
    }

    /// The model being trained.
    pub fn model(&self) -> &Transformer<B> {
        self.model.as_ref().expect("the trainer holds its model")
    }

    /// The inference view of the model.
    pub fn valid(&self) -> Transformer<B::InnerBackend> {
        self.model().valid()
    }
}

/// Greedy generation of [`NEW_TOKENS`] for each prompt, EOS disabled; returns the number of new tokens.
pub fn generate_greedy<B: ModelBackend>(model: &Transformer<B>, prompts: &[Vec<u32>]) -> usize {
    let mut rngs: Vec<RngStream> = (0..prompts.len() as u64).map(RngStream::from_u64).collect();
    let out = generate(
        model,
        None,
        prompts,
        &mut rngs,
        &GenerationConfig::greedy(NEW_TOKENS),
    )
    .expect("generation");
    out.iter().map(|g| g.token_ids.len()).sum()
}
