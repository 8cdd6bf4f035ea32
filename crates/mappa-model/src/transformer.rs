//! The decoder-only transformer shared by the Qwen3, Qwen2 and Llama 3.x
//! families: token embedding, `num_layers` pre-norm decoder layers
//! (grouped-query self-attention with rotary embeddings, SwiGLU MLP), a final
//! RMSNorm and an output projection that may share the embedding matrix.
//!
//! Field names mirror the HF module names (`self_attn.q_proj`, `mlp.gate_proj`,
//! `input_layernorm`, ...) so that the mapping to checkpoint tensors is plain.
//! Linear weights are kept in HF's `[out, in]` layout ([`Dense`]), so that
//! checkpoints load and save without transposes and decoding can multiply
//! the weight by the (few) token rows rather than the other way round.

use burn::module::Param;
use burn::nn::Embedding;
use burn::prelude::*;

use crate::cache::KvCache;
use crate::config::TransformerConfig;
use crate::error::Result;
use crate::kernels::{self, ModelBackend};
use crate::lora::{Lora, LoraConfig};
use crate::norm::RmsNorm;
use crate::rope::{Rope, RopeTables};

/// Grouped-query self-attention with optional QK-norm and projection biases.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// Query projection, `[hidden, num_heads * head_dim]`.
    pub q_proj: Dense<B>,
    /// Key projection, `[hidden, num_kv_heads * head_dim]`.
    pub k_proj: Dense<B>,
    /// Value projection, `[hidden, num_kv_heads * head_dim]`.
    pub v_proj: Dense<B>,
    /// Output projection, `[num_heads * head_dim, hidden]`.
    pub o_proj: Dense<B>,
    /// Per-head query RMSNorm (Qwen3).
    pub q_norm: Option<RmsNorm<B>>,
    /// Per-head key RMSNorm (Qwen3).
    pub k_norm: Option<RmsNorm<B>>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

/// The SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// Gate projection, `[hidden, intermediate]`.
    pub gate_proj: Dense<B>,
    /// Up projection, `[hidden, intermediate]`.
    pub up_proj: Dense<B>,
    /// Down projection, `[intermediate, hidden]`.
    pub down_proj: Dense<B>,
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Feed-forward block.
    pub mlp: Mlp<B>,
}

/// A decoder-only language model.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    /// Token embedding, `[vocab, hidden]`.
    pub embed_tokens: Embedding<B>,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final RMSNorm.
    pub norm: RmsNorm<B>,
    /// Output projection `[hidden, vocab]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Dense<B>>,
    #[module(skip)]
    config: TransformerConfig,
    #[module(skip)]
    rope: Rope,
    /// The LoRA settings of the adapters on the linear layers, if any.
    #[module(skip)]
    pub(crate) adapters: Option<LoraConfig>,
    /// How attention is computed.
    #[module(skip)]
    attention: AttentionKind,
}

/// How a model computes attention: the same function, with different
/// memory and different last bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    /// The scores of all queries against all keys, an additive mask, a
    /// softmax, then the values (`H S^2` floats per sequence and layer,
    /// saved for the backward pass, plus the mask). The default: what
    /// existing results were computed with.
    #[default]
    Dense,
    /// One operation ([`kernels::attention`]): on the CPU one query row at a
    /// time, never holding a score matrix, and a backward pass that
    /// recomputes the probabilities from each row's log-sum-exp.
    Fused,
}

/// Which keys each query sees, in the form the attention kind uses.
#[derive(Debug, Clone)]
pub enum AttentionMask<B: Backend> {
    /// An additive bias, `[batch, kv_heads, group, seq, past + seq]`
    /// ([`AttentionKind::Dense`] on backends that add one).
    Bias(Tensor<B, 5>),
    /// The causal mask's description, applied by the softmax
    /// ([`AttentionKind::Dense`] where [`ModelBackend::MASKS_IN_SOFTMAX`]:
    /// the same bits as the bias).
    InSoftmax(kernels::CausalMask),
    /// The causal mask's description ([`AttentionKind::Fused`]).
    Causal(kernels::CausalMask),
}

