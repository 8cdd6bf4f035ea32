//! The cross-CPU determinism contract, checked: a small training workload
//! (sampled generation with the KV cache, teacher-forced log-probs, two
//! REINFORCE++ updates with AdamW, matrix products longer than 512 terms)
//! reduced to one sha256 digest of every token id and float bit, computed in
//! this process and again in child processes that see other CPUs:
//!
//! - other thread counts (`RAYON_NUM_THREADS` 1 and 3);
//! - other cache geometries (as root: a private mount namespace in which
//!   `/sys/devices/system/cpu/*/cache` describes the L1 and L2 of an AMD
//!   EPYC, an Intel Xeon and an older client part; burn's GEMM sizes its
//!   blocks from these files);
//! - an x86-64 CPU without AVX-512 (when `qemu-x86_64` is installed: the
//!   child runs under qemu-user as a Haswell, AVX2 and FMA only);
//! - 64-bit ARM (when [`AARCH64_EXE`] names this test cross-built for
//!   `aarch64-unknown-linux-gnu`, as `just test` (CI), `just
//!   check-determinism` and `just check-arm` do where the cross toolchain
//!   is installed: the child runs under `qemu-aarch64`). Its digests are printed beside this machine's.
//!
//! The same child also multiplies and sums through burn's own CPU kernels,
//! which do depend on the machine: at least one variant must change those
//! bits, which shows the variants really present another CPU (the check
//! would have caught the bug it was written for).

use std::path::PathBuf;
use std::process::Command;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::prelude::*;
use mappa_core::hash::sha256_hex;
use mappa_core::rng::SeedTree;
use mappa_credit::shaping::KlEstimator;
use mappa_learner::{AgentLearner, LossConfig, TrainConfig, TrainSample};
use mappa_model::backend::Cpu;
use mappa_model::weights::hf_tensors;
use mappa_model::{generate, Family, GenerationConfig, SamplingConfig, TransformerConfig};

type B = Autodiff<Cpu>;

/// Set in a child process: print the digests and stop.
const CHILD: &str = "MAPPA_DETERMINISM_CHILD";

/// The path of this test built for `aarch64-unknown-linux-gnu`, to run
/// under `qemu-aarch64` as one more child (set by `just test` and `just check-determinism`).
const AARCH64_EXE: &str = "MAPPA_DETERMINISM_AARCH64";

/// Where Debian's cross toolchain keeps aarch64's C library, for qemu-user.
const AARCH64_SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// Where a passing run leaves its report (each variant's digest beside
/// this machine's), for `just test` to print: the harness shows a passing
/// test's output only when asked.
const REPORT: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/determinism-report.txt");

/// What the parent says: printed as it goes, and saved when all passed.
#[derive(Default)]
struct Report(Vec<String>);

impl Report {
    fn say(&mut self, line: String) {
        eprintln!("{line}");
        self.0.push(line);
    }

    /// Writes the report to [`REPORT`] (a temporary file, then renamed).
    fn save(&self) {
        let tmp = format!("{REPORT}.tmp");
        std::fs::write(&tmp, self.0.join("\n") + "\n").unwrap();
        std::fs::rename(&tmp, REPORT).unwrap();
    }
}

/// Bytes of every value the workload produced, in order.
#[derive(Default)]
struct Trace(Vec<u8>);

impl Trace {
    fn floats(&mut self, values: impl IntoIterator<Item = f32>) {
        for v in values {
            self.0.extend(v.to_bits().to_le_bytes());
        }
    }

    fn tokens(&mut self, ids: &[u32]) {
        for id in ids {
            self.0.extend(id.to_le_bytes());
        }
    }

    fn digest(&self) -> String {
        sha256_hex(&self.0)
    }
}

/// Qwen3-shaped, with an MLP wider than 512 so that the down projection's
/// forward product, and every weight gradient (one term per token row), runs
/// longer than one GEMM block.
fn config() -> TransformerConfig {
    TransformerConfig::for_family(Family::Qwen3, 320, 64, 640, 2, 4, 2, 16)
        .with_max_position_embeddings(512)
}

