//! `COACH.toml`: which coach, its rubric, cache and settings. API keys are
//! named (`api_key_env`), never written here.
//!
//! ```toml
//! domain = "mathchat"            # or "dsbench"
//! rubric_dir = "my-rubrics"      # optional; default: the shipped rubrics
//! cache = "runs/coach-cache.sqlite"
//! cache_mode = "read-write"      # "off", "read-write" or "replay"
//!
//! [settings]                     # optional; these are the defaults
//! coach_sees_ground_truth = true
//! fallback_score = 5.0
//! temperature = 0.0
//! max_tokens = 1024
//! max_concurrency = 8
//!
//! [openai]                       # exactly one of [openai], [local], [scripted]
//! base_url = "https://generativelanguage.googleapis.com/v1beta/openai"
//! model = "gemini-2.5-flash"
//! api_key_env = "GEMINI_API_KEY"
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::{CacheMode, CoachCache};
use crate::llm::{LlmCoach, LlmSettings};
use crate::openai::{OpenAiBackend, OpenAiConfig};
use crate::rubric::RubricSet;
use crate::scripted::{ScriptedCoach, ScriptedConfig};
use crate::{Coach, CoachError};

/// A local mappa-model checkpoint as judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalConfig {
    /// The checkpoint directory (config.json, safetensors, tokenizer files).
    pub checkpoint: PathBuf,
    /// Seed of the sampling streams (unused at temperature 0).
    #[serde(default)]
    pub seed: u64,
}

/// The whole coach configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoachConfig {
    /// Which rubric set judges the actions: a shipped domain (`mathchat`,
    /// `dsbench`; the workflow's `coach_domain`), or the name of
    /// `rubric_dir`'s set.
    pub domain: String,
    /// Directory of rubric templates (default: the shipped ones).
    #[serde(default)]
    pub rubric_dir: Option<PathBuf>,
    /// The cache file (needed unless `cache_mode = "off"`).
    #[serde(default)]
    pub cache: Option<PathBuf>,
    /// How the cache is used.
    #[serde(default)]
    pub cache_mode: CacheMode,
    /// Protocol settings of LLM coaches.
    #[serde(default)]
    pub settings: LlmSettings,
    /// An OpenAI-compatible endpoint.
    #[serde(default)]
    pub openai: Option<OpenAiConfig>,
    /// A local checkpoint.
    #[serde(default)]
    pub local: Option<LocalConfig>,
    /// A scripted coach (generated tasks only).
    #[serde(default)]
    pub scripted: Option<ScriptedConfig>,
}

impl CoachConfig {
    /// Read a `COACH.toml`; relative paths in it are taken from its directory.
    pub fn load(path: &Path) -> Result<Self, CoachError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CoachError::Config(format!("{}: {e}", path.display())))?;
        let mut config: Self = toml::from_str(&text)
            .map_err(|e| CoachError::Config(format!("{}: {e}", path.display())))?;
        config.rebase(path.parent().unwrap_or(Path::new(".")));
        Ok(config)
    }

    /// Make relative paths (rubrics, cache, local checkpoint) relative to `base`.
    pub fn rebase(&mut self, base: &Path) {
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        self.rubric_dir.as_mut().map(rebase);
        self.cache.as_mut().map(rebase);
        if let Some(local) = self.local.as_mut() {
            rebase(&mut local.checkpoint);
        }
    }

    /// Build the coach this configuration describes.
    pub fn build(&self) -> Result<Box<dyn Coach>, CoachError> {
        let kinds = [
            self.openai.is_some(),
            self.local.is_some(),
            self.scripted.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(CoachError::Config(
                "expected exactly one of the sections [openai], [local], [scripted]".into(),
            ));
        }
        if let Some(scripted) = &self.scripted {
            return Ok(Box::new(ScriptedCoach::new(scripted.clone())?));
        }
        let rubrics = match &self.rubric_dir {
            Some(dir) => RubricSet::from_dir(dir)?,
            None => RubricSet::builtin(&self.domain)?,
        };
        let cache = match (self.cache_mode, &self.cache) {
            (CacheMode::Off, _) => None,
            (mode, Some(path)) => Some(CoachCache::open(path, mode)?),
            (mode, None) => {
                return Err(CoachError::Config(format!(
                    "cache_mode = {mode:?} needs `cache = \"path/to/cache.sqlite\"`"
                )))
            }
        };
        if let Some(openai) = &self.openai {
            let backend = OpenAiBackend::new(openai.clone())?;
            let name = format!("openai:{}", openai.model);
            return Ok(Box::new(LlmCoach::new(
                name,
                backend,
                rubrics,
                self.settings.clone(),
                cache,
            )?));
        }
        let local = self.local.as_ref().expect("checked above");
        build_local(local, rubrics, self.settings.clone(), cache)
    }
}

#[cfg(feature = "local-model")]
fn build_local(
    local: &LocalConfig,
    rubrics: RubricSet,
    settings: LlmSettings,
    cache: Option<CoachCache>,
) -> Result<Box<dyn Coach>, CoachError> {
    let backend = crate::local::LocalBackend::<mappa_model::backend::Cpu>::load(
        &local.checkpoint,
        &Default::default(),
        local.seed,
    )?;
    let name = format!("local:{}", local.checkpoint.display());
    Ok(Box::new(LlmCoach::new(
        name, backend, rubrics, settings, cache,
    )?))
}

#[cfg(not(feature = "local-model"))]
fn build_local(
    _local: &LocalConfig,
    _rubrics: RubricSet,
    _settings: LlmSettings,
    _cache: Option<CoachCache>,
) -> Result<Box<dyn Coach>, CoachError> {
    Err(CoachError::Config(
        "[local] needs mappa-judge built with the `local-model` feature".into(),
    ))
}
