//! Model configuration: our canonical [`TransformerConfig`] and its reading
//! from (and writing to) HuggingFace `config.json` files.
//!
//! Three families are covered, all decoder-only transformers with RMSNorm,
//! rotary embeddings, grouped-query attention and a SwiGLU MLP:
//!
//! | family | `model_type` | peculiarity |
//! |---|---|---|
//! | Qwen3 | `qwen3` | RMSNorm on each query and key head (QK-norm); `head_dim` explicit |
//! | Qwen2 | `qwen2` | bias on the q, k and v projections |
//! | Llama 3.x | `llama` | `llama3` RoPE frequency scaling |
//!
//! HF writes RoPE settings in two layouts, and both are read here:
//! - top level (`rope_theta`, `rope_scaling`), as most Hub checkpoints do;
//! - nested under `rope_parameters` (`rope_theta`, `rope_type`, scaling
//!   factors), as transformers 5 writes them.
//!
//! Every field value this crate cannot honour (another architecture, sliding
//! windows, another activation, an unknown RoPE type) is an error that names
//! the field, instead of a silently different model.

use std::path::Path;

use burn::config::Config;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// The model family, which decides the HF tensor names and the few
/// architectural differences between otherwise identical decoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Qwen3 (`Qwen3ForCausalLM`): QK-norm, explicit `head_dim`.
    Qwen3,
    /// Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`), also DeepSeek-R1-Distill-Qwen: QKV bias.
    Qwen2,
    /// Llama 3.x (`LlamaForCausalLM`): optional `llama3` RoPE scaling.
    Llama,
}

impl Family {
    /// The HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen3 => "qwen3",
            Family::Qwen2 => "qwen2",
            Family::Llama => "llama",
        }
    }

    /// The HF architecture class name.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Llama => "LlamaForCausalLM",
        }
    }

    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen3" => Some(Family::Qwen3),
            "qwen2" => Some(Family::Qwen2),
            "llama" => Some(Family::Llama),
            _ => None,
        }
    }

    fn from_architecture(arch: &str) -> Option<Self> {
        [Family::Qwen3, Family::Qwen2, Family::Llama]
            .into_iter()
            .find(|f| f.architecture() == arch)
    }
}

/// The `llama3` RoPE frequency scaling of Llama 3.1+ (HF `rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Llama3RopeScaling {
    /// Overall context extension factor (8.0 for Llama 3.1).
    pub factor: f64,
    /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are divided by `factor`.
    pub low_freq_factor: f64,
    /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context length the base model was pre-trained with.
    pub original_max_position_embeddings: usize,
}

/// Rotary position embedding settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeConfig {
    /// The RoPE base (`rope_theta`).
    pub theta: f64,
    /// `llama3` frequency scaling, when the checkpoint uses it.
    pub llama3_scaling: Option<Llama3RopeScaling>,
}

/// The most parameters a [`TransformerConfig`] may describe (2^40, beyond
/// any model this crate can run): it bounds what the sizes of a hostile
/// `config.json` can make us allocate.
pub const MAX_PARAMS: usize = 1 << 40;

/// Parameter counts of a model's parts (see `TransformerConfig::param_counts`).
struct ParamCounts {
    /// Query heads times head width.
    attention_width: u128,
    /// One layer's attention block.
    attention: u128,
    /// One layer's MLP.
    mlp: u128,
    /// The embedding matrix.
    embed: u128,
    /// The whole model.
    total: u128,
}

/// The architecture of one decoder-only language model.
///
/// Built from a HF `config.json` with [`TransformerConfig::from_hf_json`], or
/// by hand for tests and benches; turned into a model with
/// [`TransformerConfig::init`](crate::Transformer).
#[derive(Config, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Which family's tensor names and peculiarities apply.
    pub family: Family,
    /// Number of rows of the embedding and output matrices.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (grouped-query attention); divides `num_heads`.
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    #[config(default = 1e-6)]
    pub rms_norm_eps: f64,
    /// Rotary embedding settings.
    pub rope: RopeConfig,
    /// Whether the output projection shares the embedding matrix.
    #[config(default = false)]
    pub tie_word_embeddings: bool,
    /// Bias on the q, k, v projections.
    #[config(default = false)]
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    #[config(default = false)]
    pub o_bias: bool,
    /// Bias on the three MLP projections.
    #[config(default = false)]
    pub mlp_bias: bool,
    /// RMSNorm on every query and key head before RoPE (Qwen3).
    #[config(default = false)]
    pub qk_norm: bool,
    /// The longest context the checkpoint was trained for (informational; not a hard limit here).
    #[config(default = 4096)]
    pub max_position_embeddings: usize,
    /// End-of-sequence token ids named by `config.json` (generation adds the tokenizer's own).
    #[config(default = "Vec::new()")]
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token id, when the config names one.
    #[config(default = "None")]
    pub bos_token_id: Option<u32>,
}