/// The workload through mappa's kernels: its digest.
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn workload() -> String {
    let device = Default::default();
    let mut trace = Trace::default();
    let seeds = SeedTree::new(13);
    let model = config().init::<B>(7, &device);
    let mut learner = AgentLearner::new(
        "probe",
        model,
        TrainConfig {
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_fraction: 0.0,
            total_steps: 2,
            micro_batch_size: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let mut rng = seeds.stream("prompts");
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| (0..130 + 20 * i).map(|_| rng.below(320) as u32).collect())
        .collect();
    let generation = GenerationConfig {
        max_new_tokens: 12,
        sampling: SamplingConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        eos_token_ids: vec![],
        stop_strings: vec![],
    };
    for step in 0..2 {
        let mut rngs: Vec<_> = (0..prompts.len())
            .map(|i| seeds.stream(&format!("sampler/{step}/{i}")))
            .collect();
        let policy = learner.policy().valid();
        let outputs = generate(&policy, None, &prompts, &mut rngs, &generation).unwrap();
        let pairs: Vec<(&[u32], &[u32])> = prompts
            .iter()
            .zip(&outputs)
            .map(|(p, o)| (p.as_slice(), o.token_ids.as_slice()))
            .collect();
        for o in &outputs {
            trace.tokens(&o.token_ids);
            trace.floats(o.logprobs.iter().copied());
        }
        let old = learner.policy_logprobs(&pairs).unwrap();
        let reference = learner.reference_logprobs(&pairs).unwrap();
        let samples: Vec<TrainSample> = pairs
            .iter()
            .enumerate()
            .map(|(i, (p, c))| TrainSample {
                prompt: p.to_vec(),
                completion: c.to_vec(),
                old_logprobs: old[i].clone(),
                ref_logprobs: reference[i].clone(),
                advantages: (0..c.len())
                    .map(|t| ((i + t) % 5) as f32 / 2.0 - 1.0)
                    .collect(),
                mask: vec![true; c.len()],
                is_weights: Vec::new(),
                reward: i as f64 / 4.0,
            })
            .collect();
        for row in old.iter().chain(&reference) {
            trace.floats(row.iter().copied());
        }
        let metrics = learner
            .train_step(
                &samples,
                &LossConfig {
                    clip_low: 0.2,
                    clip_high: 0.2,
                    dual_clip: Some(3.0),
                    kl_in_loss: Some((0.01, KlEstimator::K3)),
                },
            )
            .unwrap();
        trace.floats([
            metrics.loss as f32,
            metrics.kl as f32,
            metrics.grad_norm as f32,
        ]);
    }
    for (_, _, values) in hf_tensors(&learner.policy().valid()) {
        trace.floats(values);
    }
    trace.digest()
}

/// A product with 1000 terms and a long sum through burn's own CPU kernels,
/// whose order depends on the cache geometry and the SIMD width.
fn burn_kernels() -> String {
    let device = Default::default();
    let mut rng = SeedTree::new(5).stream("burn");
    let mut values =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform() as f32 - 0.5).collect() };
    let a = Tensor::<Cpu, 2>::from_data(TensorData::new(values(96 * 1000), [96, 1000]), &device);
    let b = Tensor::<Cpu, 2>::from_data(TensorData::new(values(1000 * 96), [1000, 96]), &device);
    let product = a.clone().matmul(b);
    let sums = a.sum_dim(1);
    let mut trace = Trace::default();
    trace.floats(product.into_data().to_vec::<f32>().unwrap());
    trace.floats(sums.into_data().to_vec::<f32>().unwrap());
    trace.digest()
}

/// Each simulated cache geometry: name, L1d KiB and ways, L2 KiB and ways.
const GEOMETRIES: [(&str, u32, u32, u32, u32); 3] = [
    (
        "AMD EPYC (Zen 4): L1d 32 KiB 8-way, L2 1 MiB 8-way",
        32,
        8,
        1024,
        8,
    ),
    (
        "Intel Xeon (Sapphire Rapids): L1d 48 KiB 12-way, L2 2 MiB 16-way",
        48,
        12,
        2048,
        16,
    ),
    (
        "Intel client (Skylake): L1d 32 KiB 8-way, L2 256 KiB 4-way",
        32,
        8,
        256,
        4,
    ),
];

/// Bind-mounts other L1d/L2 sizes and ways over every CPU's sysfs cache
/// files in a private mount namespace, then runs the command ("$@"). The
/// replacement files go into the directory given first.
const AS_GEOMETRY: &str = r#"
set -e
tmp=$1 l1=$2 l1w=$3 l2=$4 l2w=$5; shift 5
for idx in /sys/devices/system/cpu/cpu[0-9]*/cache/index*; do
  level=$(cat "$idx/level"); kind=$(cat "$idx/type")
  if [ "$level" = 1 ] && [ "$kind" = Data ]; then size=${l1}K ways=$l1w
  elif [ "$level" = 2 ]; then size=${l2}K ways=$l2w
  else continue; fi
  f=$tmp/$(echo "$idx" | tr / _)
  echo "$size" > "$f.size"; echo "$ways" > "$f.ways"
  mount --bind "$f.size" "$idx/size"
  mount --bind "$f.ways" "$idx/ways_of_associativity"
done
exec "$@"
"#;

/// This test binary, re-run as a child that prints its digests.
fn child(prefix: &[&str], env: &[(&str, &str)]) -> Command {
    child_of(&std::env::current_exe().unwrap(), prefix, env)
}

