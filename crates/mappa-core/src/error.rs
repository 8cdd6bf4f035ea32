//! The error type shared by the small utilities of this crate.

use std::path::PathBuf;

/// Errors raised by `mappa-core` utilities.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// An I/O operation on a named path failed.
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        /// What was being done, e.g. "cannot read".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl CoreError {
    /// Wraps an I/O error with the action and path it concerns.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