impl TransformerConfig {
    /// A config with the family's usual flags (QK-norm for Qwen3, QKV bias
    /// for Qwen2), RoPE theta 10000 and no scaling, for tests and benches.
    #[allow(clippy::too_many_arguments)] // one per dimension of the model, named as in config.json
    pub fn for_family(
        family: Family,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_layers: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let rope = RopeConfig {
            theta: 10_000.0,
            llama3_scaling: None,
        };
        Self::new(
            family,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rope,
        )
        .with_qk_norm(family == Family::Qwen3)
        .with_qkv_bias(family == Family::Qwen2)
    }

    /// Number of parameters of a model with this config (saturating at
    /// `usize::MAX` for sizes that [`TransformerConfig::validate`] refuses).
    pub fn num_params(&self) -> usize {
        usize::try_from(self.param_counts().total).unwrap_or(usize::MAX)
    }

    /// Parameter counts of the model's parts, in saturating `u128`
    /// arithmetic: no size from a `config.json` can overflow them.
    fn param_counts(&self) -> ParamCounts {
        let n = |x: usize| x as u128;
        let h = n(self.hidden_size);
        let q = n(self.num_heads).saturating_mul(n(self.head_dim));
        let kv = n(self.num_kv_heads).saturating_mul(n(self.head_dim));
        let attention = h
            .saturating_mul(q.saturating_mul(2).saturating_add(kv.saturating_mul(2)))
            .saturating_add(if self.qkv_bias {
                q.saturating_add(kv.saturating_mul(2))
            } else {
                0
            })
            .saturating_add(if self.o_bias { h } else { 0 })
            .saturating_add(if self.qk_norm {
                2 * n(self.head_dim)
            } else {
                0
            });
        let inter = n(self.intermediate_size);
        let mlp = h
            .saturating_mul(inter)
            .saturating_mul(3)
            .saturating_add(if self.mlp_bias {
                inter.saturating_mul(2).saturating_add(h)
            } else {
                0
            });
        let layer = attention.saturating_add(mlp).saturating_add(2 * h);
        let embed = n(self.vocab_size).saturating_mul(h);
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let total = embed
            .saturating_add(head)
            .saturating_add(n(self.num_layers).saturating_mul(layer))
            .saturating_add(h);
        ParamCounts {
            attention_width: q,
            attention,
            mlp,
            embed,
            total,
        }
    }

