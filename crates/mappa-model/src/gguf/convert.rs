//! A Llama-architecture GGUF model to a HF checkpoint directory that both
//! this crate and HF transformers load: `config.json`, `model.safetensors`
//! (f32, f16 or bf16), `tokenizer.json`, `tokenizer_config.json` (special
//! tokens and the chat template) and `generation_config.json`.
//!
//! - **Weights** are dequantised ([`super::quant`]) and renamed to HF's
//!   names; the query and key projections get llama.cpp's row permutation
//!   undone (its converter interleaves the two rotary halves of every head:
//!   `hf[h*D + i*D/2 + j] = gguf[h*D + 2*j + i]`).
//! - **The tokenizer** (`tokenizer.ggml.model = "gpt2"`, byte-level BPE) is
//!   rebuilt from the GGUF's tokens, merges and token types; the
//!   pre-tokenizer is chosen by `tokenizer.ggml.pre` after llama.cpp's
//!   `llama-vocab.cpp` (an unknown name is refused rather than guessed:
//!   the wrong split would change every encoding).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{GgufFile, MetaValue};
use crate::config::{Family, RopeConfig, TransformerConfig};
use crate::error::{ModelError, Result};
use crate::weights::{tensors_to_safetensors_bytes, StorageDtype};

/// What a conversion produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversion {
    /// The model's config, as written to `config.json`.
    pub config: TransformerConfig,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    /// How many tensors of each stored type were dequantised.
    pub stored_types: BTreeMap<&'static str, usize>,
    /// Tokens in `tokenizer.json`.
    pub vocab_size: usize,
    /// Whether a chat template was carried over.
    pub chat_template: bool,
}