/// The test binary `exe` (this one, or this test built for another CPU),
/// run as a child that prints its digests.
fn child_of(exe: &std::path::Path, prefix: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = match prefix.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(exe);
            cmd
        }
        None => Command::new(exe),
    };
    cmd.args([
        "--exact",
        "same_bits_on_other_cpus",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn digests(mut cmd: Command, what: &str) -> (String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: the child failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let find = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.split_once(key).map(|(_, digest)| digest.trim()))
            .unwrap_or_else(|| panic!("{what}: no {key} line in:\n{stdout}"))
            .to_string()
    };
    (find("mappa="), find("burn="))
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

fn sysfs_cache_files() -> bool {
    std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index0/size").exists()
}

#[test]
fn same_bits_on_other_cpus() {
    if std::env::var_os(CHILD).is_some() {
        println!("mappa={}", workload());
        println!("burn={}", burn_kernels());
        return;
    }
    let here = (workload(), burn_kernels());
    assert_eq!(
        workload(),
        here.0,
        "the workload repeats within one process"
    );
    let mut report = Report::default();
    report.say(format!(
        "this machine ({}): mappa's workload {}",
        std::env::consts::ARCH,
        here.0
    ));

    let mut variants: Vec<(String, Command)> = vec![
        ("1 thread".into(), child(&[], &[("RAYON_NUM_THREADS", "1")])),
        (
            "3 threads".into(),
            child(&[], &[("RAYON_NUM_THREADS", "3")]),
        ),
    ];
    let scratch = tempfile::tempdir().unwrap();
    // Simulating another cache needs a mount namespace: root, unshare and sysfs cache files.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && on_path("unshare").is_some() && sysfs_cache_files() {
        for (i, (name, l1, l1w, l2, l2w)) in GEOMETRIES.into_iter().enumerate() {
            let files = scratch.path().join(format!("geometry-{i}"));
            std::fs::create_dir_all(&files).unwrap();
            let files = files.display().to_string();
            let (l1, l1w, l2, l2w) = (
                l1.to_string(),
                l1w.to_string(),
                l2.to_string(),
                l2w.to_string(),
            );
            let prefix = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                AS_GEOMETRY,
                "sh",
                &files,
                &l1,
                &l1w,
                &l2,
                &l2w,
            ];
            variants.push((name.into(), child(&prefix, &[])));
        }
    } else {
        report.say(format!(
            "note: cache geometries not simulated (needs root, unshare and /sys/devices/system/cpu/*/cache; root: {root})"
        ));
    }
    // An AVX2-only CPU, emulated; qemu-user is a Debian package (`.ci/run` installs it).
    if on_path("qemu-x86_64").is_some() {
        variants.push((
            "Haswell (AVX2 + FMA, no AVX-512) under qemu-user".into(),
            child(&["qemu-x86_64", "-cpu", "Haswell"], &[]),
        ));
    } else {
        report.say("note: no qemu-x86_64 on PATH: the AVX2-only CPU is not checked".into());
    }

    variants.extend(aarch64_variant(&mut report));

    let mut burn_changed = Vec::new();
    for (name, cmd) in variants {
        let (mappa, burn) = digests(cmd, &name);
        report.say(format!(
            "{name}:\n  mappa's workload {mappa}\n  (this machine:  {})",
            here.0
        ));
        assert_eq!(mappa, here.0, "{name}: mappa's workload changed bits");
        report.say("  same bits".into());
        if burn != here.1 {
            burn_changed.push(name);
        }
    }
    report.say(format!(
        "burn's own kernels changed bits under: {burn_changed:?}"
    ));
    if root && sysfs_cache_files() && on_path("unshare").is_some() {
        assert!(
            !burn_changed.is_empty(),
            "no variant changed burn's own kernels' bits: the variants did not present another CPU"
        );
    }
    report.save();
}

/// The workload on 64-bit ARM: this test cross-built for aarch64 Linux
/// ([`AARCH64_EXE`]) under `qemu-aarch64`, or `None` with a note saying
/// what is missing.
fn aarch64_variant(report: &mut Report) -> Option<(String, Command)> {
    let Some(exe) = std::env::var_os(AARCH64_EXE) else {
        report.say(format!("note: {AARCH64_EXE} is not set: 64-bit ARM is not checked here (`just test` and `just check-determinism` set it where the aarch64 cross toolchain is installed: `just arm-tools`)"));
        return None;
    };
    let exe = PathBuf::from(exe);
    assert!(
        exe.is_file(),
        "{AARCH64_EXE}={}: no such file (the determinism test cross-built for aarch64-unknown-linux-gnu)",
        exe.display()
    );
    assert!(
        on_path("qemu-aarch64").is_some(),
        "{AARCH64_EXE} is set but qemu-aarch64 is not on PATH (Debian's qemu-user)"
    );
    let prefix = ["qemu-aarch64", "-L", AARCH64_SYSROOT];
    Some((
        "64-bit ARM (aarch64 Linux) under qemu-aarch64".into(),
        child_of(&exe, &prefix, &[]),
    ))
}
