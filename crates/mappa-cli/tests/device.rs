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

/// Runs the tiny fixture run with `backend` and checks that it stops with
/// exit code 1 (a panic exits 101), an error holding each of `expected`,
/// and no run directory written.
fn stops_before_writing(backend: &str, expected: &[&str]) {
    let scratch = scratch();
    let manifest = fixture_manifest("tiny-arith")
        .replace("backend = \"cpu\"", &format!("backend = \"{backend}\""));
    let path = scratch.path().join("gpu.toml");
    std::fs::write(&path, manifest).unwrap();
    let runs = scratch.path().join("runs");
    let out = Command::new(env!("CARGO_BIN_EXE_mappa"))
        .current_dir(workspace())
        .arg("run")
        .arg(&path)
        .arg("--runs-dir")
        .arg(&runs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for needle in expected {
        assert!(stderr.contains(needle), "no {needle:?} in {stderr}");
    }
    assert!(!runs.exists(), "a run directory was written");
}

#[cfg(feature = "cuda")]
#[test]
fn a_cuda_run_without_a_driver_stops_with_what_is_missing_before_writing() {
    if let Ok(found) = mappa_model::device::check_cuda() {
        eprintln!("note: CUDA is usable here ({found}): nothing to check");
        return;
    }
    stops_before_writing("cuda", &["backend cuda:", "libcuda.so", "LD_LIBRARY_PATH"]);
}

#[cfg(feature = "wgpu")]
#[test]
fn a_wgpu_run_without_an_adapter_stops_with_what_is_missing_before_writing() {
    if let Ok(found) = mappa_model::device::check_wgpu() {
        eprintln!("note: wgpu finds an adapter here ({found}): nothing to check");
        return;
    }
    stops_before_writing("wgpu", &["backend wgpu: no", "adapter"]);
}

/// `mappa eval` follows the manifest's backend: without a driver it stops
/// before writing its eval directory.
#[cfg(feature = "cuda")]
#[test]
fn a_cuda_eval_without_a_driver_stops_before_writing() {
    if mappa_model::device::check_cuda().is_ok() {
        return;
    }
    let scratch = scratch();
    let manifest =
        fixture_manifest("tiny-arith").replace("backend = \"cpu\"", "backend = \"cuda\"");
    let path = scratch.path().join("gpu.toml");
    std::fs::write(&path, manifest).unwrap();
    let out = scratch.path().join("eval");
    let run = mappa()
        .arg("eval")
        .arg(&path)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("backend cuda:") && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(!out.exists(), "the eval directory was written");
}

/// `mappa doctor --backend cuda` without a driver: environment.json says
/// what was searched, no check runs, exit code 1, no panic.
#[cfg(feature = "cuda")]
#[test]
fn the_doctor_without_a_driver_reports_what_is_missing() {
    if mappa_model::device::check_cuda().is_ok() {
        return;
    }
    let scratch = scratch();
    let out = scratch.path().join("doctor");
    let run = mappa()
        .args(["doctor", "--backend", "cuda", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("libcuda.so"), "{stderr}");
    let env = std::fs::read_to_string(out.join("environment.json")).unwrap();
    assert!(env.contains("\"device_error\""), "{env}");
    assert!(!out.join("checks.jsonl").exists());
}
