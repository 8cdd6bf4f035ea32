//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
//! Language Models") on the transformer's linear layers, in PEFT's layout.
//!
//! A targeted projection `y = W x (+ b)` becomes `y = W x (+ b) + s · B A x`
//! with `A: [rank, in]`, `B: [out, rank]` and `s = alpha / rank` (or
//! `alpha / sqrt(rank)` with rsLoRA). [`Transformer::with_lora`] freezes
//! every base weight and adds fresh adapters (`A` uniform in
//! `±1/sqrt(in)`, PEFT's Kaiming-uniform default, drawn from a seeded
//! stream; `B = 0`, so the model starts as the base); only adapters then
//! receive gradients. Because burn's CPU tensors share their storage on
//! clone, every agent built from one loaded base holds the base weights
//! once, and [`Transformer::without_adapters`] is the KL reference without a
//! second copy.
//!
//! On disk an adapter is what `peft`'s `save_pretrained` writes and vLLM's
//! `/v1/load_lora_adapter` reads: `adapter_config.json` and
//! `adapter_model.safetensors` with tensors named
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`
//! ([`save_adapters`], [`load_adapters`]). [`Transformer::merge_adapters`]
//! folds them into the base weights for export as a plain HF checkpoint.

use std::collections::BTreeSet;
use std::path::Path;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::FloatDType;
use mappa_core::RngStream;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::kernels::{self, ModelBackend};
use crate::transformer::{Dense, Transformer};
use crate::weights::{host, tensors_to_safetensors_bytes, SafetensorsSet, StorageDtype};

/// The projections an adapter may target, by their HF (and PEFT) names.
pub const TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The adapter file names of PEFT's layout.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The adapter weights of PEFT's layout.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// LoRA settings, as in a manifest's `[train.lora]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank `r`.
    pub rank: usize,
    /// The scale numerator: the adapter's output is multiplied by `alpha / rank`.
    pub alpha: f64,
    /// Projections to adapt (HF names, see [`TARGETS`]); all seven by default.
    #[serde(default = "all_targets")]
    pub targets: Vec<String>,
    /// rsLoRA (Kalajdzievski 2023): scale by `alpha / sqrt(rank)` instead.
    #[serde(default)]
    pub rslora: bool,
}

fn all_targets() -> Vec<String> {
    TARGETS.iter().map(|t| t.to_string()).collect()
}

impl LoraConfig {
    /// Rank `rank` and scale numerator `alpha` on every projection.
    pub fn new(rank: usize, alpha: f64) -> Self {
        Self {
            rank,
            alpha,
            targets: all_targets(),
            rslora: false,
        }
    }

    /// The factor the adapter's output is multiplied by.
    pub fn scaling(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Check ranges; the error names the field and what was expected.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.rank == 0 {
            return Err("rank: expected at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!(
                "alpha: expected a positive number, got {}",
                self.alpha
            ));
        }
        if self.targets.is_empty() {
            return Err(format!(
                "targets: expected at least one of {}",
                TARGETS.join(", ")
            ));
        }
        let mut seen = BTreeSet::new();
        for t in &self.targets {
            if !TARGETS.contains(&t.as_str()) {
                return Err(format!(
                    "targets: unknown projection {t:?}, expected some of {}",
                    TARGETS.join(", ")
                ));
            }
            if !seen.insert(t) {
                return Err(format!("targets: {t:?} is listed twice"));
            }
        }
        Ok(())
    }

    /// The same settings with `targets` in [`TARGETS`]'s order (how a model
    /// stores them, so that two spellings of one setting compare equal).
    pub fn canonical(&self) -> LoraConfig {
        let mut targets = self.targets.clone();
        targets.sort_by_key(|t| TARGETS.iter().position(|k| k == t).unwrap_or(usize::MAX));
        LoraConfig {
            targets,
            ..self.clone()
        }
    }

    /// Whether the projection `name` gets an adapter.
    fn adapts(&self, name: &str) -> bool {
        self.targets.iter().any(|t| t == name)
    }
}

/// One adapter: `s · B A x` added to a linear layer's output.
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `A`, `[rank, in]` (PEFT's `lora_A.weight`).
    pub lora_a: Param<Tensor<B, 2>>,
    /// `B`, `[out, rank]` (PEFT's `lora_B.weight`).
    pub lora_b: Param<Tensor<B, 2>>,
    /// The scale `s`.
    #[module(skip)]
    scaling: f64,
}

