//! Shared foundations of mappa that need no tensor library.
//!
//! - [`rng`]: named, seeded random streams. Every random choice in mappa draws
//!   from one of these, so that a manifest seed reproduces a run exactly.
//! - [`hash`]: sha256 of bytes and files, rendered as lowercase hex.
//! - [`fs`]: atomic file writes (temp file + rename), so that an interrupted
//!   write never destroys what was already on disk.
//! - [`chat`]: the chat message agents and coaches exchange.
//! - [`stats`]: means and standard deviations (population and sample).
//! - [`error`]: the error type of this crate.

#![warn(missing_docs)]

pub mod chat;
pub mod error;
pub mod fs;
pub mod hash;
pub mod rng;
pub mod stats;

pub use error::{CoreError, Result};
pub use rng::{RngStream, SeedTree};