    /// Checks the invariants the model relies on.
    pub fn validate(&self) -> Result<()> {
        let field = |name: &str, msg: String| Err(ModelError::config(None, name, msg));
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return field(name, "must be at least 1".into());
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return field(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_kv_heads, self.num_heads
                ),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return field(
                "head_dim",
                format!("{} must be even for RoPE", self.head_dim),
            );
        }
        if self.rope.theta.is_nan() || self.rope.theta <= 0.0 {
            return field(
                "rope_theta",
                format!("{} must be positive", self.rope.theta),
            );
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return field(
                "rms_norm_eps",
                format!("{} must be positive", self.rms_norm_eps),
            );
        }
        // Bounds what a config makes us allocate, and every size product
        // computed from it: the part that grows too big names its field.
        let counts = self.param_counts();
        for (name, value, count) in [
            (
                "num_attention_heads",
                self.num_heads,
                counts.attention_width,
            ),
            ("hidden_size", self.hidden_size, counts.attention),
            ("intermediate_size", self.intermediate_size, counts.mlp),
            ("vocab_size", self.vocab_size, counts.embed),
            ("num_hidden_layers", self.num_layers, counts.total),
        ] {
            if count > MAX_PARAMS as u128 {
                return field(
                    name,
                    format!(
                        "{value} makes the model larger than the {MAX_PARAMS} parameters supported \
                         (vocab_size {}, hidden_size {}, intermediate_size {}, num_hidden_layers {}, \
                         num_attention_heads {}, num_key_value_heads {}, head_dim {})",
                        self.vocab_size,
                        self.hidden_size,
                        self.intermediate_size,
                        self.num_layers,
                        self.num_heads,
                        self.num_kv_heads,
                        self.head_dim
                    ),
                );
            }
        }
        Ok(())
    }

    /// Reads a HF `config.json` file.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ModelError::io("cannot read", path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| {
            ModelError::config(Some(path), "(file)", format!("is not valid JSON: {e}"))
        })?;
        Self::from_hf_json(&json).map_err(|e| e.in_file(path))
    }

    /// Reads a parsed HF `config.json` (either RoPE layout).
    pub fn from_hf_json(json: &Value) -> Result<Self> {
        let hf: HfConfig = serde_path_to_error::deserialize(json).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." { "(schema)" } else { &field };
            ModelError::config(None, field, e.inner().to_string())
        })?;
        hf.into_config()
    }

    /// Writes this config as a HF `config.json` value, in the top-level RoPE
    /// layout that both transformers 4.x and 5.x read. `dtype` is the storage
    /// dtype of the weights saved beside it (`"float32"`, `"bfloat16"`, ...).
    pub fn to_hf_json(&self, dtype: &str) -> Value {
        let mut obj = serde_json::Map::new();
        let mut put = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        put(
            "architectures",
            serde_json::json!([self.family.architecture()]),
        );
        put("model_type", self.family.model_type().into());
        put("vocab_size", self.vocab_size.into());
        put("hidden_size", self.hidden_size.into());
        put("intermediate_size", self.intermediate_size.into());
        put("num_hidden_layers", self.num_layers.into());
        put("num_attention_heads", self.num_heads.into());
        put("num_key_value_heads", self.num_kv_heads.into());
        put("head_dim", self.head_dim.into());
        put("hidden_act", "silu".into());
        put("rms_norm_eps", self.rms_norm_eps.into());
        put(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        put("tie_word_embeddings", self.tie_word_embeddings.into());
        put("rope_theta", self.rope.theta.into());
        put(
            "rope_scaling",
            match self.rope.llama3_scaling {
                Some(s) => serde_json::json!({
                    "rope_type": "llama3",
                    "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor,
                    "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings,
                }),
                None => Value::Null,
            },
        );
        match self.family {
            Family::Qwen3 | Family::Llama => put("attention_bias", self.qkv_bias.into()),
            Family::Qwen2 => {}
        }
        if self.family == Family::Llama {
            put("mlp_bias", self.mlp_bias.into());
        }
        if matches!(self.family, Family::Qwen2 | Family::Qwen3) {
            put("use_sliding_window", false.into());
        }
        if let Some(bos) = self.bos_token_id {
            put("bos_token_id", bos.into());
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => put("eos_token_id", (*one).into()),
            many => put("eos_token_id", serde_json::json!(many)),
        }
        put("torch_dtype", dtype.into());
        put("dtype", dtype.into());
        Value::Object(obj)
    }
}

/// A token id or a list of them (`eos_token_id` takes both forms).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// The subset of a HF `config.json` that matters here. Fields not listed are ignored.
#[derive(Debug, Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_act: Option<String>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    partial_rotary_factor: Option<f64>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<String>>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
}

/// Llama 3's RoPE scaling from `source` (`rope_parameters` or
/// `rope_scaling`), its numbers read by `num`; every field is required
/// and checked.
fn llama3_scaling(
    source: &str,
    num: &dyn Fn(&str) -> Result<Option<f64>>,
) -> Result<Llama3RopeScaling> {
    let bad =
        |key: &str, message: String| ModelError::config(None, &format!("{source}.{key}"), message);
    let need = |key: &str| -> Result<f64> {
        num(key)?.ok_or_else(|| bad(key, "is required for rope_type llama3".into()))
    };
    let scaling = Llama3RopeScaling {
        factor: need("factor")?,
        low_freq_factor: need("low_freq_factor")?,
        high_freq_factor: need("high_freq_factor")?,
        original_max_position_embeddings: {
            let n = need("original_max_position_embeddings")?;
            if !(n >= 1.0 && n.fract() == 0.0 && n <= u32::MAX as f64) {
                return Err(bad(
                    "original_max_position_embeddings",
                    format!("{n} must be a positive integer"),
                ));
            }
            n as usize
        },
    };
    for (key, value) in [
        ("factor", scaling.factor),
        ("low_freq_factor", scaling.low_freq_factor),
    ] {
        if value.is_nan() || value <= 0.0 {
            return Err(bad(key, format!("{value} must be positive")));
        }
    }
    if scaling.high_freq_factor.is_nan() || scaling.high_freq_factor <= scaling.low_freq_factor {
        return Err(bad(
            "high_freq_factor",
            "must be greater than low_freq_factor".into(),
        ));
    }
    Ok(scaling)
}

