//! The GPU bundle's `run.sh` flow on the CPU backend (`MAPPA_BACKEND=cpu`),
//! so that it does not rot while no GPU is at hand: the doctor runs (a few
//! of its checks, to keep CI short), PyTorch's part runs where torch
//! imports and is skipped, saying so, where it does not, and one summary
//! table comes out.

use std::process::Command;

mod common;
use common::*;

#[test]
fn run_sh_checks_the_cpu_and_writes_one_summary() {
    let scratch = scratch();
    let out = scratch.path().join("results");
    let run = Command::new("bash")
        .arg(workspace().join("benches/gpu/run.sh"))
        .arg(&out)
        .env("MAPPA_BIN", env!("CARGO_BIN_EXE_mappa"))
        .env("MAPPA_BACKEND", "cpu")
        .env(
            "MAPPA_DOCTOR_ARGS",
            "--only parity-random,step-lora,hf-export,throughput",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for check in [
        "parity-random-qwen3",
        "step-lora",
        "hf-export",
        "throughput-1m",
    ] {
        assert!(
            summary.contains(&format!("| {check} | PASS |")),
            "{summary}"
        );
    }
    assert!(summary.contains("| 1m | train_step |"), "{summary}");
    let torch = Command::new("python3")
        .args(["-c", "import torch, transformers"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match torch {
        true => assert!(summary.contains("HF parity (transformers cpu"), "{summary}"),
        false => assert!(
            stdout.contains("the PyTorch comparison and HF parity are skipped"),
            "{stdout}"
        ),
    }
    assert!(out.join("doctor/hf-export/model.safetensors").exists());
}