/// Per-forward inputs shared by every layer: rotary tables and the attention bias.
#[derive(Debug, Clone)]
pub struct LayerInputs<B: Backend> {
    /// Rotary tables, one row per token for its query and key heads.
    pub rope: RopeTables<B>,
    /// Which keys each query sees.
    pub mask: AttentionMask<B>,
    /// Rows of the batch.
    pub batch: usize,
    /// Columns of this forward call.
    pub seq: usize,
}

/// A linear layer stored as HF stores it.
#[derive(Module, Debug)]
pub struct Dense<B: Backend> {
    /// `[out, in]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// A LoRA adapter added to the layer's output ([`crate::lora`]).
    pub lora: Option<Lora<B>>,
}

/// At or below this many token rows, [`Dense::forward`] computes `W xᵀ`
/// rather than `x Wᵀ`: with few rows (decoding) that streams the weight
/// matrix through the matmul about 1.7x faster on the CPU backend.
const FEW_ROWS: usize = 64;

/// `x Wᵀ (+ b)` for `W` of shape `[out, in]`.
///
/// # Shapes
/// - `x`: `[rows, in]`; returns `[rows, out]`.
fn dense_forward<B: ModelBackend>(
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    x: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let rows = x.dims()[0];
    let y = if rows <= FEW_ROWS {
        kernels::matmul(weight, x.transpose()).transpose()
    } else {
        kernels::matmul(x, weight.transpose())
    };
    match bias {
        Some(b) => y + b.unsqueeze::<2>(),
        None => y,
    }
}

impl<B: ModelBackend> Dense<B> {
    /// # Shapes
    /// - `x`: `[rows, in]`; returns `[rows, out]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        // A frozen weight may be stored in bf16 (`with_frozen_bf16_base`).
        let weight = kernels::to_f32(self.weight.val());
        match &self.lora {
            None => dense_forward(weight, self.bias.as_ref().map(Param::val), x),
            Some(lora) => {
                let base = dense_forward(weight, self.bias.as_ref().map(Param::val), x.clone());
                kernels::add(base, lora.forward(x))
            }
        }
    }
}

impl<B: ModelBackend> Attention<B> {
    /// Attends over the cached keys and values plus the new ones.
    ///
    /// # Shapes
    /// - `x`: `[batch * seq, hidden]` (the new tokens, batch-major)
    /// - returns `[batch * seq, hidden]`
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        inputs: &LayerInputs<B>,
        cache: Option<&mut crate::cache::LayerCache<B>>,
    ) -> Tensor<B, 2> {
        let (b, s) = (inputs.batch, inputs.seq);
        let (h, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let rep = h / kvh;
        let n = b * s;
        // One row per (token, head).
        let mut q = self.q_proj.forward(x.clone()).reshape([n * h, hd]);
        let mut k = self.k_proj.forward(x.clone()).reshape([n * kvh, hd]);
        let v = self.v_proj.forward(x);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(q);
            k = kn.forward(k);
        }
        // Queries [b, h, s, hd] (heads grouped by their key/value head:
        // [b, kvh, rep, s, hd]); keys and values [b, kvh, s, hd].
        let q = inputs
            .rope
            .apply_scaled(q.reshape([b, s, h, hd]), (hd as f64).powf(-0.5));
        let k = inputs.rope.apply(k.reshape([b, s, kvh, hd]));
        let v = kernels::permute_contiguous(v.reshape([b, s, kvh, hd]), [0, 2, 1, 3]);
        let (k, v) = match cache {
            Some(cache) => cache.append(k, v),
            None => (k, v),
        };
        // Grouped-query attention without copying keys: the `rep` query
        // heads of a group are stacked as rows against their one key/value head.
        let t = k.dims()[2];
        let q = q.reshape([b, kvh, rep * s, hd]);
        let out = match &inputs.mask {
            AttentionMask::Bias(bias) => {
                let scores = kernels::matmul(q, k.swap_dims(2, 3))
                    + bias.clone().reshape([b, kvh, rep * s, t]);
                kernels::matmul(kernels::softmax(scores), v)
            }
            AttentionMask::InSoftmax(mask) => kernels::dense_attention(q, k, v, mask),
            AttentionMask::Causal(mask) => kernels::attention(q, k, v, mask),
        };
        let out = out.reshape([b, kvh, rep, s, hd]);
        let out = kernels::permute_contiguous(out, [0, 3, 1, 2, 4]).reshape([n, h * hd]);
        self.o_proj.forward(out)
    }
}