impl<B: Backend> Lora<B> {
    /// An adapter with the given matrices.
    pub fn new(lora_a: Tensor<B, 2>, lora_b: Tensor<B, 2>, scaling: f64) -> Self {
        Self {
            lora_a: Param::from_tensor(lora_a),
            lora_b: Param::from_tensor(lora_b),
            scaling,
        }
    }

    /// The dense update `s · B A`, `[out, in]`.
    pub fn delta(&self) -> Tensor<B, 2> {
        self.lora_b.val().matmul(self.lora_a.val()) * self.scaling
    }
}

impl<B: ModelBackend> Lora<B> {
    /// # Shapes
    /// - `x`: `[rows, in]`; returns `[rows, out]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let low = kernels::matmul(x, self.lora_a.val().transpose());
        kernels::matmul(low, self.lora_b.val().transpose()) * self.scaling
    }
}

/// Every adaptable projection of the model with its HF name prefix
/// (`model.layers.{i}.self_attn.q_proj`) and short name (`q_proj`), in a
/// fixed order: layer by layer, then [`TARGETS`]'s order.
fn projections_mut<B: Backend>(
    model: &mut Transformer<B>,
) -> Vec<(String, &'static str, &mut Dense<B>)> {
    let mut out = Vec::new();
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let a = &mut layer.self_attn;
        let m = &mut layer.mlp;
        let group: [(&'static str, &'static str, &mut Dense<B>); 7] = [
            ("self_attn", "q_proj", &mut a.q_proj),
            ("self_attn", "k_proj", &mut a.k_proj),
            ("self_attn", "v_proj", &mut a.v_proj),
            ("self_attn", "o_proj", &mut a.o_proj),
            ("mlp", "gate_proj", &mut m.gate_proj),
            ("mlp", "up_proj", &mut m.up_proj),
            ("mlp", "down_proj", &mut m.down_proj),
        ];
        for (block, name, dense) in group {
            out.push((format!("model.layers.{i}.{block}.{name}"), name, dense));
        }
    }
    out
}

/// PEFT's tensor name of an adapter matrix (`which` is `lora_A` or `lora_B`).
fn peft_name(prefix: &str, which: &str) -> String {
    format!("base_model.model.{prefix}.{which}.weight")
}

impl<B: Backend> Transformer<B> {
    /// The LoRA settings of the model's adapters, if it has any.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.adapters.as_ref()
    }

    /// Freezes every base weight and adds fresh adapters on the projections
    /// `config` targets: `A` uniform in `±1/sqrt(in)` drawn from `rng` (layer
    /// by layer, in [`TARGETS`]'s order), `B = 0`. The result computes the
    /// same outputs as the base until `B` is trained.
    pub fn with_lora(mut self, config: &LoraConfig, rng: &mut RngStream) -> Result<Self> {
        config
            .validate()
            .map_err(|e| ModelError::Input(format!("LoRA: {e}")))?;
        if self.adapters.is_some() {
            return Err(ModelError::Input(
                "LoRA: the model already has adapters (merge or remove them first)".into(),
            ));
        }
        self = self.no_grad();
        let device = self.device();
        let scaling = config.scaling();
        for (_, name, dense) in projections_mut(&mut self) {
            if !config.adapts(name) {
                continue;
            }
            let [out, d_in] = dense.weight.dims();
            let bound = 1.0 / (d_in as f64).sqrt();
            let a: Vec<f32> = (0..config.rank * d_in)
                .map(|_| ((2.0 * rng.uniform() - 1.0) * bound) as f32)
                .collect();
            let a = Tensor::from_data(TensorData::new(a, [config.rank, d_in]), &device);
            let b = Tensor::zeros([out, config.rank], &device);
            dense.lora = Some(Lora::new(a, b, scaling));
        }
        self.adapters = Some(config.canonical());
        Ok(self)
    }

    /// Stores the frozen base's linear weights (every projection and the
    /// output head; not the embeddings, norms or biases) in bf16, halving
    /// their memory; each product widens its weight to f32 (exactly) and
    /// computes in f32. The rounding to bf16 changes the model's outputs in
    /// their third significant digit. Refuses weights that can be trained:
    /// only a frozen base (after [`with_lora`](Self::with_lora) or
    /// [`no_grad`](burn::module::Module::no_grad)) is stored so.
    pub fn with_frozen_bf16_base(mut self) -> Result<Self> {
        fn store<B: Backend>(dense: &mut Dense<B>) -> Result<()> {
            let weight = dense.weight.val();
            if weight.is_require_grad() {
                return Err(ModelError::Input(
                    "bf16 base: the base weights can be trained; freeze them first (LoRA)".into(),
                ));
            }
            dense.weight = Param::initialized(dense.weight.id, weight.cast(FloatDType::BF16));
            Ok(())
        }
        for (_, _, dense) in projections_mut(&mut self) {
            store(dense)?;
        }
        if let Some(head) = &mut self.lm_head {
            store(head)?;
        }
        Ok(self)
    }

    /// The base model: the same weights (shared, not copied) without the adapters.
    pub fn without_adapters(&self) -> Self {
        let mut base = self.clone();
        for (_, _, dense) in projections_mut(&mut base) {
            dense.lora = None;
        }
        base.adapters = None;
        base
    }

    /// Folds every adapter into its base weight (`W + s · B A`) and removes
    /// the adapters: a plain model that computes the same function, for
    /// export as a HF checkpoint.
    pub fn merge_adapters(mut self) -> Self {
        for (_, _, dense) in projections_mut(&mut self) {
            if let Some(lora) = dense.lora.take() {
                let merged = dense.weight.val().cast(FloatDType::F32) + lora.delta();
                dense.weight = Param::initialized(dense.weight.id, merged);
            }
        }
        self.adapters = None;
        self
    }

    /// The adapters' tensors under PEFT's names, as host f32 values (name,
    /// shape, row-major values), in [`projections_mut`]'s order.
    pub fn adapter_tensors(&self) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let mut model = self.clone();
        let mut out = Vec::new();
        for (prefix, _, dense) in projections_mut(&mut model) {
            if let Some(lora) = &dense.lora {
                for (which, t) in [("lora_A", lora.lora_a.val()), ("lora_B", lora.lora_b.val())] {
                    out.push(host(peft_name(&prefix, which), t));
                }
            }
        }
        out
    }
}

