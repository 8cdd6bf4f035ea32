//! What about the machine decides a run's numbers, as recorded in the lock
//! file, and the warning when a run continues (`--resume`) or replays a
//! coach cache (`--coach replay`) on a machine that differs.
//!
//! On the CPU backend mappa's kernels give the same bits on every x86-64 CPU
//! with AVX2 and FMA, at any thread count (README, "Reproducibility"); the
//! record says whether this machine is inside that contract, and names what
//! changed when it is compared with another.

use serde_json::{json, Map, Value};

/// The CPU features whose presence decides which kernels run: gemm's f32
/// kernels need `avx2` and `fma` (without them it falls back to kernels that
/// round differently); burn's element-wise kernels also use `avx512f`.
#[cfg(target_arch = "x86_64")]
const FEATURES: [&str; 3] = ["avx2", "fma", "avx512f"];

/// This machine's record: OS, architecture, CPU model, the SIMD features the
/// kernels use, whether the CPU is inside the bit-identity contract, the
/// cores and the thread count, and the build profile.
pub fn record() -> Value {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = threads();
    let (features, contract) = simd();
    json!({
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "cpu_model": cpu_model(),
        "simd": features,
        "bit_identity_contract": contract,
        "cpus": cores,
        "threads": threads,
        "build_profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
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

#[cfg(not(target_arch = "x86_64"))]
fn simd() -> (Vec<&'static str>, &'static str) {
    (
        Vec::new(),
        "not x86-64: outside the contract (reproducible on the same machine kind only)",
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

/// The fields that differ between two records, as `name: old -> new`.
pub fn differences(old: &Value, new: &Value) -> Vec<String> {
    let empty = Map::new();
    let (old, new) = (
        old.as_object().unwrap_or(&empty),
        new.as_object().unwrap_or(&empty),
    );
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

/// A warning for `what` (say, "this run was started") on a machine whose
/// record differs from this one's, or `None` when they are the same.
pub fn warning(what: &str, recorded: &Value, here: &Value) -> Option<String> {
    let diffs = differences(recorded, here);
    if diffs.is_empty() {
        return None;
    }
    let inside = |r: &Value| {
        r["bit_identity_contract"]
            .as_str()
            .is_some_and(|c| c.contains("bit-identical"))
    };
    let consequence = if inside(recorded) && inside(here) {
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
        assert_eq!(warning("x", &r, &r), None);
    }

    #[test]
    fn a_differing_record_is_named_field_by_field() {
        let here = record();
        let mut other = here.clone();
        other["cpu_model"] = json!("AMD EPYC 9R14");
        other["threads"] = json!(64);
        other["bit_identity_contract"] = json!("not x86-64: outside the contract");
        let w = warning("this run was started", &other, &here).unwrap();
        assert!(w.contains("cpu_model: \"AMD EPYC 9R14\" -> "), "{w}");
        assert!(w.contains("threads: 64 -> "), "{w}");
        assert!(w.contains("outside the bit-identity contract"), "{w}");
        // A lock written before the record had these fields.
        let old = json!({ "os": here["os"], "arch": here["arch"], "cpus": here["cpus"] });
        assert!(warning("x", &old, &here)
            .unwrap()
            .contains("cpu_model: (not recorded) -> "));
    }
}