impl<B: ModelBackend> Mlp<B> {
    /// # Shapes
    /// - `x`: `[tokens, hidden]`; returns the same shape.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let gate = self.gate_proj.forward(x.clone());
        // burn's silu (g * sigmoid(g)) has a finite gradient everywhere; the
        // faster-looking g / (1 + e^-g) gives 0 * inf = NaN in the backward
        // pass once e^-g overflows (g < -88 in f32). The kernel computes it
        // that way, with the gating product, in one pass.
        let up = self.up_proj.forward(x);
        self.down_proj.forward(kernels::swiglu(gate, up))
    }
}

impl<B: ModelBackend> DecoderLayer<B> {
    /// # Shapes
    /// - `x`: `[tokens, hidden]`; returns the same shape.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        inputs: &LayerInputs<B>,
        cache: Option<&mut crate::cache::LayerCache<B>>,
    ) -> Tensor<B, 2> {
        let attn = self
            .self_attn
            .forward(self.input_layernorm.forward(x.clone()), inputs, cache);
        let x = kernels::add(x, attn);
        let mlp = self
            .mlp
            .forward(self.post_attention_layernorm.forward(x.clone()));
        kernels::add(x, mlp)
    }
}

/// Where the tokens of one forward call sit in a left-padded batch.
///
/// Row `r` holds `pad_left[r]` padding columns, then its tokens. A forward
/// call covers columns `start..start + len` of every row; the KV cache (when
/// used) holds the columns before `start`.
#[derive(Debug, Clone)]
pub struct Window<'a> {
    /// Padding columns at the left of each row.
    pub pad_left: &'a [usize],
    /// First column of this call.
    pub start: usize,
    /// Number of columns in this call.
    pub len: usize,
}

impl Window<'_> {
    /// The RoPE position of each (row, column) of the window, row-major.
    /// Padding columns get position 0; their outputs are never used.
    pub fn positions(&self) -> Vec<usize> {
        self.pad_left
            .iter()
            .flat_map(|&pad| {
                (self.start..self.start + self.len).map(move |c| c.saturating_sub(pad))
            })
            .collect()
    }

    /// Which keys each query of this window sees ([`kernels::CausalMask`]:
    /// a query at column `q` sees the keys at columns `pad..=q`, and always
    /// itself, so that even a padding query has one finite score and no NaN
    /// can arise).
    pub fn causal_mask(&self) -> kernels::CausalMask {
        kernels::CausalMask {
            pad_left: self.pad_left.to_vec(),
            start: self.start,
            seq: self.len,
        }
    }

    /// The causal mask as an additive bias, written out for every head.
    ///
    /// # Shapes
    /// - returns `[batch, kv_heads, group, len, start + len]`
    pub fn attention_bias<B: Backend>(
        &self,
        kv_heads: usize,
        group: usize,
        device: &B::Device,
    ) -> Tensor<B, 5> {
        let (batch, keys) = (self.pad_left.len(), self.start + self.len);
        self.causal_mask()
            .bias::<B>(kv_heads, 0..group * self.len, device)
            .reshape([batch, kv_heads, group, self.len, keys])
    }
}

impl<B: Backend> Transformer<B> {
    /// The model computing attention as `kind` says (the weights unchanged).
    pub fn with_attention(mut self, kind: AttentionKind) -> Self {
        self.attention = kind;
        self
    }

    /// How the model computes attention.
    pub fn attention(&self) -> AttentionKind {
        self.attention
    }