/// The fields of PEFT's `adapter_config.json` that mappa reads; others are
/// ignored, and those that would change the computation are checked.
#[derive(Debug, Deserialize)]
struct PeftConfig {
    peft_type: String,
    r: usize,
    lora_alpha: f64,
    target_modules: TargetModules,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default = "no_bias")]
    bias: String,
    #[serde(default)]
    rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    lora_bias: bool,
    #[serde(default)]
    layer_replication: Option<serde_json::Value>,
    #[serde(default)]
    target_parameters: Option<serde_json::Value>,
    #[serde(default)]
    trainable_token_indices: Option<serde_json::Value>,
}

fn no_bias() -> String {
    "none".into()
}

/// `target_modules` is a list of names or, in PEFT, a regular expression.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

/// The first PEFT feature in `peft` that mappa does not implement: its
/// field and what it was set to.
fn unsupported(peft: &PeftConfig) -> Option<(&'static str, String)> {
    let unset = |v: &Option<serde_json::Value>| v.as_ref().is_none_or(|v| v.is_null());
    let checks = [
        (
            peft.peft_type == "LORA",
            "peft_type",
            format!("{:?}, not \"LORA\"", peft.peft_type),
        ),
        (!peft.fan_in_fan_out, "fan_in_fan_out", "true".into()),
        (!peft.use_dora, "use_dora", "true (DoRA)".into()),
        (
            peft.bias == "none",
            "bias",
            format!("{:?}, not \"none\"", peft.bias),
        ),
        (
            peft.rank_pattern.is_empty(),
            "rank_pattern",
            "per-module ranks".into(),
        ),
        (
            peft.alpha_pattern.is_empty(),
            "alpha_pattern",
            "per-module alphas".into(),
        ),
        (
            unset(&peft.layers_to_transform),
            "layers_to_transform",
            "a layer subset".into(),
        ),
        (
            peft.modules_to_save.as_ref().is_none_or(|m| m.is_empty()),
            "modules_to_save",
            "a list of fully trained modules".into(),
        ),
        (
            !peft.lora_bias,
            "lora_bias",
            "true (a bias on lora_B)".into(),
        ),
        (
            unset(&peft.layer_replication),
            "layer_replication",
            "set".into(),
        ),
        (
            unset(&peft.target_parameters),
            "target_parameters",
            "set".into(),
        ),
        (
            unset(&peft.trainable_token_indices),
            "trainable_token_indices",
            "set".into(),
        ),
    ];
    checks
        .into_iter()
        .find(|(ok, ..)| !ok)
        .map(|(_, field, found)| (field, found))
}

