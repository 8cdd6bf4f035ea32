//! Engine rollouts over HTTP (`[rollout.engine]` against `mappa serve`):
//! the run's records equal the in-process run's on the same seeds, the
//! engine restarted mid-run changes nothing, adapters are hot-loaded after
//! every update, and a stale adapter version is refused.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::*;

/// A `mappa serve` process and the lines it wrote to stderr.
struct Server {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts serving the tiny fixture model on `port` (0: any) and waits
    /// for its address.
    fn start(port: u16) -> (Self, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mappa"))
            .current_dir(workspace())
            .args(["serve", "fixtures/models/qwen3-tiny", "--port"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split(" at ").nth(1) {
                    let _ = tx.send(url.split(' ').next().unwrap_or("").to_string());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("mappa serve prints its address");
        (Self { child, log }, url)
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn post(url: &str, path: &str, body: &Value) -> Result<Value, (u16, String)> {
    match ureq::post(&format!("{url}/{path}")).send_json(body.clone()) {
        Ok(r) => Ok(r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => Err((code, r.into_string().unwrap_or_default())),
        Err(e) => panic!("{e}"),
    }
}

/// The fixture manifest with absolute paths, plus `extra`.
fn manifest_with(dir: &Path, extra: &str) -> PathBuf {
    let ws = workspace().canonicalize().unwrap();
    let text = std::fs::read_to_string(ws.join("fixtures/manifests/tiny-arith-lora.toml"))
        .unwrap()
        .replace(
            "\"../../experiments",
            &format!("\"{}/experiments", ws.display()),
        )
        .replace(
            "\"../models",
            &format!("\"{}/fixtures/models", ws.display()),
        );
    let path = dir.join("manifest.toml");
    std::fs::write(&path, format!("{text}\n{extra}")).unwrap();
    path
}

fn records(run: &Path) -> (String, String) {
    (
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap(),
        std::fs::read_to_string(run.join("trajectories.jsonl")).unwrap(),
    )
}

#[test]
fn engine_rollouts_equal_in_process_ones_through_a_restart_with_adapters_hot_loaded() {
    let scratch = scratch();
    let in_process = scratch.path().join("in-process");
    succeeds(
        mappa()
            .arg("run")
            .arg(manifest_with(scratch.path(), ""))
            .arg("--runs-dir")
            .arg(&in_process),
    );

    let (first, url) = Server::start(0);
    let port: u16 = url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/v1")
        .parse()
        .unwrap();
    let engine_dir = scratch.path().join("engine-manifest");
    std::fs::create_dir_all(&engine_dir).unwrap();
    let manifest = manifest_with(
        &engine_dir,
        &format!("[rollout.engine]\nurl = \"{url}\"\nconcurrency = 3\nretry_for_s = 120\n"),
    );
    let runs = scratch.path().join("engine");
    let mut run = mappa()
        .arg("run")
        .arg(&manifest)
        .arg("--runs-dir")
        .arg(&runs)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Restart the engine once the first update's adapters are loaded, as
    // the second step's rollout starts: it loses them, and the run must
    // load them again.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !first
        .log()
        .iter()
        .any(|l| l.contains(" loaded ") && l.contains("-verifier-v1 "))
    {
        assert!(Instant::now() < deadline, "the engine run made no progress");
        assert!(
            run.try_wait().unwrap().is_none(),
            "the engine run ended early"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let before = first.log();
    drop(first);
    let (second, _) = Server::start(port);
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("loaded again"),
        "no adapter was reloaded: {stderr}"
    );

    // Same records, byte for byte.
    let engine_run = run_dir(&runs);
    let (metrics, trajectories) = records(&engine_run);
    let (expected_metrics, expected_trajectories) = records(&run_dir(&in_process));
    assert_eq!(metrics, expected_metrics);
    assert_eq!(trajectories, expected_trajectories);

    // Each update was hot-loaded, and the previous version unloaded.
    let after = second.log();
    let loads = |log: &[String], version: &str| {
        log.iter()
            .filter(|l| l.contains(" loaded ") && l.contains(version))
            .count()
    };
    assert_eq!(loads(&before, "-v0 "), 3, "{before:?}");
    assert_eq!(loads(&before, "-v1 "), 3, "{before:?}");
    assert_eq!(loads(&after, "-v3 "), 3, "{after:?}");
    let served: Vec<String> = ureq::get(&format!("{url}/models"))
        .call()
        .unwrap()
        .into_json::<Value>()
        .unwrap()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    let current = served
        .iter()
        .find(|n| n.ends_with("-verifier-v3"))
        .expect("v3 loaded");
    assert!(!served.iter().any(|n| n.ends_with("-v2")), "{served:?}");
    let kept: Vec<_> = std::fs::read_dir(engine_run.join("engine-adapters/verifier"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(kept, ["v3"]);

    // The adapter is what generates: the base answers the same request otherwise.
    let request = |model: &str| {
        json!({"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 6, "seed": 7,
               "logprobs": 0, "return_tokens_as_token_ids": true})
    };
    let adapted = post(&url, "completions", &request(current)).unwrap();
    let base = post(&url, "completions", &request("qwen3-tiny")).unwrap();
    assert_eq!(adapted["model"], current.as_str());
    assert_ne!(
        adapted["choices"][0]["logprobs"]["token_logprobs"],
        base["choices"][0]["logprobs"]["token_logprobs"]
    );
    // The same request gives the same completion.
    assert_eq!(
        post(&url, "completions", &request(current)).unwrap()["choices"],
        adapted["choices"]
    );

    // A stale version is refused.
    let stale = current.replace("-v3", "-v2");
    let (code, body) = post(&url, "completions", &request(&stale)).unwrap_err();
    assert_eq!(code, 404, "{body}");
    assert!(body.contains(&stale), "{body}");
}

#[test]
fn a_manifest_whose_agents_the_engine_cannot_serve_is_refused_by_name() {
    let scratch = scratch();
    for (extra, expected) in [
        // Full fine-tuning: nothing to hot-load.
        ("", "needs [train.lora]"),
        (
            "[rollout.engine]\nurl = \"localhost:8000\"\n",
            "rollout.engine.url",
        ),
    ] {
        let text = if extra.is_empty() {
            "[rollout.engine]\nurl = \"http://127.0.0.1:1/v1\"\n"
        } else {
            extra
        };
        let path = manifest_with(scratch.path(), text);
        let manifest = std::fs::read_to_string(&path).unwrap();
        let manifest = if extra.is_empty() {
            manifest.replace("[train.lora]\nrank = 4\nalpha = 8.0\n", "")
        } else {
            manifest
        };
        std::fs::write(&path, manifest).unwrap();
        let stderr = fails(
            mappa()
                .arg("run")
                .arg(&path)
                .arg("--runs-dir")
                .arg(scratch.path().join("runs")),
        );
        assert!(stderr.contains(expected), "{stderr}");
    }
}