    /// Assembles a model from its parts (used by the initialisers and the weight loader).
    pub(crate) fn from_parts(
        config: TransformerConfig,
        embed_tokens: Embedding<B>,
        layers: Vec<DecoderLayer<B>>,
        norm: RmsNorm<B>,
        lm_head: Option<Dense<B>>,
    ) -> Self {
        let rope = Rope::new(&config.rope, config.head_dim);
        Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            config,
            rope,
            adapters: None,
            attention: AttentionKind::Dense,
        }
    }

    /// The architecture of this model.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> B::Device {
        self.embed_tokens.weight.device()
    }

    /// An empty KV cache for `batch` rows of up to `capacity` columns.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> KvCache<B> {
        KvCache::new(
            self.config.num_layers,
            batch,
            self.config.num_kv_heads,
            capacity,
            self.config.head_dim,
            &self.device(),
        )
    }
}

impl<B: ModelBackend> Transformer<B> {
    /// The token embeddings of `tokens` ([`kernels::embed_tokens`]).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`; returns `[batch, seq, hidden]`.
    pub(crate) fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        kernels::embed_tokens(self.embed_tokens.weight.val(), tokens)
    }

    /// Runs the decoder over one window of a left-padded batch and returns
    /// the final hidden states (after the last norm). With a cache, the
    /// window's keys and values are appended to it and attention also covers
    /// the cached columns.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, window.len]`
    /// - returns `[batch, window.len, hidden]`
    pub fn forward_hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        window: &Window<'_>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let device = tokens.device();
        let [batch, len] = tokens.dims();
        debug_assert_eq!(len, window.len);
        if let Some(cache) = cache.as_deref() {
            debug_assert_eq!(
                cache.len(),
                window.start,
                "cache length must equal the window start"
            );
        }
        let c = &self.config;
        let inputs = self.layer_inputs(window, batch, &device);
        let mut x = self.embed(tokens).reshape([batch * len, c.hidden_size]);
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|c| c.layer_mut(i));
            x = layer.forward(x, &inputs, layer_cache);
        }
        if let Some(cache) = cache {
            cache.advance(len);
        }
        self.norm.forward(x).reshape([batch, len, c.hidden_size])
    }

    /// The rotary tables and attention bias of one window of a batch of
    /// `batch` rows, shared by every layer.
    pub(crate) fn layer_inputs(
        &self,
        window: &Window<'_>,
        batch: usize,
        device: &B::Device,
    ) -> LayerInputs<B> {
        let c = &self.config;
        let positions = window.positions();
        LayerInputs {
            rope: self.rope.tables::<B>(&positions, device),
            mask: match self.attention {
                AttentionKind::Dense if B::MASKS_IN_SOFTMAX => {
                    AttentionMask::InSoftmax(window.causal_mask())
                }
                AttentionKind::Dense => AttentionMask::Bias(window.attention_bias::<B>(
                    c.num_kv_heads,
                    c.num_heads / c.num_kv_heads,
                    device,
                )),
                AttentionKind::Fused => AttentionMask::Causal(window.causal_mask()),
            },
            batch,
            seq: window.len,
        }
    }

    /// Projects hidden states to vocabulary logits.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, hidden]`
    /// - returns `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, s, h] = hidden.dims();
        let hidden = hidden.reshape([b * s, h]);
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => dense_forward(self.embed_tokens.weight.val(), None, hidden),
        };
        let vocab = logits.dims()[1];
        logits.reshape([b, s, vocab])
    }

    /// Logits for every position of unpadded sequences of equal length.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`
    /// - returns `[batch, seq, vocab]`
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, len] = tokens.dims();
        let pad = vec![0; batch];
        let window = Window {
            pad_left: &pad,
            start: 0,
            len,
        };
        self.logits(self.forward_hidden(tokens, &window, None))
    }
}

/// An RMSNorm with the given weights.
pub(crate) fn rms_norm<B: Backend>(gamma: Tensor<B, 1>, epsilon: f64) -> RmsNorm<B> {
    RmsNorm::new(gamma, epsilon)
}

