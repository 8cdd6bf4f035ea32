//! Backend-generic decoder-only language models for mappa.
//!
//! One [`Transformer`] covers the Qwen3, Qwen2 and Llama 3.x families
//! ([`config`]). Around it:
//! - [`weights`]: HF safetensors checkpoints in and out (single or sharded,
//!   f32/f16/bf16), under HF tensor names;
//! - [`tokenizer`] and [`chat`]: `tokenizer.json` and the chat template of
//!   `tokenizer_config.json`;
//! - [`generate`] with [`sampling`]: batched KV-cache generation returning the
//!   log-prob of every sampled token;
//! - [`logprobs`]: teacher-forced per-token log-probs, differentiable under an
//!   autodiff backend, for the trainer.
//!
//! - [`kernels`] (the `mappa-kernels` crate, re-exported): the operations
//!   whose floating-point results mappa pins itself ([`ModelBackend`]),
//!   bit-identical across x86-64 CPUs on the CPU backend.
//!
//! All model code is generic over `B: ModelBackend` (a burn `Backend` with
//! those operations); the concrete backend is chosen by the caller
//! ([`backend`] names the ones this crate was built with).

#![warn(missing_docs)]

pub mod backend;
pub mod cache;
pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod generate;
pub mod logprobs;
pub mod norm;
pub mod rope;
pub mod sampling;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use cache::KvCache;
pub use chat::{ChatMessage, ChatRequest, ChatTemplate};
pub use checkpoint::Checkpoint;
pub use config::{Family, TransformerConfig};
pub use error::{ModelError, Result};
pub use generate::{generate, FinishReason, Generation, GenerationConfig};
pub use logprobs::{completion_logprobs, CompletionLogprobs};
pub use mappa_kernels::{self as kernels, AutodiffModelBackend, ModelBackend};
pub use sampling::SamplingConfig;
pub use tokenizer::{HfTokenizer, Tokenizer};
pub use transformer::Transformer;
pub use weights::StorageDtype;

/// The backend the unit tests run on.
#[cfg(test)]
pub(crate) type TestBackend = backend::Cpu;