/// Reads `dir/adapter_config.json` and returns the adapter's settings; the
/// error names the field of a PEFT feature mappa does not implement.
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig> {
    let path = dir.join(CONFIG_FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| ModelError::io("cannot read", &path, e))?;
    let bad = |field: &str, message: String| ModelError::config(Some(&path), field, message);
    let peft: PeftConfig = serde_json::from_str(&text).map_err(|e| bad("(file)", e.to_string()))?;
    if let Some((field, found)) = unsupported(&peft) {
        return Err(bad(
            field,
            format!("is {found}: mappa reads plain LoRA adapters only"),
        ));
    }
    let targets = match peft.target_modules {
        TargetModules::List(list) => list,
        TargetModules::Pattern(p) => {
            return Err(bad(
                "target_modules",
                format!(
                "is a regular expression ({p:?}), which mappa does not read: list the projections"
            ),
            ))
        }
    };
    let config = LoraConfig {
        rank: peft.r,
        alpha: peft.lora_alpha,
        targets,
        rslora: peft.use_rslora,
    };
    config.validate().map_err(|e| {
        let (field, message) = e.split_once(": ").unwrap_or(("r", &e));
        // PEFT's names for mappa's fields.
        let field = match field {
            "rank" => "r",
            "alpha" => "lora_alpha",
            "targets" => "target_modules",
            other => other,
        };
        bad(field, message.to_string())
    })?;
    // PEFT stores a set: order the targets as mappa does.
    Ok(config.canonical())
}

/// Adds the adapters saved in `dir` (PEFT's layout) to `model`, whose base
/// weights are frozen. Every targeted projection must have both matrices at
/// the right shapes, and the file must hold nothing else.
pub fn load_adapters<B: Backend>(model: Transformer<B>, dir: &Path) -> Result<Transformer<B>> {
    let config = read_adapter_config(dir)?;
    if model.adapters.is_some() {
        return Err(ModelError::Input(
            "LoRA: the model already has adapters (merge or remove them first)".into(),
        ));
    }
    let path = dir.join(WEIGHTS_FILE);
    let set = SafetensorsSet::open_files(std::slice::from_ref(&path))?;
    let mut model = model.no_grad();
    let device = model.device();
    let scaling = config.scaling();
    let mut used = BTreeSet::new();
    for (prefix, name, dense) in projections_mut(&mut model) {
        if !config.adapts(name) {
            continue;
        }
        let [out, d_in] = dense.weight.dims();
        let mut read = |which: &str, shape: [usize; 2]| -> Result<Tensor<B, 2>> {
            let tensor = peft_name(&prefix, which);
            let values = set.read_f32(&tensor, &shape)?;
            used.insert(tensor);
            Ok(Tensor::from_data(TensorData::new(values, shape), &device))
        };
        let a = read("lora_A", [config.rank, d_in])?;
        let b = read("lora_B", [out, config.rank])?;
        dense.lora = Some(Lora::new(a, b, scaling));
    }
    if let Some(extra) = set.names().find(|n| !used.contains(*n)) {
        return Err(ModelError::weights(
            &path,
            format!(
                "unexpected tensor `{extra}`: adapter_config.json targets {} of a {}-layer model",
                config.targets.join(", "),
                model.config().num_layers
            ),
        ));
    }
    model.adapters = Some(config);
    Ok(model)
}

