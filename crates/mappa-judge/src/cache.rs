//! The coach cache: SQLite (WAL mode) keyed by sha256 of (coach model,
//! template sha256, rendered messages, temperature, max tokens), holding the
//! raw reply and the parsed score. A run can then be replayed exactly:
//! in `replay` mode only hits are allowed. SQLite's transactions keep the
//! file correct with concurrent writers (threads or processes) and across a
//! `kill -9` mid-write.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use mappa_core::hash::sha256_hex;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::context::ActionScore;
use crate::llm::GenerationParams;
use crate::rubric::RenderedPrompt;
use crate::CoachError;

/// How the cache is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    /// No cache.
    Off,
    /// Hits are used, misses are asked and stored.
    #[default]
    ReadWrite,
    /// Hits only: a miss is an error naming the key and the action.
    Replay,
}

/// The cache key of one coach request.
pub fn cache_key(coach_model: &str, prompt: &RenderedPrompt, params: &GenerationParams) -> String {
    let material = json!({
        "coach_model": coach_model,
        "template_sha256": prompt.template_sha256,
        "messages": prompt.messages,
        "temperature": params.temperature,
        "max_tokens": params.max_tokens,
    });
    sha256_hex(material.to_string().as_bytes())
}

/// An open cache file.
#[derive(Debug)]
pub struct CoachCache {
    path: PathBuf,
    mode: CacheMode,
    conn: Mutex<Connection>,
}

impl CoachCache {
    /// Open (creating in `read-write` mode) the cache at `path`. Mode `off`
    /// is the absence of a cache and is refused here.
    pub fn open(path: &Path, mode: CacheMode) -> Result<Self, CoachError> {
        let err = |message: String| CoachError::Cache {
            path: path.display().to_string(),
            message,
        };
        match mode {
            CacheMode::Off => return Err(err("cache mode `off` opens no cache".into())),
            CacheMode::Replay if !path.exists() => {
                return Err(err(
                    "replay needs an existing cache, and this file does not exist".into(),
                ))
            }
            _ => {}
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| err(e.to_string()))?;
        }
        let conn = Connection::open(path).map_err(|e| err(e.to_string()))?;
        conn.busy_timeout(Duration::from_secs(60))
            .map_err(|e| err(e.to_string()))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| err(e.to_string()))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| err(e.to_string()))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS coach_cache (
                key TEXT PRIMARY KEY,
                coach_model TEXT NOT NULL,
                template_sha256 TEXT NOT NULL,
                raw_response TEXT NOT NULL,
                score_json TEXT NOT NULL,
                created_unix INTEGER NOT NULL
            );
            CREATE TABLE IF NOT EXISTS cache_meta (
                name TEXT PRIMARY KEY,
                value TEXT NOT NULL
            );",
        )
        .map_err(|e| err(e.to_string()))?;
        Ok(Self {
            path: path.to_path_buf(),
            mode,
            conn: Mutex::new(conn),
        })
    }

    /// The mode.
    pub fn mode(&self) -> CacheMode {
        self.mode
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> CoachError {
        CoachError::Cache {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    /// The stored score for `key`.
    pub fn get(&self, key: &str) -> Result<Option<ActionScore>, CoachError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let json: Option<String> = conn
            .query_row(
                "SELECT score_json FROM coach_cache WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        json.map(|j| serde_json::from_str(&j).map_err(|e| self.err(format!("entry {key}: {e}"))))
            .transpose()
    }

    /// Store a score (the first writer of a key wins).
    pub fn put(
        &self,
        key: &str,
        coach_model: &str,
        template_sha256: &str,
        score: &ActionScore,
    ) -> Result<(), CoachError> {
        let json = serde_json::to_string(score).map_err(|e| self.err(e))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.execute(
            "INSERT OR IGNORE INTO coach_cache
                (key, coach_model, template_sha256, raw_response, score_json, created_unix)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                key,
                coach_model,
                template_sha256,
                score.raw_response,
                json,
                now
            ],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The record of the machine that first wrote to this cache (an opaque
    /// JSON text: the run's lock-file machine record), if one was noted.
    pub fn recorded_machine(&self) -> Result<Option<String>, CoachError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.query_row(
            "SELECT value FROM cache_meta WHERE name = 'machine'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| self.err(e))
    }

    /// Note the machine writing to this cache, unless one is already noted.
    pub fn note_machine(&self, record: &str) -> Result<(), CoachError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.execute(
            "INSERT OR IGNORE INTO cache_meta (name, value) VALUES ('machine', ?1)",
            params![record],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Number of entries.
    pub fn len(&self) -> Result<u64, CoachError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.query_row("SELECT COUNT(*) FROM coach_cache", [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n as u64)
        .map_err(|e| self.err(e))
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> Result<bool, CoachError> {
        self.len().map(|n| n == 0)
    }

    /// SQLite's `PRAGMA integrity_check` result (`"ok"` when sound).
    pub fn integrity_check(&self) -> Result<String, CoachError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| self.err(e))
    }
}