/// A dense layer from an `[out, in]` weight and an optional bias.
pub(crate) fn dense<B: Backend>(weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Dense<B> {
    Dense {
        weight: Param::from_tensor(weight),
        bias: bias.map(Param::from_tensor),
        lora: None,
    }
}

impl<B: Backend> Attention<B> {
    /// Assembles an attention block; `qk_norm` holds the query and key norm weights.
    pub(crate) fn new(
        config: &TransformerConfig,
        [q_proj, k_proj, v_proj, o_proj]: [Dense<B>; 4],
        qk_norm: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    ) -> Self {
        let (q_norm, k_norm) = match qk_norm {
            Some((q, k)) => (
                Some(rms_norm(q, config.rms_norm_eps)),
                Some(rms_norm(k, config.rms_norm_eps)),
            ),
            None => (None, None),
        };
        Self {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        }
    }
}

/// Where the weights of a new model come from: a checkpoint, or a random
/// initialiser. Names are HF tensor-name prefixes (`model.layers.0.self_attn.q_proj`).
pub(crate) trait WeightSource<B: Backend> {
    /// The linear layer `name`, mapping `d_in` to `d_out` (weight `[d_out, d_in]`).
    fn linear(&mut self, name: &str, d_in: usize, d_out: usize, bias: bool) -> Result<Dense<B>>;
    /// The RMSNorm weight `name` (`{name}.weight`), of length `n`.
    fn norm(&mut self, name: &str, n: usize) -> Result<Tensor<B, 1>>;
    /// The embedding matrix `name` (`{name}.weight`), `[vocab, hidden]`.
    fn embedding(&mut self, name: &str, vocab: usize, hidden: usize) -> Result<Tensor<B, 2>>;
}

/// Builds a model of `config`, taking every weight from `source`: the one
/// place that knows the model's structure and its HF names.
pub(crate) fn assemble<B: Backend>(
    config: TransformerConfig,
    source: &mut impl WeightSource<B>,
) -> Result<Transformer<B>> {
    config.validate()?;
    let c = &config;
    let (h, q, kv) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
    );
    // Grown layer by layer: `num_layers` comes from a file, and a missing
    // tensor ends the loop long before an absurd count is reached.
    let mut layers = Vec::new();
    for i in 0..c.num_layers {
        let name = |rest: &str| format!("model.layers.{i}.{rest}");
        let projections = [
            source.linear(&name("self_attn.q_proj"), h, q, c.qkv_bias)?,
            source.linear(&name("self_attn.k_proj"), h, kv, c.qkv_bias)?,
            source.linear(&name("self_attn.v_proj"), h, kv, c.qkv_bias)?,
            source.linear(&name("self_attn.o_proj"), q, h, c.o_bias)?,
        ];
        let qk_norm = if c.qk_norm {
            Some((
                source.norm(&name("self_attn.q_norm"), c.head_dim)?,
                source.norm(&name("self_attn.k_norm"), c.head_dim)?,
            ))
        } else {
            None
        };
        let mlp = Mlp {
            gate_proj: source.linear(&name("mlp.gate_proj"), h, c.intermediate_size, c.mlp_bias)?,
            up_proj: source.linear(&name("mlp.up_proj"), h, c.intermediate_size, c.mlp_bias)?,
            down_proj: source.linear(&name("mlp.down_proj"), c.intermediate_size, h, c.mlp_bias)?,
        };
        layers.push(DecoderLayer {
            input_layernorm: rms_norm(source.norm(&name("input_layernorm"), h)?, c.rms_norm_eps),
            self_attn: Attention::new(c, projections, qk_norm),
            post_attention_layernorm: rms_norm(
                source.norm(&name("post_attention_layernorm"), h)?,
                c.rms_norm_eps,
            ),
            mlp,
        });
    }
    let norm = rms_norm(source.norm("model.norm", h)?, c.rms_norm_eps);
    let embed_tokens = Embedding {
        weight: Param::from_tensor(source.embedding("model.embed_tokens", c.vocab_size, h)?),
    };
    let lm_head = if c.tie_word_embeddings {
        None
    } else {
        Some(source.linear("lm_head", h, c.vocab_size, false)?)
    };
    Ok(Transformer::from_parts(
        config,
        embed_tokens,
        layers,
        norm,
        lm_head,
    ))
}