/// Converts `gguf` into a HF checkpoint in `out`, storing weights as `dtype`.
///
/// `out` must not exist or be empty; the files are written into a sibling
/// directory that is renamed to `out` at the end, so a failed conversion
/// leaves nothing half-written.
pub fn convert(gguf: &GgufFile, out: &Path, dtype: StorageDtype) -> Result<Conversion> {
    let arch = gguf.get_str("general.architecture")?;
    if arch != "llama" {
        return Err(gguf.error(format!(
            "architecture `{arch}` is not supported (mappa converts `llama`, which covers SmolLM2, Llama 2/3 and Mistral-style models)"
        )));
    }
    let config = llama_config(gguf)?;
    config.validate()?;
    let tokenizer = tokenizer_json(gguf)?;
    let tokenizer_config = tokenizer_config_json(gguf, &config)?;
    let (tensors, stored_types) = hf_tensors(gguf, &config)?;

    if out.exists()
        && std::fs::read_dir(out)
            .map_err(|e| ModelError::io("cannot read", out, e))?
            .next()
            .is_some()
    {
        return Err(ModelError::Input(format!(
            "`{}` exists and is not empty: convert into a new directory (nothing was overwritten)",
            out.display()
        )));
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| ModelError::io("cannot create", &parent, e))?;
    let staging = parent.join(format!(
        ".{}.partial-{}",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("model"),
        std::process::id()
    ));
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        std::fs::write(staging.join(name), bytes)
            .map_err(|e| ModelError::io("cannot write", staging.join(name), e))
    };
    let result = (|| {
        std::fs::create_dir_all(&staging)
            .map_err(|e| ModelError::io("cannot create", &staging, e))?;
        let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON serialises");
        write(
            "config.json",
            pretty(&config.to_hf_json(dtype.torch_name())).as_bytes(),
        )?;
        write(
            "model.safetensors",
            &tensors_to_safetensors_bytes(tensors, dtype)?,
        )?;
        write("tokenizer.json", pretty(&tokenizer).as_bytes())?;
        write(
            "tokenizer_config.json",
            pretty(&tokenizer_config).as_bytes(),
        )?;
        let mut generation = json!({"eos_token_id": config.eos_token_ids});
        if let Some(bos) = config.bos_token_id {
            generation["bos_token_id"] = bos.into();
        }
        write("generation_config.json", pretty(&generation).as_bytes())?;
        if out.exists() {
            std::fs::remove_dir(out).map_err(|e| ModelError::io("cannot replace", out, e))?;
        }
        std::fs::rename(&staging, out).map_err(|e| ModelError::io("cannot rename into", out, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result?;
    Ok(Conversion {
        name: gguf.get_str("general.name").ok().map(str::to_string),
        vocab_size: tokenizer["model"]["vocab"]
            .as_object()
            .map_or(0, |v| v.len()),
        chat_template: tokenizer_config.get("chat_template").is_some(),
        config,
        stored_types,
    })
}

/// The model's config from the `llama.*` metadata and the tokenizer's special ids.
fn llama_config(gguf: &GgufFile) -> Result<TransformerConfig> {
    let key = |k: &str| format!("llama.{k}");
    let need = |k: &str| -> Result<usize> {
        let v = gguf.get_uint(&key(k))?;
        usize::try_from(v)
            .map_err(|_| gguf.error(format!("metadata `llama.{k}` = {v} is too large")))
    };
    if let Ok(kind) = gguf.get_str(&key("rope.scaling.type")) {
        if kind != "none" {
            return Err(gguf.error(format!(
                "metadata `llama.rope.scaling.type` is `{kind}`: RoPE scaling from GGUF is not supported"
            )));
        }
    }
    if gguf.tensor("rope_freqs.weight").is_some() {
        return Err(gguf.error(
            "tensor `rope_freqs.weight` (Llama 3.1 RoPE frequency scaling) is not supported",
        ));
    }
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = gguf.get_usize_or(&key("attention.head_count_kv"), heads)?;
    if heads == 0 || hidden % heads != 0 {
        return Err(gguf.error(format!(
            "`llama.embedding_length` {hidden} is not a multiple of `llama.attention.head_count` {heads}"
        )));
    }
    let head_dim = gguf.get_usize_or(&key("attention.key_length"), hidden / heads)?;
    let rope_dims = gguf.get_usize_or(&key("rope.dimension_count"), head_dim)?;
    if rope_dims != head_dim {
        return Err(gguf.error(format!(
            "metadata `llama.rope.dimension_count` is {rope_dims} but heads are {head_dim} wide: partial rotary embeddings are not supported"
        )));
    }
    let tokens = gguf.get_array("tokenizer.ggml.tokens")?.len();
    let vocab = gguf.get_usize_or(&key("vocab_size"), tokens)?;
    let theta = match gguf.metadata().get(&key("rope.freq_base")) {
        None => 10_000.0,
        Some(_) => f32_decimal(gguf.get_float(&key("rope.freq_base"))?),
    };
    let eps = f32_decimal(gguf.get_float(&key("attention.layer_norm_rms_epsilon"))?);
    let special = |k: &str| special_id(gguf, k, tokens);
    let rope = RopeConfig {
        theta,
        llama3_scaling: None,
    };
    let mut config = TransformerConfig::new(
        Family::Llama,
        vocab,
        hidden,
        need("feed_forward_length")?,
        need("block_count")?,
        heads,
        kv_heads,
        head_dim,
        rope,
    )
    .with_rms_norm_eps(eps)
    .with_tie_word_embeddings(gguf.tensor("output.weight").is_none())
    .with_max_position_embeddings(gguf.get_usize_or(&key("context_length"), 4096)?)
    .with_bos_token_id(special("bos_token_id")?);
    if let Some(eos) = special("eos_token_id")? {
        config = config.with_eos_token_ids(vec![eos]);
    }
    Ok(config)
}

/// The special token id `tokenizer.ggml.{key}`, checked to be one of the
/// `tokens` tokens; `None` when the file does not name one.
fn special_id(gguf: &GgufFile, key: &str, tokens: usize) -> Result<Option<u32>> {
    let full = format!("tokenizer.ggml.{key}");
    if !gguf.metadata().contains_key(&full) {
        return Ok(None);
    }
    let id = gguf.get_uint(&full)?;
    match u32::try_from(id) {
        Ok(id) if (id as usize) < tokens => Ok(Some(id)),
        _ => Err(gguf.error(format!(
            "metadata `{full}` is {id}, not one of the {tokens} tokens"
        ))),
    }
}

/// The shortest decimal of an f32 metadata value, as f64 (`9.9999997e-6`
/// becomes `1e-5`, the value the model was configured with).
fn f32_decimal(v: f64) -> f64 {
    (v as f32)
        .to_string()
        .parse()
        .expect("a float's decimal parses")
}

/// The HF name of GGUF tensor `name`, and whether its rows need unpermuting
/// with the query (`Some(false)`) or key (`Some(true)`) head count.
fn hf_name(name: &str) -> Option<(String, Option<bool>)> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some((top.to_string(), None));
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (hf, permute) = match part {
        "attn_norm.weight" => ("input_layernorm.weight", None),
        "attn_q.weight" => ("self_attn.q_proj.weight", Some(false)),
        "attn_k.weight" => ("self_attn.k_proj.weight", Some(true)),
        "attn_v.weight" => ("self_attn.v_proj.weight", None),
        "attn_output.weight" => ("self_attn.o_proj.weight", None),
        "ffn_norm.weight" => ("post_attention_layernorm.weight", None),
        "ffn_gate.weight" => ("mlp.gate_proj.weight", None),
        "ffn_up.weight" => ("mlp.up_proj.weight", None),
        "ffn_down.weight" => ("mlp.down_proj.weight", None),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf}"), permute))
}

/// Undoes llama.cpp's query/key row permutation: within each of `heads`
/// heads of `rows_per_head` rows, GGUF row `2j + i` is HF row `i*half + j`.
fn unpermute_rows(values: &[f32], heads: usize, rows_per_head: usize, cols: usize) -> Vec<f32> {
    let half = rows_per_head / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..half {
                let hf = (h * rows_per_head + i * half + j) * cols;
                let gg = (h * rows_per_head + 2 * j + i) * cols;
                out[hf..hf + cols].copy_from_slice(&values[gg..gg + cols]);
            }
        }
    }
    out
}

type HfTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Every tensor of the file, dequantised, renamed, unpermuted and checked
/// against the shapes `config` implies.
fn hf_tensors(
    gguf: &GgufFile,
    config: &TransformerConfig,
) -> Result<(HfTensors, BTreeMap<&'static str, usize>)> {
    let mut expected = BTreeMap::new();
    let (h, d) = (config.hidden_size, config.head_dim);
    let (q, kv, ff) = (
        config.num_heads * d,
        config.num_kv_heads * d,
        config.intermediate_size,
    );
    expected.insert(
        "model.embed_tokens.weight".to_string(),
        vec![config.vocab_size, h],
    );
    expected.insert("model.norm.weight".to_string(), vec![h]);
    if !config.tie_word_embeddings {
        expected.insert("lm_head.weight".to_string(), vec![config.vocab_size, h]);
    }
    for i in 0..config.num_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![ff, h]),
            ("mlp.up_proj.weight", vec![ff, h]),
            ("mlp.down_proj.weight", vec![h, ff]),
        ] {
            expected.insert(p(name), shape);
        }
    }
    let mut out = Vec::with_capacity(gguf.tensors().len());
    let mut types: BTreeMap<&'static str, usize> = BTreeMap::new();
    for info in gguf.tensors() {
        let (name, permute) = hf_name(&info.name).ok_or_else(|| {
            gguf.error(format!(
                "tensor `{}` is not part of a Llama model mappa knows how to convert",
                info.name
            ))
        })?;
        let shape = info.shape();
        match expected.remove(&name) {
            Some(want) if want == shape => {}
            Some(want) => {
                return Err(gguf.error(format!(
                    "tensor `{}` ({name}) has shape {shape:?}, but the metadata implies {want:?}",
                    info.name
                )))
            }
            None => {
                return Err(gguf.error(format!(
                    "tensor `{}` ({name}) is unexpected for a {}-layer model, or appears twice",
                    info.name, config.num_layers
                )))
            }
        }
        *types.entry(info.ggml_type.name()).or_default() += 1;
        let mut values = gguf.dequantize(info);
        if let Some(is_key) = permute {
            let heads = if is_key {
                config.num_kv_heads
            } else {
                config.num_heads
            };
            values = unpermute_rows(&values, heads, d, h);
        }
        out.push((name, shape, values));
    }
    if let Some(missing) = expected.keys().next() {
        return Err(gguf.error(format!(
            "tensor for `{missing}` is missing ({} HF tensors in all have no GGUF tensor)",
            expected.len()
        )));
    }
    Ok((out, types))
}

