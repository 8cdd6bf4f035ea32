//! The coach cache: SQLite (WAL mode) keyed by sha256 of (coach model,
//! template sha256, rendered messages, temperature, max tokens), holding the
//! raw reply and the parsed score. A run can then be replayed exactly:
//! in `replay` mode only hits are allowed. SQLite's transactions keep the
//! file correct with concurrent writers (threads or processes) and across a
//! `kill -9` mid-write. A replay opens the file read-only and leaves no
//! trace: no `-wal` or `-shm` files are created, and nothing is written.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use mappa_core::hash::sha256_hex;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
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
    /// is the absence of a cache and is refused here; `replay` opens an
    /// existing cache read-only.
    pub fn open(path: &Path, mode: CacheMode) -> Result<Self, CoachError> {
        let err = |message: String| CoachError::Cache {
            path: path.display().to_string(),
            message,
        };
        let conn = match mode {
            CacheMode::Off => return Err(err("cache mode `off` opens no cache".into())),
            CacheMode::Replay => open_read_only(path).map_err(err)?,
            CacheMode::ReadWrite => open_read_write(path).map_err(err)?,
        };
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

/// Open or create a cache for reading and writing (WAL mode).
fn open_read_write(path: &Path) -> Result<Connection, String> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let conn = Connection::open(path).map_err(|e| e.to_string())?;
    conn.busy_timeout(Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| e.to_string())?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| e.to_string())?;
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
    .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// Open an existing cache read-only. A cache closed cleanly holds
/// everything in the main file, which is opened `immutable` (SQLite then
/// creates no `-wal`/`-shm` files and takes no locks). A `-wal` file beside
/// it holds answers not yet moved into the main file (its writer is running,
/// or was killed): then the file is opened read-only through the WAL so that
/// those answers are read too.
fn open_read_only(path: &Path) -> Result<Connection, String> {
    if !path.is_file() {
        return Err("replay needs an existing cache, and this file does not exist".into());
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
    let conn = if Path::new(&wal).exists() {
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
    } else {
        Connection::open_with_flags(format!("{}?immutable=1", file_uri(path)), flags)
    }
    .map_err(|e| e.to_string())?;
    conn.busy_timeout(Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    let tables: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'coach_cache'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if tables == 0 {
        return Err("not a coach cache (it has no `coach_cache` table)".into());
    }
    Ok(conn)
}

/// `path` as an SQLite `file:` URI, every byte but unreserved ones and `/`
/// percent-encoded.
fn file_uri(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut uri = String::from("file:");
    for &byte in absolute.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            uri.push(byte as char);
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn score(text: &str) -> ActionScore {
        ActionScore {
            score: 7.0,
            rationale: text.into(),
            fallback: false,
            fallback_reason: None,
            answer_correct: None,
            raw_response: text.into(),
            coach: "test".into(),
            template_sha256: String::new(),
            cached: false,
            audit: None,
        }
    }

    #[test]
    fn a_replay_reads_without_writing_or_creating_files() {
        let dir = tempfile::tempdir().unwrap();
        // An awkward name: the URI must encode it.
        let path = dir.path().join("odd name #1 %?.sqlite");
        {
            let cache = CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
            cache.put("k", "m", "t", &score("kept")).unwrap();
        }
        assert_eq!(names(dir.path()), ["odd name #1 %?.sqlite"]);
        let before = std::fs::read(&path).unwrap();
        let replay = CoachCache::open(&path, CacheMode::Replay).unwrap();
        assert_eq!(replay.get("k").unwrap().unwrap().rationale, "kept");
        assert!(replay.get("other").unwrap().is_none());
        assert_eq!(
            names(dir.path()),
            ["odd name #1 %?.sqlite"],
            "no WAL files while it reads"
        );
        assert!(
            replay.put("k2", "m", "t", &score("new")).is_err(),
            "a replay cannot write"
        );
        drop(replay);
        assert_eq!(names(dir.path()), ["odd name #1 %?.sqlite"], "no WAL files");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the file is unchanged"
        );
    }

    #[test]
    fn a_replay_reads_answers_still_in_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.sqlite");
        let writer = CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
        writer
            .conn
            .lock()
            .unwrap()
            .pragma_update(None, "wal_autocheckpoint", 0)
            .unwrap();
        writer.put("k", "m", "t", &score("in the wal")).unwrap();
        let replay = CoachCache::open(&path, CacheMode::Replay).unwrap();
        assert_eq!(replay.get("k").unwrap().unwrap().rationale, "in the wal");
    }

    #[test]
    fn a_replay_of_a_missing_or_foreign_file_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.sqlite");
        let e = CoachCache::open(&missing, CacheMode::Replay).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!missing.exists());
        let foreign = dir.path().join("notes.sqlite");
        std::fs::write(&foreign, "not a database at all, just text").unwrap();
        let e = CoachCache::open(&foreign, CacheMode::Replay).unwrap_err();
        assert!(e.to_string().contains("notes.sqlite"), "{e}");
    }
}
