//! A backend whose device is not there is an error before anything is
//! written, not a panic: a GPU build run where no CUDA driver can be loaded
//! or no wgpu adapter is found. Built only with the `cuda` or `wgpu`
//! feature (`just check-no-gpu`: the build takes many minutes, so CI does
//! not run it); where the device is there, each test says so and checks
//! nothing.
#![cfg(any(feature = "cuda", feature = "wgpu"))]

use std::process::Command;

mod common;
use common::*;

/// Runs the tiny fixture run with `backend`: its exit code and stderr, and
/// whether it wrote a run directory.
fn run_with_backend(backend: &str) -> (Option<i32>, String, bool) {
    let scratch = scratch();
    let ws = workspace().canonicalize().unwrap();
    let manifest = std::fs::read_to_string(ws.join("fixtures/manifests/tiny-arith.toml"))
        .unwrap()
        .replace("backend = \"cpu\"", &format!("backend = \"{backend}\""))
        .replace(
            "\"../../experiments",
            &format!("\"{}/experiments", ws.display()),
        )
        .replace(
            "\"../models",
            &format!("\"{}/fixtures/models", ws.display()),
        );
    let path = scratch.path().join("gpu.toml");
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
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr, runs.exists())
}

#[cfg(feature = "cuda")]
#[test]
fn a_cuda_run_without_a_driver_stops_with_what_is_missing_before_writing() {
    if let Ok(found) = mappa_model::device::check_cuda() {
        eprintln!("note: CUDA is usable here ({found}): nothing to check");
        return;
    }
    let (code, stderr, wrote) = run_with_backend("cuda");
    // 1: an error; a panic exits 101.
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("backend cuda:")
            && stderr.contains("libcuda.so")
            && stderr.contains("LD_LIBRARY_PATH")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(!wrote, "a run directory was written");
}

#[cfg(feature = "wgpu")]
#[test]
fn a_wgpu_run_without_an_adapter_stops_with_what_is_missing_before_writing() {
    if let Ok(found) = mappa_model::device::check_wgpu() {
        eprintln!("note: wgpu finds an adapter here ({found}): nothing to check");
        return;
    }
    let (code, stderr, wrote) = run_with_backend("wgpu");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("backend wgpu: no")
            && stderr.contains("adapter")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(!wrote, "a run directory was written");
}