/// Random weights: normal with a given std, unit norms, zero biases.
struct RandomWeights<'a, B: Backend> {
    rng: mappa_core::RngStream,
    std: f64,
    device: &'a B::Device,
}

impl<B: Backend> RandomWeights<'_, B> {
    fn normal(&mut self, d0: usize, d1: usize) -> Tensor<B, 2> {
        let data: Vec<f32> = (0..d0 * d1)
            .map(|_| (self.rng.normal() * self.std) as f32)
            .collect();
        Tensor::from_data(TensorData::new(data, [d0, d1]), self.device)
    }
}

impl<B: Backend> WeightSource<B> for RandomWeights<'_, B> {
    fn linear(&mut self, _: &str, d_in: usize, d_out: usize, bias: bool) -> Result<Dense<B>> {
        let weight = self.normal(d_out, d_in);
        Ok(dense(
            weight,
            bias.then(|| Tensor::zeros([d_out], self.device)),
        ))
    }

    fn norm(&mut self, _: &str, n: usize) -> Result<Tensor<B, 1>> {
        Ok(Tensor::ones([n], self.device))
    }

    fn embedding(&mut self, _: &str, vocab: usize, hidden: usize) -> Result<Tensor<B, 2>> {
        Ok(self.normal(vocab, hidden))
    }
}

impl TransformerConfig {
    /// A randomly initialised model (normal weights with std `0.02`, unit
    /// norms, zero biases), drawn from a stream seeded with `seed` on the
    /// host, so that the same seed gives the same weights on every backend.
    ///
    /// Panics if the config is invalid (see [`TransformerConfig::validate`]).
    pub fn init<B: Backend>(&self, seed: u64, device: &B::Device) -> Transformer<B> {
        self.init_with_std(seed, 0.02, device)
    }

