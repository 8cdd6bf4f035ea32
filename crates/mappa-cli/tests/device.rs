//! A backend whose device is not there is an error before anything is
//! written, not a panic: a `cuda` build run where no CUDA driver can be
//! loaded. Built only with the `cuda` feature (`just check-no-gpu`: the
//! build takes minutes, so CI does not run it); on a machine with a driver
//! the test says so and checks nothing.
#![cfg(feature = "cuda")]

use std::process::Command;

mod common;
use common::*;

#[test]
fn a_cuda_run_without_a_driver_stops_with_what_is_missing_before_writing() {
    if let Ok(found) = mappa_model::device::check_cuda() {
        eprintln!("note: CUDA is usable here ({found}): nothing to check");
        return;
    }
    let scratch = scratch();
    let ws = workspace().canonicalize().unwrap();
    let manifest = std::fs::read_to_string(ws.join("fixtures/manifests/tiny-arith.toml"))
        .unwrap()
        .replace("backend = \"cpu\"", "backend = \"cuda\"")
        .replace(
            "\"../../experiments",
            &format!("\"{}/experiments", ws.display()),
        )
        .replace(
            "\"../models",
            &format!("\"{}/fixtures/models", ws.display()),
        );
    let path = scratch.path().join("cuda.toml");
    std::fs::write(&path, manifest).unwrap();
    let runs = scratch.path().join("runs");
    let out = Command::new(env!("CARGO_BIN_EXE_mappa"))
        .current_dir(&ws)
        .arg("run")
        .arg(&path)
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 1: an error; a panic exits 101.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("backend cuda:")
            && stderr.contains("libcuda.so")
            && stderr.contains("LD_LIBRARY_PATH")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(!runs.exists(), "a run directory was written");
}
