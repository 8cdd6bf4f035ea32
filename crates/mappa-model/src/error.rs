//! Errors of the model crate. Each names the file, field or tensor at fault
//! and what was expected, so that a bad checkpoint is fixed in one look.

use std::path::{Path, PathBuf};

/// Everything that can go wrong loading, saving or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An I/O operation on a path failed.
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration field is missing, malformed or unsupported.
    #[error("config{}: field `{field}` {message}", file.as_ref().map(|p| format!(" `{}`", p.display())).unwrap_or_default())]
    Config {
        /// The config file, when known.
        file: Option<PathBuf>,
        /// The offending field (dotted path for nested fields).
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A weight file is unreadable, or a tensor in it is missing or wrong.
    #[error("weights `{}`: {message}", file.display())]
    Weights {
        /// The weight file (or index file) at fault.
        file: PathBuf,
        /// What is wrong, naming the tensor where there is one.
        message: String,
    },
    /// The tokenizer or chat template could not be loaded or applied.
    #[error("tokenizer{}: {message}", file.as_ref().map(|p| format!(" `{}`", p.display())).unwrap_or_default())]
    Tokenizer {
        /// The tokenizer file, when known.
        file: Option<PathBuf>,
        /// What went wrong.
        message: String,
    },
    /// A GGUF file is malformed, truncated, or holds something mappa cannot convert.
    #[error("GGUF `{}`: {message}", file.display())]
    Gguf {
        /// The GGUF file.
        file: PathBuf,
        /// What is wrong, naming the metadata key or tensor where there is one.
        message: String,
    },
    /// A request to the model is inconsistent (bad shapes, empty batch, ids out of range).
    #[error("invalid input: {0}")]
    Input(String),
    /// The model produced NaN or infinite values.
    #[error("numerical error: {0}")]
    NonFinite(String),
}

impl ModelError {
    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// A config error for `field`.
    pub fn config(file: Option<&Path>, field: &str, message: String) -> Self {
        Self::Config {
            file: file.map(Path::to_path_buf),
            field: field.to_string(),
            message,
        }
    }

    /// A weights error in `file`.
    pub fn weights(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Weights {
            file: file.into(),
            message: message.into(),
        }
    }

    /// A tokenizer error.
    pub fn tokenizer(file: Option<&Path>, message: impl Into<String>) -> Self {
        Self::Tokenizer {
            file: file.map(Path::to_path_buf),
            message: message.into(),
        }
    }

    /// A GGUF error in `file`.
    pub fn gguf(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Gguf {
            file: file.into(),
            message: message.into(),
        }
    }

    /// Attaches the config file to a config error that lacked it.
    pub(crate) fn in_file(self, path: &Path) -> Self {
        match self {
            Self::Config {
                file: None,
                field,
                message,
            } => Self::Config {
                file: Some(path.to_path_buf()),
                field,
                message,
            },
            other => other,
        }
    }
}

impl From<mappa_core::CoreError> for ModelError {
    fn from(e: mappa_core::CoreError) -> Self {
        match e {
            mappa_core::CoreError::Io {
                action,
                path,
                source,
            } => Self::Io {
                action,
                path,
                source,
            },
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