impl HfConfig {
    fn family(&self) -> Result<Family> {
        let err = |field: &str, msg: String| Err(ModelError::config(None, field, msg));
        if let Some(mt) = &self.model_type {
            return match Family::from_model_type(mt) {
                Some(f) => Ok(f),
                None => err(
                    "model_type",
                    format!("`{mt}` is not supported (supported: qwen3, qwen2, llama)"),
                ),
            };
        }
        match self.architectures.as_deref() {
            Some([arch, ..]) => match Family::from_architecture(arch) {
                Some(f) => Ok(f),
                None => err(
                    "architectures",
                    format!(
                        "`{arch}` is not supported (supported: Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)"
                    ),
                ),
            },
            _ => err("model_type", "is missing (and so is architectures)".into()),
        }
    }

    /// The RoPE settings, from `rope_parameters` (transformers 5) or the top level.
    fn rope(&self) -> Result<RopeConfig> {
        let (source, params): (&str, Option<&Value>) = match &self.rope_parameters {
            Some(p) if !p.is_null() => ("rope_parameters", Some(p)),
            _ => (
                "rope_scaling",
                self.rope_scaling.as_ref().filter(|v| !v.is_null()),
            ),
        };
        let num = |key: &str| -> Result<Option<f64>> {
            match params.and_then(|p| p.get(key)) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    ModelError::config(
                        None,
                        &format!("{source}.{key}"),
                        format!("`{v}` is not a number"),
                    )
                }),
            }
        };
        let (theta_field, theta) = match (source, num("rope_theta")?) {
            ("rope_parameters", Some(t)) => ("rope_parameters.rope_theta", t),
            _ => ("rope_theta", self.rope_theta.unwrap_or(10_000.0)),
        };
        if theta.is_nan() || theta <= 0.0 {
            return Err(ModelError::config(
                None,
                theta_field,
                format!("{theta} must be positive"),
            ));
        }
        if let Some(p) = params {
            if !p.is_object() {
                return Err(ModelError::config(
                    None,
                    source,
                    format!("`{p}` is not an object"),
                ));
            }
        }
        let rope_type = params
            .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let llama3_scaling = match rope_type {
            "default" => None,
            "llama3" => Some(llama3_scaling(source, &num)?),
            other => {
                return Err(ModelError::config(
                    None,
                    &format!("{source}.rope_type"),
                    format!("`{other}` is not supported (supported: default, llama3)"),
                ))
            }
        };
        Ok(RopeConfig {
            theta,
            llama3_scaling,
        })
    }

    /// Refuse the features this crate does not implement, naming the field.
    fn check_supported(&self) -> Result<()> {
        let err = |field: &str, msg: String| Err(ModelError::config(None, field, msg));
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return err(
                    "hidden_act",
                    format!("`{act}` is not supported (supported: silu)"),
                );
            }
        }
        if self.use_sliding_window == Some(true) {
            return err(
                "use_sliding_window",
                "sliding-window attention is not supported".into(),
            );
        }
        if let Some(types) = &self.layer_types {
            if let Some(t) = types.iter().find(|t| t.as_str() != "full_attention") {
                return err(
                    "layer_types",
                    format!("`{t}` is not supported (supported: full_attention)"),
                );
            }
        }
        if let Some(f) = self.partial_rotary_factor {
            if f != 1.0 {
                return err(
                    "partial_rotary_factor",
                    format!("{f} is not supported (only 1.0)"),
                );
            }
        }
        Ok(())
    }

    fn into_config(self) -> Result<TransformerConfig> {
        let err = |field: &str, msg: String| Err(ModelError::config(None, field, msg));
        let family = self.family()?;
        self.check_supported()?;
        let rope = self.rope()?;
        let num_kv_heads = self.num_key_value_heads.unwrap_or(self.num_attention_heads);
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads) && self.head_dim.is_none()
        {
            return err(
                "head_dim",
                format!(
                    "is missing and hidden_size {} is not divisible by num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            );
        }
        let head_dim = self
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads);
        let attention_bias = self.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            Family::Qwen2 => (true, false),
            Family::Qwen3 | Family::Llama => (attention_bias, attention_bias),
        };
        let mlp_bias = match family {
            Family::Llama => self.mlp_bias.unwrap_or(false),
            _ => false,
        };
        let ids = |v: Option<OneOrMany>| match v {
            None => Vec::new(),
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
        };
        let config = TransformerConfig {
            family,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: family == Family::Qwen3,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(4096),
            eos_token_ids: ids(self.eos_token_id),
            bos_token_id: ids(self.bos_token_id).first().copied(),
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base(model_type: &str) -> Value {
        json!({
            "architectures": ["X"],
            "model_type": model_type,
            "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6, "eos_token_id": [7, 8], "bos_token_id": 1
        })
    }

    fn with(mut v: Value, extra: Value) -> Value {
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn both_rope_layouts_read_the_same() {
        let scaling = json!({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192});
        let mut top = with(base("llama"), json!({"rope_theta": 500000.0}));
        top["rope_scaling"] = with(scaling.clone(), json!({"rope_type": "llama3"}));
        let mut nested = base("llama");
        nested["rope_parameters"] = with(
            scaling,
            json!({"rope_type": "llama3", "rope_theta": 500000.0}),
        );
        let a = TransformerConfig::from_hf_json(&top).unwrap();
        let b = TransformerConfig::from_hf_json(&nested).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope.theta, 500000.0);
        assert_eq!(
            a.rope
                .llama3_scaling
                .unwrap()
                .original_max_position_embeddings,
            8192
        );
    }

    #[test]
    fn legacy_type_key_is_read() {
        let mut v = base("llama");
        v["rope_scaling"] = json!({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert!(TransformerConfig::from_hf_json(&v)
            .unwrap()
            .rope
            .llama3_scaling
            .is_some());
    }

    #[test]
    fn head_dim_explicit_or_derived() {
        let c = TransformerConfig::from_hf_json(&base("qwen2")).unwrap();
        assert_eq!(c.head_dim, 8);
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
        let c =
            TransformerConfig::from_hf_json(&with(base("qwen3"), json!({"head_dim": 16}))).unwrap();
        assert_eq!(c.head_dim, 16);
        assert!(c.qk_norm && !c.qkv_bias);
        assert_eq!(c.eos_token_ids, vec![7, 8]);
        assert_eq!(c.bos_token_id, Some(1));
    }

    #[test]
    fn unsupported_values_name_the_field() {
        let cases = [
            (with(base("mistral"), json!({})), "model_type"),
            (
                with(base("qwen2"), json!({"use_sliding_window": true})),
                "use_sliding_window",
            ),
            (
                with(base("llama"), json!({"hidden_act": "gelu"})),
                "hidden_act",
            ),
            (
                with(
                    base("llama"),
                    json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
                ),
                "rope_scaling.rope_type",
            ),
            (
                with(
                    base("qwen3"),
                    json!({"rope_parameters": {"rope_type": "dynamic"}}),
                ),
                "rope_parameters.rope_type",
            ),
            (
                with(base("llama"), json!({"num_key_value_heads": 3})),
                "num_key_value_heads",
            ),
            (
                with(
                    base("qwen3"),
                    json!({"layer_types": ["full_attention", "sliding_attention"]}),
                ),
                "layer_types",
            ),
            (
                with(
                    base("llama"),
                    json!({"rope_scaling": {"rope_type": "llama3", "factor": 0.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
                ),
                "rope_scaling.factor",
            ),
        ];
        for (json, field) in cases {
            let err = TransformerConfig::from_hf_json(&json)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{err} should name {field}");
        }
        let mut missing = base("llama");
        missing.as_object_mut().unwrap().remove("hidden_size");
        let err = TransformerConfig::from_hf_json(&missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("hidden_size"), "{err}");
    }

    #[test]
    fn hf_json_round_trip() {
        let mut v = with(
            base("llama"),
            json!({"rope_theta": 500000.0, "tie_word_embeddings": true, "attention_bias": true}),
        );
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = TransformerConfig::from_hf_json(&v).unwrap();
        let again = TransformerConfig::from_hf_json(&c.to_hf_json("float32")).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn param_count_matches_formula_for_tied_qwen3() {
        let c = TransformerConfig::for_family(Family::Qwen3, 10, 4, 6, 1, 2, 1, 2)
            .with_tie_word_embeddings(true);
        // embed 40 + layer (q 16 + k 8 + v 8 + o 16 + qk-norm 4 + mlp 72 + norms 8) + final norm 4
        assert_eq!(c.num_params(), 40 + 132 + 4);
    }
}
