//! Shared foundations of mappa that need no tensor library.
//!
//! - [`rng`]: named, seeded random streams. Every random choice in mappa draws
//!   from one of these, so that a manifest seed reproduces a run exactly.
//! - [`hash`]: sha256 of bytes and files, rendered as lowercase hex.
//! - [`fs`]: atomic file writes (temp file + rename), so that an interrupted
//!   write never destroys what was already on disk.
//! - [`chat`]: the chat message agents and coaches exchange.
//! - [`stats`]: means and standard deviations (population and sample).
//! - [`par`]: a parallel map on a fixed number of threads, for blocking work.
//! - [`paired`]: the paired test that decides a study's claim (sign-flip
//!   permutation test, bootstrap interval, detectable effect).
//! - [`mcnemar`]: the paired test of a run's claim that training improved
//!   held-out accuracy (McNemar's exact test over problems, its power,
//!   Wilson and bootstrap intervals).
//! - [`error`]: the error type of this crate.

#![warn(missing_docs)]

pub mod chat;
pub mod error;
pub mod fs;
pub mod hash;
pub mod http;
pub mod mcnemar;
pub mod paired;
pub mod par;
pub mod rng;
pub mod stats;

pub use error::{CoreError, Result};

/// The work one render of a user-supplied template (chat templates, workflow
/// prompts and programs, coach rubrics) may do, in minijinja fuel: about one
/// instruction or 64 bytes of data each. A long conversation renders well
/// within it (256 turns of 4 KB with the Qwen3 chat template:
/// `crates/mappa-model/tests/hostile_inputs.rs`); a template that loops or
/// grows strings without end fails with "out of fuel" instead of hanging or
/// exhausting memory (the budget bounds its data to about 256 MB).
pub const TEMPLATE_FUEL: u64 = 4_000_000;
pub use rng::{RngStream, SeedTree};