/// The HF pre-tokenizer for llama.cpp pre-tokenizer `pre`.
fn pre_tokenizer(pre: &str) -> Option<Value> {
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
    });
    match pre {
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT2.
        "gpt-2" => Some(byte_level),
        // LLAMA_VOCAB_PRE_TYPE_STARCODER and the names llama.cpp maps to it:
        // every digit alone, then GPT-2's split.
        "smollm" | "starcoder" | "refact" | "codeshell" => Some(json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level,
            ]
        })),
        _ => None,
    }
}

/// Each token's type (1 normal, 3 control, 4 user-defined): from
/// `tokenizer.ggml.token_type`, or all normal when absent.
fn token_types(gguf: &GgufFile, tokens: usize) -> Result<Vec<i64>> {
    let types: Vec<i64> = match gguf.metadata().get("tokenizer.ggml.token_type") {
        None => vec![1; tokens],
        Some(_) => gguf
            .get_array("tokenizer.ggml.token_type")?
            .iter()
            .map(|v| match v {
                MetaValue::Int(i) => Ok(*i),
                MetaValue::Uint(u) => Ok(*u as i64),
                _ => Err(gguf.error("metadata `tokenizer.ggml.token_type` should hold integers")),
            })
            .collect::<Result<_>>()?,
    };
    if types.len() != tokens {
        return Err(gguf.error(format!(
            "metadata `tokenizer.ggml.token_type` has {} entries for {} tokens",
            types.len(),
            tokens
        )));
    }
    Ok(types)
}

/// The BPE vocabulary (token to id, each once) and the added tokens
/// (control tokens, special; user-defined ones, not).
fn vocab_and_added(
    gguf: &GgufFile,
    tokens: &[&str],
    types: &[i64],
) -> Result<(serde_json::Map<String, Value>, Vec<Value>)> {
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (token, kind)) in tokens.iter().zip(types).enumerate() {
        if vocab.insert(token.to_string(), id.into()).is_some() {
            return Err(gguf.error(format!(
                "metadata `tokenizer.ggml.tokens` lists `{token}` twice (again at {id})"
            )));
        }
        // 3 = control (special), 4 = user-defined (added, not special).
        if *kind == 3 || *kind == 4 {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *kind == 3,
            }));
        }
    }
    Ok((vocab, added))
}

/// The post-processor: a BOS token before each sequence when the GGUF
/// says to add one, else byte-level.
fn post_processor(gguf: &GgufFile, tokens: &[&str]) -> Result<Value> {
    let processor = if gguf.get_bool_or("tokenizer.ggml.add_bos_token", false)? {
        let bos_id = special_id(gguf, "bos_token_id", tokens.len())?.ok_or_else(|| {
            gguf.error("metadata `tokenizer.ggml.add_bos_token` is set but `tokenizer.ggml.bos_token_id` is missing")
        })?;
        let bos = tokens[bos_id as usize];
        let mut special = serde_json::Map::new();
        special.insert(
            bos.to_string(),
            json!({"id": bos, "ids": [bos_id], "tokens": [bos]}),
        );
        json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": special
        })
    } else {
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
    };
    Ok(processor)
}

