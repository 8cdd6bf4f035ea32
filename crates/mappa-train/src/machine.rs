//! What about the machine decides a run's numbers, as recorded in the lock
//! file, and the warning when a run continues (`--resume`) or replays a
//! coach cache (`--coach replay`) on a machine that differs.
//!
//! On the CPU backend mappa's kernels give the same bits on every x86-64 CPU
//! with AVX2 and FMA and on 64-bit ARM Linux, at any thread count
//! (`docs/reproducibility.md`); the
//! record says whether this machine is inside that contract, and names what
//! changed when it is compared with another.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The CPU features whose presence decides which kernels run: gemm's f32
/// kernels need `avx2` and `fma` (without them it falls back to kernels that
/// round differently); burn's element-wise kernels also use `avx512f`.
#[cfg(target_arch = "x86_64")]
const FEATURES: [&str; 3] = ["avx2", "fma", "avx512f"];

/// What about a machine decides a run's numbers: OS, architecture, CPU
/// model, the SIMD features the kernels use, whether the CPU is inside the
/// bit-identity contract, the cores and the thread count, and the build
/// profile. Every field is optional: a record written by an older mappa
/// may lack it, and comparisons then say "(not recorded)".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `std::env::consts::OS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// `std::env::consts::ARCH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The CPU's model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// The SIMD features present that decide which kernels run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simd: Option<Vec<String>>,
    /// Whether (and why) the CPU is inside the bit-identity contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bit_identity_contract: Option<String>,
    /// The CPUs this process may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<usize>,
    /// The CPU backend's threads ([`threads`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// `debug` or `release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_profile: Option<String>,
}

impl Machine {
    /// This machine's record.
    pub fn here() -> Self {
        let (features, contract) = simd();
        Self {
            os: Some(std::env::consts::OS.into()),
            arch: Some(std::env::consts::ARCH.into()),
            cpu_model: Some(cpu_model()),
            simd: Some(features.into_iter().map(String::from).collect()),
            bit_identity_contract: Some(contract.into()),
            cpus: Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
            threads: Some(threads()),
            build_profile: Some(
                if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                }
                .into(),
            ),
        }
    }

    /// A record stored as JSON text (a coach cache's), or the empty record
    /// if it does not read as one.
    pub fn parse(text: &str) -> Self {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// Whether the record says the CPU is inside the bit-identity contract.
    pub fn inside_contract(&self) -> bool {
        self.bit_identity_contract
            .as_deref()
            .is_some_and(|c| c.contains("bit-identical"))
    }

    /// The fields that differ from `new`'s, as `name: old -> new`.
    pub fn differences(&self, new: &Machine) -> Vec<String> {
        let as_map = |m: &Machine| match serde_json::to_value(m) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let (old, new) = (as_map(self), as_map(new));
        let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| old.get(*k) != new.get(*k))
            .map(|k| {
                let show = |v: Option<&Value>| v.map_or("(not recorded)".into(), Value::to_string);
                format!("{k}: {} -> {}", show(old.get(k)), show(new.get(k)))
            })
            .collect()
    }
}

/// This machine's record as JSON, for the reports and files that embed it.
pub fn record() -> Value {
    serde_json::to_value(Machine::here()).expect("a machine record serialises")
}

/// The CPU backend's threads: `RAYON_NUM_THREADS` where set to a positive
/// number, else the CPUs this process may use.
pub fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(target_arch = "x86_64")]
fn simd() -> (Vec<&'static str>, &'static str) {
    let detected = |f: &str| match f {
        "avx2" => std::arch::is_x86_feature_detected!("avx2"),
        "fma" => std::arch::is_x86_feature_detected!("fma"),
        "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
        _ => false,
    };
    let features: Vec<&str> = FEATURES.into_iter().filter(|f| detected(f)).collect();
    let contract = if detected("avx2") && detected("fma") {
        "x86-64 with AVX2 and FMA: bit-identical to every such CPU"
    } else {
        "x86-64 without AVX2 and FMA: outside the contract (other GEMM kernels)"
    };
    (features, contract)
}

#[cfg(target_arch = "aarch64")]
fn simd() -> (Vec<&'static str>, &'static str) {
    // NEON (and its fused multiply-add) is part of aarch64's base set.
    let features = if std::arch::is_aarch64_feature_detected!("neon") {
        vec!["neon"]
    } else {
        Vec::new()
    };
    let contract = if cfg!(target_os = "linux") {
        "64-bit ARM (aarch64 Linux): bit-identical to every x86-64 CPU with AVX2 and FMA (checked under qemu-aarch64, not yet on ARM hardware)"
    } else {
        "64-bit ARM outside Linux (macOS): untested, so outside the contract (the same kernels as aarch64 Linux)"
    };
    (features, contract)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd() -> (Vec<&'static str>, &'static str) {
    (
        Vec::new(),
        "neither x86-64 nor 64-bit ARM: outside the contract (reproducible on the same machine kind only)",
    )
}

/// The CPU's model name (Linux: `/proc/cpuinfo`), or `"unknown"`.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A warning for `what` (say, "this run was started") on a machine whose
/// record differs from this one's, or `None` when they are the same.
pub fn warning(what: &str, recorded: &Machine, here: &Machine) -> Option<String> {
    let diffs = recorded.differences(here);
    if diffs.is_empty() {
        return None;
    }
    let consequence = if recorded.inside_contract() && here.inside_contract() {
        "both are inside the bit-identity contract, so the numbers should match bit for bit"
    } else {
        "at least one is outside the bit-identity contract, so numbers may differ in the last bits and sampled trajectories may diverge"
    };
    Some(format!(
        "warning: {what} on a different machine ({}); {consequence} (README, \"Reproducibility\")",
        diffs.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_names_what_decides_the_numbers() {
        let r = record();
        for key in [
            "cpu_model",
            "simd",
            "bit_identity_contract",
            "threads",
            "build_profile",
        ] {
            assert!(!r[key].is_null(), "{key} missing from {r}");
        }
        let here = Machine::here();
        assert_eq!(Machine::parse(&r.to_string()), here);
        assert_eq!(warning("x", &here, &here), None);
    }

    #[test]
    fn a_differing_record_is_named_field_by_field() {
        let here = Machine::here();
        let other = Machine {
            cpu_model: Some("AMD EPYC 9R14".into()),
            threads: Some(64),
            bit_identity_contract: Some("RISC-V: outside the contract".into()),
            ..here.clone()
        };
        let w = warning("this run was started", &other, &here).unwrap();
        assert!(w.contains("cpu_model: \"AMD EPYC 9R14\" -> "), "{w}");
        assert!(w.contains("threads: 64 -> "), "{w}");
        assert!(w.contains("outside the bit-identity contract"), "{w}");
        // A lock written before the record had these fields.
        let old = Machine::parse(r#"{ "os": "linux", "arch": "x86_64", "cpus": 2 }"#);
        assert_eq!(old.cpus, Some(2));
        assert!(warning("x", &old, &here)
            .unwrap()
            .contains("cpu_model: (not recorded) -> "));
    }
}
