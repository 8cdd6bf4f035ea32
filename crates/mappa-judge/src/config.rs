//! A coach configuration (a `COACH.toml` file, or a manifest's `[coach]`;
//! its schema for users: docs/coach.md): which coach, its rubric, cache and
//! settings. API keys are named (`api_key_env`), never written here.
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
//! [openai]                       # exactly one of [openai], [local], [scripted]: `Judge`
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
    /// Text every reply is made to begin with (an assistant prefill), for
    /// judges too small to end a free reply with the score line: e.g.
    /// `"PROCESS_SCORE:"`. Empty (the default): free replies.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reply_prefix: String,
}

/// Which coach judges: one kind, with its settings (in TOML, one of the
/// tables `[openai]`, `[local]`, `[scripted]`).
#[derive(Debug, Clone, PartialEq)]
pub enum Judge {
    /// An OpenAI-compatible endpoint (an LLM coach).
    OpenAi(OpenAiConfig),
    /// A local mappa-model checkpoint (an LLM coach).
    Local(LocalConfig),
    /// A scripted coach for generated tasks: simulated, it reads the known
    /// solution.
    Scripted(ScriptedConfig),
}

/// The whole coach configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "CoachTables", into = "CoachTables")]
pub struct CoachConfig {
    /// Which rubric set judges the actions: a shipped domain (`mathchat`,
    /// `dsbench`; the workflow's `coach_domain`), or the name of
    /// `rubric_dir`'s set.
    pub domain: String,
    /// Directory of rubric templates (default: the shipped ones).
    pub rubric_dir: Option<PathBuf>,
    /// The cache file (needed unless `cache_mode = "off"`).
    pub cache: Option<PathBuf>,
    /// How the cache is used.
    pub cache_mode: CacheMode,
    /// Protocol settings of LLM coaches.
    pub settings: LlmSettings,
    /// The coach.
    pub judge: Judge,
}

/// [`CoachConfig`] as written: a table per coach kind, exactly one present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CoachTables {
    domain: String,
    #[serde(default)]
    rubric_dir: Option<PathBuf>,
    #[serde(default)]
    cache: Option<PathBuf>,
    #[serde(default)]
    cache_mode: CacheMode,
    #[serde(default)]
    settings: LlmSettings,
    #[serde(default)]
    openai: Option<OpenAiConfig>,
    #[serde(default)]
    local: Option<LocalConfig>,
    #[serde(default)]
    scripted: Option<ScriptedConfig>,
}

impl TryFrom<CoachTables> for CoachConfig {
    type Error = String;

    fn try_from(t: CoachTables) -> Result<Self, String> {
        t.settings.validate().map_err(|e| format!("coach: {e}"))?;
        if let Some(scripted) = &t.scripted {
            scripted.validate().map_err(|e| format!("coach: {e}"))?;
        }
        let judge = match (t.openai, t.local, t.scripted) {
            (Some(o), None, None) => Judge::OpenAi(o),
            (None, Some(l), None) => Judge::Local(l),
            (None, None, Some(s)) => Judge::Scripted(s),
            _ => {
                return Err(
                    "coach: expected exactly one of the tables [openai], [local], [scripted]"
                        .into(),
                )
            }
        };
        Ok(Self {
            domain: t.domain,
            rubric_dir: t.rubric_dir,
            cache: t.cache,
            cache_mode: t.cache_mode,
            settings: t.settings,
            judge,
        })
    }
}

impl From<CoachConfig> for CoachTables {
    fn from(c: CoachConfig) -> Self {
        let (mut openai, mut local, mut scripted) = (None, None, None);
        match c.judge {
            Judge::OpenAi(o) => openai = Some(o),
            Judge::Local(l) => local = Some(l),
            Judge::Scripted(s) => scripted = Some(s),
        }
        Self {
            domain: c.domain,
            rubric_dir: c.rubric_dir,
            cache: c.cache,
            cache_mode: c.cache_mode,
            settings: c.settings,
            openai,
            local,
            scripted,
        }
    }
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
        if let Judge::Local(local) = &mut self.judge {
            rebase(&mut local.checkpoint);
        }
    }

    /// Build the coach this configuration describes.
    pub fn build(&self) -> Result<Box<dyn Coach>, CoachError> {
        match &self.judge {
            Judge::Scripted(scripted) => Ok(Box::new(
                ScriptedCoach::new(scripted.clone())?
                    .seeing_ground_truth(self.settings.coach_sees_ground_truth),
            )),
            Judge::OpenAi(openai) => {
                // The backend first: a missing key must not leave a new, empty cache behind.
                let backend = match self.cache_mode {
                    CacheMode::Replay => OpenAiBackend::for_replay(openai.clone())?,
                    _ => OpenAiBackend::new(openai.clone())?,
                };
                let (rubrics, cache) = self.rubrics_and_cache()?;
                let name = format!("openai:{}", openai.model);
                Ok(Box::new(LlmCoach::new(
                    name,
                    backend,
                    rubrics,
                    self.settings.clone(),
                    cache,
                )?))
            }
            Judge::Local(local) => {
                let (rubrics, cache) = self.rubrics_and_cache()?;
                build_local(local, rubrics, self.settings.clone(), cache)
            }
        }
    }

    /// An LLM coach's rubrics and cache.
    fn rubrics_and_cache(&self) -> Result<(RubricSet, Option<CoachCache>), CoachError> {
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
        Ok((rubrics, cache))
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
        &local.reply_prefix,
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