/// Writes the model's adapters to `dir` in PEFT's layout (each file
/// atomically), naming `base_model` as the base checkpoint. PEFT
/// (`PeftModel.from_pretrained`) and vLLM load the result.
pub fn save_adapters<B: Backend>(
    model: &Transformer<B>,
    dir: &Path,
    base_model: &str,
) -> Result<()> {
    let config = model
        .lora_config()
        .ok_or_else(|| ModelError::Input("the model has no LoRA adapters to save".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io("cannot create", dir, e))?;
    let bytes = tensors_to_safetensors_bytes(model.adapter_tensors(), StorageDtype::F32)?;
    mappa_core::fs::write_atomic(&dir.join(WEIGHTS_FILE), &bytes)?;
    let peft = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "target_modules": config.targets,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": config.rslora,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    let text = serde_json::to_string_pretty(&peft).expect("adapter config serialises");
    mappa_core::fs::write_atomic(&dir.join(CONFIG_FILE), text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Family, TransformerConfig};
    use crate::TestBackend;
    use burn::backend::Autodiff;

    fn tiny() -> Transformer<TestBackend> {
        TransformerConfig::for_family(Family::Qwen3, 40, 16, 24, 2, 4, 2, 8)
            .init(3, &Default::default())
    }

    fn logits(model: &Transformer<TestBackend>) -> Vec<f32> {
        let ids = Tensor::<TestBackend, 2, Int>::from_data(
            TensorData::new(vec![1i32, 5, 9, 2, 33, 7], [1, 6]),
            &Default::default(),
        );
        model.forward(ids).into_data().to_vec().unwrap()
    }

    /// An adapter with non-zero `B` on every projection.
    fn adapted(config: &LoraConfig) -> Transformer<TestBackend> {
        let mut model = tiny()
            .with_lora(config, &mut RngStream::from_u64(5))
            .unwrap();
        let mut rng = RngStream::from_u64(6);
        for (_, _, dense) in projections_mut(&mut model) {
            if let Some(lora) = dense.lora.as_mut() {
                let [out, r] = lora.lora_b.dims();
                let v: Vec<f32> = (0..out * r).map(|_| rng.normal() as f32 * 0.3).collect();
                lora.lora_b = Param::from_tensor(Tensor::from_data(
                    TensorData::new(v, [out, r]),
                    &Default::default(),
                ));
            }
        }
        model
    }

    #[test]
    fn fresh_adapters_compute_the_base_model_bit_for_bit() {
        let base = tiny();
        let fresh = base
            .clone()
            .with_lora(&LoraConfig::new(4, 8.0), &mut RngStream::from_u64(1))
            .unwrap();
        // B = 0: the adapter adds exact zeros.
        assert_eq!(logits(&base), logits(&fresh));
        assert_eq!(fresh.adapter_tensors().len(), 2 * 7 * 2);
    }

    #[test]
    fn without_adapters_is_the_base_and_merging_keeps_the_function() {
        let config = LoraConfig::new(2, 4.0);
        let model = adapted(&config);
        assert_eq!(logits(&model.without_adapters()), logits(&tiny()));
        let with = logits(&model);
        assert_ne!(
            with,
            logits(&tiny()),
            "the adapters must change the outputs"
        );
        let merged = model.merge_adapters();
        assert!(merged.lora_config().is_none());
        let diff = with
            .iter()
            .zip(logits(&merged))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-4, "merged logits differ by {diff}");
    }

    #[test]
    fn adapters_round_trip_through_peft_files_bit_for_bit() {
        let config = LoraConfig {
            targets: vec!["v_proj".into(), "q_proj".into(), "down_proj".into()],
            rslora: true,
            ..LoraConfig::new(3, 6.0)
        };
        let model = adapted(&config);
        let dir = tempfile::tempdir().unwrap();
        save_adapters(&model, dir.path(), "tiny").unwrap();
        let loaded = load_adapters(tiny(), dir.path()).unwrap();
        assert_eq!(loaded.lora_config(), Some(&config.canonical()));
        assert_eq!(loaded.lora_config(), model.lora_config());
        assert_eq!(logits(&loaded), logits(&model));
        assert_eq!(loaded.adapter_tensors(), model.adapter_tensors());
    }

    #[test]
    fn only_adapters_receive_gradients() {
        type Ad = Autodiff<TestBackend>;
        let device = Default::default();
        let model: Transformer<Ad> =
            TransformerConfig::for_family(Family::Qwen3, 40, 16, 24, 2, 4, 2, 8)
                .init::<Ad>(3, &device)
                .with_lora(&LoraConfig::new(2, 4.0), &mut RngStream::from_u64(1))
                .unwrap();
        let ids =
            Tensor::<Ad, 2, Int>::from_data(TensorData::new(vec![1i32, 5, 9, 2], [1, 4]), &device);
        let grads = model.forward(ids).sum().backward();
        let base_grad = model.layers[0].self_attn.q_proj.weight.grad(&grads);
        assert!(base_grad.is_none(), "a frozen base weight got a gradient");
        assert!(model.embed_tokens.weight.grad(&grads).is_none());
        // B = 0 at the start, so A's gradient is zero, but B's is not.
        let lora = model.layers[0].self_attn.q_proj.lora.as_ref().unwrap();
        let b_grad = lora.lora_b.grad(&grads).expect("lora_B has a gradient");
        assert!(b_grad.abs().sum().into_scalar() > 0.0);
    }

    /// A bf16 base computes what its bf16-rounded f32 weights compute, bit
    /// for bit (widening is exact), gradients included; it is close to the
    /// f32 base; trainable weights are refused.
    #[test]
    fn a_bf16_base_computes_with_its_rounded_weights() {
        type Ad = Autodiff<TestBackend>;
        let device = Default::default();
        let fresh = || {
            TransformerConfig::for_family(Family::Qwen3, 40, 16, 24, 2, 4, 2, 8)
                .with_tie_word_embeddings(false)
                .init::<Ad>(3, &device)
        };
        let err = fresh().with_frozen_bf16_base().unwrap_err().to_string();
        assert!(err.contains("freeze them first"), "{err}");
        let lora = LoraConfig::new(2, 4.0);
        let f32_model = fresh()
            .with_lora(&lora, &mut RngStream::from_u64(1))
            .unwrap();
        let bf16 = f32_model.clone().with_frozen_bf16_base().unwrap();
        assert_eq!(
            bf16.layers[0].mlp.up_proj.weight.val().dtype(),
            burn::tensor::DType::BF16
        );
        // The same model with the rounded weights kept in f32.
        let mut rounded = f32_model.clone();
        let round = |dense: &mut Dense<Ad>| {
            let w = dense
                .weight
                .val()
                .cast(FloatDType::BF16)
                .cast(FloatDType::F32);
            dense.weight = Param::initialized(dense.weight.id, w);
        };
        for (_, _, dense) in projections_mut(&mut rounded) {
            round(dense);
        }
        if let Some(head) = &mut rounded.lm_head {
            round(head);
        }
        let ids =
            Tensor::<Ad, 2, Int>::from_data(TensorData::new(vec![1i32, 5, 9, 2], [1, 4]), &device);
        let run = |m: &Transformer<Ad>| {
            let out = m.forward(ids.clone());
            let values: Vec<f32> = out.clone().into_data().to_vec().unwrap();
            let grads = out.sum().backward();
            let lora = m.layers[1].mlp.down_proj.lora.as_ref().unwrap();
            let g: Vec<f32> = lora
                .lora_b
                .grad(&grads)
                .unwrap()
                .into_data()
                .to_vec()
                .unwrap();
            (values, g)
        };
        let (a, ga) = run(&bf16);
        let (b, gb) = run(&rounded);
        assert_eq!(a, b);
        assert_eq!(ga, gb);
        let (c, _) = run(&f32_model);
        let worst = a
            .iter()
            .zip(&c)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst > 0.0 && worst < 0.05, "{worst}");
    }

    #[test]
    fn unsupported_peft_settings_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let model = adapted(&LoraConfig::new(2, 4.0));
        save_adapters(&model, dir.path(), "tiny").unwrap();
        let path = dir.path().join(CONFIG_FILE);
        let original = std::fs::read_to_string(&path).unwrap();
        for (field, value, expected) in [
            ("use_dora", "true", "use_dora"),
            ("fan_in_fan_out", "true", "fan_in_fan_out"),
            ("target_modules", "\"q_proj|v_proj\"", "regular expression"),
            ("rank_pattern", "{\"q_proj\": 8}", "rank_pattern"),
            ("r", "0", "field `r` expected at least 1"),
        ] {
            let mut json: serde_json::Value = serde_json::from_str(&original).unwrap();
            json[field] = serde_json::from_str(value).unwrap();
            std::fs::write(&path, json.to_string()).unwrap();
            let err = load_adapters(tiny(), dir.path()).unwrap_err().to_string();
            assert!(err.contains(expected), "{field}: {err}");
            assert!(err.contains(CONFIG_FILE), "{field}: {err}");
        }
    }

    #[test]
    fn a_rank_mismatch_names_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        save_adapters(&adapted(&LoraConfig::new(2, 4.0)), dir.path(), "tiny").unwrap();
        let path = dir.path().join(CONFIG_FILE);
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json["r"] = 3.into();
        std::fs::write(&path, json.to_string()).unwrap();
        let err = load_adapters(tiny(), dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
            "{err}"
        );
    }
}