/// `tokenizer.json` for a byte-level BPE (`gpt2`) GGUF tokenizer.
fn tokenizer_json(gguf: &GgufFile) -> Result<Value> {
    let model = gguf.get_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(gguf.error(format!(
            "metadata `tokenizer.ggml.model` is `{model}`: only byte-level BPE (`gpt2`) tokenizers are converted"
        )));
    }
    let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("gpt-2");
    let pre_tokenizer = pre_tokenizer(pre).ok_or_else(|| {
        gguf.error(format!(
            "metadata `tokenizer.ggml.pre` is `{pre}`, a pre-tokenizer mappa does not know (it knows gpt-2, smollm, starcoder, refact, codeshell); guessing would change every encoding"
        ))
    })?;
    let tokens = gguf.get_strings("tokenizer.ggml.tokens")?;
    let types = token_types(gguf, tokens.len())?;
    let merges = gguf.get_strings("tokenizer.ggml.merges")?;
    let (vocab, added) = vocab_and_added(gguf, &tokens, &types)?;
    let post_processor = post_processor(gguf, &tokens)?;
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        }
    }))
}

/// `tokenizer_config.json`: special-token strings and the chat template.
fn tokenizer_config_json(gguf: &GgufFile, config: &TransformerConfig) -> Result<Value> {
    let tokens = gguf.get_strings("tokenizer.ggml.tokens")?;
    let mut out = json!({
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": gguf.get_bool_or("tokenizer.ggml.add_bos_token", false)?,
        "add_eos_token": gguf.get_bool_or("tokenizer.ggml.add_eos_token", false)?,
        "clean_up_tokenization_spaces": false,
        "model_max_length": config.max_position_embeddings,
    });
    for (field, key) in [
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
        ("unk_token", "unknown_token_id"),
    ] {
        if let Some(id) = special_id(gguf, key, tokens.len())? {
            out[field] = tokens[id as usize].into();
        }
    }
    if gguf.metadata().contains_key("tokenizer.chat_template") {
        out["chat_template"] = gguf.get_str("tokenizer.chat_template")?.into();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: w.reshape(heads, 2, D/2, cols).swapaxes(1, 2): HF row h*D + i*D/2 + j
        // goes to GGUF row h*D + 2j + i.
        let (heads, d, cols) = (3, 8, 2);
        let hf: Vec<f32> = (0..heads * d * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..heads {
            for i in 0..2 {
                for j in 0..d / 2 {
                    let from = (h * d + i * d / 2 + j) * cols;
                    let to = (h * d + 2 * j + i) * cols;
                    gguf[to..to + cols].copy_from_slice(&hf[from..from + cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, heads, d, cols), hf);
    }

    #[test]
    fn names_map_to_hf_and_unknown_ones_do_not() {
        assert_eq!(
            hf_name("blk.12.attn_k.weight"),
            Some(("model.layers.12.self_attn.k_proj.weight".into(), Some(true)))
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap().0,
            "model.embed_tokens.weight"
        );
        assert_eq!(hf_name("blk.x.attn_k.weight"), None);
        assert_eq!(hf_name("blk.0.attn_q.bias"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn metadata_floats_keep_their_f32_decimal() {
        assert_eq!(f32_decimal(f64::from(1e-5f32)), 1e-5);
        assert_eq!(f32_decimal(100_000.0), 100_000.0);
    }

    #[test]
    fn unknown_pre_tokenizers_are_refused() {
        assert!(pre_tokenizer("smollm").is_some());
        assert!(pre_tokenizer("qwen2").is_none());
    }
}
