//! Backend-generic decoder-only language models for mappa.
//!
//! One [`Transformer`] covers the Qwen3, Qwen2 and Llama 3.x families
//! ([`config`]). Around it:
//! - [`weights`]: HF safetensors checkpoints in and out (single or sharded,
//!   f32/f16/bf16), under HF tensor names;
//! - [`gguf`]: llama.cpp's GGUF files read natively (metadata, tokenizer,
//!   chat template, tensors dequantised from F32/F16/BF16/Q8_0/Q4_0/Q4_1/
//!   Q5_0/Q4_K/Q6_K) and converted into HF checkpoint directories;
//! - [`tokenizer`] and [`chat`]: `tokenizer.json` and the chat template of
//!   `tokenizer_config.json`;
//! - [`generate`](mod@generate) with [`sampling`]: batched KV-cache generation returning the
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
//!
//! # Two entry points
//!
//! - [`Model`] ([`model`]): plain Rust in and out. [`Model::load`] reads only
//!   `config.json` and the safetensors weights (no tokenizer), onto the CPU;
//!   [`Model::logits`] and [`Model::greedy`] take `&[u32]` ids and return
//!   [`Logits`] and `Vec<u32>`. No tensor, tokenizer or random stream needed.
//! - [`Checkpoint`]: the model with its tokenizer and chat template
//!   ([`Checkpoint::load`] requires `tokenizer.json`), for text in and out via
//!   [`generate`](generate()) (one [`RngStream`] per prompt; greedy decoding
//!   without streams is [`generate_greedy`]) and [`completion_logprobs`].
//!   Token ids are passed to both as any `AsRef<[u32]>` (`Vec<u32>`,
//!   `&[u32]`, arrays).
//!
//! # Depending only on this crate
//!
//! A client needs no direct dependency on burn or mappa-core: [`burn`] is
//! re-exported at the version and with the features this crate was built
//! with (`mappa_model::burn::prelude::*` for tensors), the backends are
//! named in [`backend`] ([`Cpu`] is re-exported here; GPU backends come with
//! this crate's `cuda` and `wgpu` features), and [`RngStream`] and
//! [`SeedTree`] (from mappa-core) are re-exported for [`generate`](generate()).

#![warn(missing_docs)]

pub mod backend;
pub mod cache;
pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod device;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod logprobs;
pub mod lora;
pub mod model;
pub mod norm;
pub mod rope;
pub mod sampling;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

/// The burn crate this crate is built on, at its pinned version and with the
/// features this crate enables (`std`, `flex`, `autodiff`, plus the backend
/// features of this crate): use it instead of depending on burn directly.
pub use burn;

pub use backend::Cpu;
pub use cache::KvCache;
pub use chat::{ChatMessage, ChatRequest, ChatTemplate};
pub use checkpoint::Checkpoint;
pub use config::{Family, TransformerConfig};
pub use error::{ModelError, Result};
pub use generate::{generate, generate_greedy, FinishReason, Generation, GenerationConfig};
pub use logprobs::{completion_logprobs, layerwise_gradients, CompletionLogprobs};
pub use lora::LoraConfig;
pub use mappa_core::{RngStream, SeedTree};
pub use mappa_kernels::{self as kernels, AutodiffModelBackend, ModelBackend};
pub use model::{Logits, Model};
pub use sampling::SamplingConfig;
pub use tokenizer::{HfTokenizer, Tokenizer};
pub use transformer::{AttentionKind, Transformer};
pub use weights::StorageDtype;

/// The backend the unit tests run on.
#[cfg(test)]
pub(crate) type TestBackend = backend::Cpu;