    /// Like [`TransformerConfig::init`] with a chosen weight std.
    pub fn init_with_std<B: Backend>(
        &self,
        seed: u64,
        std: f64,
        device: &B::Device,
    ) -> Transformer<B> {
        let mut source = RandomWeights {
            rng: mappa_core::RngStream::from_u64(seed),
            std,
            device,
        };
        assemble(self.clone(), &mut source).unwrap_or_else(|e| panic!("invalid model config: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::TestBackend;

    fn tiny(family: Family) -> TransformerConfig {
        TransformerConfig::for_family(family, 50, 16, 32, 2, 4, 2, 8)
    }

    /// Both branches of the linear layer, `W xᵀ` (up to [`FEW_ROWS`] rows:
    /// decoding, and the HF parity tests' short prompts) and `x Wᵀ` (more
    /// rows: every training step), give the same bits on the same rows, and
    /// agree with a plain f64 product.
    #[test]
    fn linear_layer_branches_agree_at_64_and_65_rows() {
        let device = Default::default();
        let (rows, inputs, outputs) = (FEW_ROWS + 1, 24, 10);
        let values =
            |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * k).sin() * 1.7).collect() };
        let (w, b, x) = (
            values(outputs * inputs, 0.37),
            values(outputs, 1.3),
            values(rows * inputs, 0.11),
        );
        let weight = || {
            Tensor::<TestBackend, 1>::from_floats(w.as_slice(), &device).reshape([outputs, inputs])
        };
        let bias = || Some(Tensor::<TestBackend, 1>::from_floats(b.as_slice(), &device));
        let input = |from: usize, to: usize| {
            Tensor::<TestBackend, 1>::from_floats(&x[from * inputs..to * inputs], &device)
                .reshape([to - from, inputs])
        };
        let all: Vec<f32> = dense_forward(weight(), bias(), input(0, rows))
            .into_data()
            .to_vec()
            .unwrap();
        let mut split: Vec<f32> = dense_forward(weight(), bias(), input(0, FEW_ROWS))
            .into_data()
            .to_vec()
            .unwrap();
        split.extend(
            dense_forward(weight(), bias(), input(FEW_ROWS, rows))
                .into_data()
                .to_vec::<f32>()
                .unwrap(),
        );
        assert_eq!(all.len(), rows * outputs);
        // The 64 rows of the `W xᵀ` branch are the `x Wᵀ` branch's bit for
        // bit (both are one FMA chain per element). A single row is a
        // matrix-vector product, which gemm sums in another (fixed) order:
        // equal to rounding only, which is why training recomputes the
        // log-probs it got while decoding.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let head = FEW_ROWS * outputs;
        assert_eq!(
            bits(&all[..head]),
            bits(&split[..head]),
            "x Wᵀ (65 rows) and W xᵀ (64 rows) differ"
        );
        for (a, b) in all[head..].iter().zip(&split[head..]) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
        }
        for r in 0..rows {
            for o in 0..outputs {
                let exact: f64 = b[o] as f64
                    + (0..inputs)
                        .map(|i| x[r * inputs + i] as f64 * w[o * inputs + i] as f64)
                        .sum::<f64>();
                let got = all[r * outputs + o] as f64;
                assert!(
                    (got - exact).abs() < 1e-5,
                    "row {r}, output {o}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn forward_shapes_and_param_count() {
        let device = Default::default();
        for family in [Family::Qwen3, Family::Qwen2, Family::Llama] {
            for tied in [false, true] {
                let config = tiny(family).with_tie_word_embeddings(tied);
                let model = config.init::<TestBackend>(1, &device);
                assert_eq!(
                    model.num_params(),
                    config.num_params(),
                    "{family:?} tied={tied}"
                );
                let tokens =
                    Tensor::<TestBackend, 2, Int>::from_data([[1, 2, 3], [4, 5, 6]], &device);
                assert_eq!(model.forward(tokens).dims(), [2, 3, 50]);
            }
        }
    }

    #[test]
    fn same_seed_same_weights() {
        let device = Default::default();
        let tokens = Tensor::<TestBackend, 2, Int>::from_data([[1, 2, 3]], &device);
        let a = tiny(Family::Llama)
            .init::<TestBackend>(5, &device)
            .forward(tokens.clone());
        let b = tiny(Family::Llama)
            .init::<TestBackend>(5, &device)
            .forward(tokens.clone());
        let c = tiny(Family::Llama)
            .init::<TestBackend>(6, &device)
            .forward(tokens);
        assert_eq!(a.to_data(), b.to_data());
        assert_ne!(a.to_data(), c.to_data());
    }

    #[test]
    fn mlp_gradients_stay_finite_for_saturated_gates() {
        use crate::backend::CpuAutodiff;
        let device = Default::default();
        let config = tiny(Family::Llama);
        let model = config.init::<CpuAutodiff>(1, &device);
        let mlp = &model.layers[0].mlp;
        // Inputs large enough to push some gate pre-activations far below -88.
        let x = Tensor::<CpuAutodiff, 2>::random(
            [4, 16],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        ) * 1.0e5;
        let grads = mlp.forward(x).sum().backward();
        for (name, g) in [
            ("gate_proj", mlp.gate_proj.weight.grad(&grads)),
            ("up_proj", mlp.up_proj.weight.grad(&grads)),
        ] {
            let values = g.expect("gradient").into_data().into_vec::<f32>().unwrap();
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{name}: non-finite gradient"
            );
        }
    }

    #[test]
    fn causal_and_padding_bias() {
        let pad = [0, 2];
        let window = Window {
            pad_left: &pad,
            start: 0,
            len: 3,
        };
        let bias = window.attention_bias::<TestBackend>(1, 1, &Default::default());
        let v = bias.into_data().to_vec::<f32>().unwrap();
        let allowed: Vec<bool> = v.iter().map(|x| *x == 0.0).collect();
        #[rustfmt::skip]
        let expected = [
            true, false, false,   true, true, false,   true, true, true,
            // row 1: columns 0 and 1 are padding; padding queries see themselves only
            true, false, false,   false, true, false,  false, false, true,
        ];
        assert_eq!(allowed, expected);
        assert_eq!(window.positions(), vec![0, 1, 2, 0, 0, 0]);
    }
}
