//! Tokenizers: the [`Tokenizer`] trait the generator and the agents use, and
//! [`HfTokenizer`], which reads a HF checkpoint's `tokenizer.json` (with the
//! `tokenizers` crate, pure Rust) and its `tokenizer_config.json`
//! (special tokens, chat template).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{ModelError, Result};

/// Turns text into token ids and back.
pub trait Tokenizer: Send + Sync {
    /// Encodes `text` without adding BOS/EOS; special-token strings inside
    /// the text (`<|im_start|>`, ...) become their single ids.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Decodes `ids`; with `skip_special`, special tokens are left out.
    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String>;
    /// Number of ids the tokenizer can produce (added tokens included).
    fn vocab_size(&self) -> usize;
    /// Ids that end a generation.
    fn eos_token_ids(&self) -> &[u32];
    /// The padding id, when the tokenizer names one.
    fn pad_token_id(&self) -> Option<u32>;
    /// The id of a token string, if it is one token.
    fn token_id(&self, token: &str) -> Option<u32>;
}

/// A HF tokenizer with the special tokens named by its config files.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    eos_token_ids: Vec<u32>,
    pad_token_id: Option<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<String>,
    path: PathBuf,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

/// Special token `field` as `tokenizer_config.json` (at `path`) writes it:
/// a string, or an object with a string `content`; absent or null is none.
fn token_string(config: &Value, field: &str, path: &Path) -> Result<Option<String>> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) if o.get("content").is_some_and(Value::is_string) => {
            Ok(o.get("content").and_then(Value::as_str).map(str::to_string))
        }
        Some(other) => Err(ModelError::tokenizer(
            Some(path),
            format!("field `{field}` is {other}, expected a string or an object with a string `content`"),
        )),
    }
}

/// The `eos_token_id` of `generation_config.json` or `config.json` (at
/// `path`): one token id or a list of them.
fn eos_ids(file: &Value, path: &Path) -> Result<Vec<u32>> {
    let ids = match file.get("eos_token_id") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(ids)) => ids.as_slice(),
        Some(one) => std::slice::from_ref(one),
    };
    ids.iter()
        .map(|id| {
            id.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ModelError::tokenizer(
                        Some(path),
                        format!(
                            "field `eos_token_id` has {id}, expected token ids (integers from 0 to {})",
                            u32::MAX
                        ),
                    )
                })
        })
        .collect()
}

/// Reads `tokenizer.json` with the `tokenizers` crate. That crate panics on
/// some malformed files (a BPE `continuing_subword_prefix` longer than a
/// merge's second token underflows a length); such a panic becomes an error
/// naming the file.
fn read_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer> {
    match std::panic::catch_unwind(|| tokenizers::Tokenizer::from_file(path)) {
        Ok(Ok(tokenizer)) => Ok(tokenizer),
        Ok(Err(e)) => Err(ModelError::tokenizer(Some(path), e.to_string())),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(ModelError::tokenizer(
                Some(path),
                format!("is malformed: the tokenizers library failed reading it ({what})"),
            ))
        }
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io("cannot read", path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::tokenizer(Some(path), format!("is not valid JSON: {e}")))
}

impl HfTokenizer {
    /// Loads `tokenizer.json` from `dir`, with `tokenizer_config.json` and,
    /// when present, `generation_config.json` and `config.json` for the EOS ids.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let inner = read_tokenizer(&path)?;
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?.unwrap_or(Value::Null);
        if !(config.is_object() || config.is_null()) {
            return Err(ModelError::tokenizer(
                Some(&config_path),
                "is not a JSON object",
            ));
        }
        let bos_token = token_string(&config, "bos_token", &config_path)?;
        let eos_token = token_string(&config, "eos_token", &config_path)?;
        let pad_token = token_string(&config, "pad_token", &config_path)?;
        let chat_template = match config.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            // Some checkpoints list named templates; use the default one.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            Some(other) => {
                return Err(ModelError::tokenizer(
                    Some(&config_path),
                    format!("field `chat_template` is {other}, expected a string"),
                ))
            }
        };
        let mut tok = Self {
            inner,
            eos_token_ids: Vec::new(),
            pad_token_id: None,
            bos_token,
            eos_token: eos_token.clone(),
            chat_template,
            path,
        };
        let lookup = |name: &str, field: &str| -> Result<u32> {
            tok.inner.token_to_id(name).ok_or_else(|| {
                ModelError::tokenizer(
                    Some(&config_path),
                    format!(
                        "field `{field}` names `{name}`, which is not a token of tokenizer.json"
                    ),
                )
            })
        };
        let mut eos = Vec::new();
        if let Some(name) = &eos_token {
            eos.push(lookup(name, "eos_token")?);
        }
        let pad = pad_token
            .as_deref()
            .map(|p| lookup(p, "pad_token"))
            .transpose()?;
        // generation_config.json often lists extra stop ids (Qwen3: <|im_end|> and <|endoftext|>).
        for file in ["generation_config.json", "config.json"] {
            let path = dir.join(file);
            if let Some(v) = read_json(&path)? {
                eos.extend(eos_ids(&v, &path)?);
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        eos.retain(|id| seen.insert(*id));
        tok.eos_token_ids = eos;
        tok.pad_token_id = pad;
        Ok(tok)
    }

    /// The chat template of `tokenizer_config.json`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The BOS token string, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token string, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The file this tokenizer was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> ModelError {
        ModelError::tokenizer(Some(&self.path), e.to_string())
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| self.err(e))
    }

    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| self.err(e))
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    fn pad_token_id(&self) -> Option<u32> {
        self.pad_token_id
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
