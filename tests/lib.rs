//! Workspace-level scenario tests live beside this file, one `[[test]]` per
//! scenario (see `Cargo.toml`). This library only locates shared fixtures.

#![warn(missing_docs)]

use std::path::PathBuf;

/// The repository's `fixtures/` directory.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}
