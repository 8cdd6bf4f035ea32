//! The `mappa` binary: parse the command line, run it, report errors.

use std::process::ExitCode;

use clap::Parser;
use mappa_model::kernels::alloc::Allocator;

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

fn main() -> ExitCode {
    mappa_model::kernels::alloc::keep_freed_memory();
    match mappa_cli::execute(mappa_cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mappa: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
