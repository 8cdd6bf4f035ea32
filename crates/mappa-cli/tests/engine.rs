//! Engine rollouts over HTTP (`[rollout.engine]` against `mappa serve`,
//! speaking vLLM's API and SGLang's): the run's records equal the
//! in-process run's on the same seeds, the engine restarted mid-run changes
//! nothing, adapters are hot-loaded after every update, a stale adapter
//! version is refused, and a reply from another model than the adapter
//! asked for stops the run.

use std::io::{BufRead, BufReader, Read, Write};
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
    /// Starts serving the tiny fixture model with `api`'s surface on `port`
    /// (0: any) and waits for its address.
    fn start(api: &str, port: u16) -> (Self, String) {
        Self::start_with(api, port, &[])
    }

    /// The same, with more `mappa serve` arguments.
    fn start_with(api: &str, port: u16, args: &[&str]) -> (Self, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mappa"))
            .current_dir(workspace())
            .args([
                "serve",
                "fixtures/models/qwen3-tiny",
                "--api",
                api,
                "--port",
            ])
            .arg(port.to_string())
            // The fixture model declares 256 positions; the run's prompts
            // are longer (vLLM serves beyond the config with --max-model-len
            // and VLLM_ALLOW_LONG_MAX_MODEL_LEN=1).
            .args(["--max-model-len", "4096"])
            .args(args)
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
    let path = dir.join("manifest.toml");
    let text = fixture_manifest("tiny-arith-lora");
    std::fs::write(&path, format!("{text}\n{extra}")).unwrap();
    path
}

fn records(run: &Path) -> (String, String) {
    (
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap(),
        std::fs::read_to_string(run.join("trajectories.jsonl")).unwrap(),
    )
}

/// The `model` of a request for `adapter` in `api`'s API.
fn model_field(api: &str, adapter: &str) -> String {
    match api {
        "sglang" => format!("qwen3-tiny:{adapter}"),
        _ => adapter.to_string(),
    }
}

/// An engine run of the fixture manifest against a `mappa serve` speaking
/// `api`, restarted once its first update is loaded: records equal the
/// in-process run's, every update hot-loaded, a stale version refused.
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn engine_rollouts_equal_in_process_ones(api: &str) {
    let scratch = scratch();
    let in_process = scratch.path().join("in-process");
    succeeds(
        mappa()
            .arg("run")
            .arg(manifest_with(scratch.path(), ""))
            .arg("--runs-dir")
            .arg(&in_process),
    );

    let (first, url) = Server::start(api, 0);
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
        &format!(
            "[rollout.engine]\nkind = \"{api}\"\nurl = \"{url}\"\nconcurrency = 3\nretry_for_s = 120\n"
        ),
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
    let (second, _) = Server::start(api, port);
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

    // What served is in the lock (outside the run id) and the report.
    let lock: Value = serde_json::from_str(
        &std::fs::read_to_string(engine_run.join("manifest.lock.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(lock["engine"]["api"], api);
    assert_eq!(lock["engine"]["server"], "mappa serve");
    assert_eq!(lock["engine"]["base_model"], "qwen3-tiny");
    let honoured = if api == "sglang" {
        json!(true)
    } else {
        Value::Null
    };
    assert_eq!(lock["engine"]["seeds_honoured"], honoured);

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
               "logprobs": 0, "return_token_ids": true})
    };
    let adapted = post(&url, "completions", &request(&model_field(api, current))).unwrap();
    let base = post(&url, "completions", &request("qwen3-tiny")).unwrap();
    assert_eq!(adapted["model"], model_field(api, current).as_str());
    assert_ne!(
        adapted["choices"][0]["logprobs"]["token_logprobs"],
        base["choices"][0]["logprobs"]["token_logprobs"]
    );
    // The same request gives the same completion.
    assert_eq!(
        post(&url, "completions", &request(&model_field(api, current))).unwrap()["choices"],
        adapted["choices"]
    );

    // A stale version is refused: vLLM no longer has it (404); SGLang
    // would load it again from its path, which the run deleted (400).
    let stale = current.replace("-v3", "-v2");
    let (code, body) = post(&url, "completions", &request(&model_field(api, &stale))).unwrap_err();
    assert_eq!(code, if api == "sglang" { 400 } else { 404 }, "{body}");
    assert!(body.contains(&stale), "{body}");
}

#[test]
fn engine_rollouts_equal_in_process_ones_through_a_restart_with_vllms_api() {
    engine_rollouts_equal_in_process_ones("vllm");
}

#[test]
fn engine_rollouts_equal_in_process_ones_through_a_restart_with_sglangs_api() {
    engine_rollouts_equal_in_process_ones("sglang");
}

#[test]
fn resuming_against_another_server_warns() {
    let scratch = scratch();
    let (_first, url) = Server::start("vllm", 0);
    let engine = |url: &str| format!("[rollout.engine]\nurl = \"{url}\"\n");
    let runs = scratch.path().join("runs");
    succeeds(
        mappa()
            .arg("run")
            .arg(manifest_with(scratch.path(), &engine(&url)))
            .args(["--max-steps", "1", "--runs-dir"])
            .arg(&runs),
    );
    let (_second, other) = Server::start_with("vllm", 0, &["--served-model-name", "renamed"]);
    let out = succeeds(
        mappa()
            .arg("run")
            .arg(manifest_with(scratch.path(), &engine(&other)))
            .arg("--resume")
            .arg(run_dir(&runs)),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("started with another engine serving") && stderr.contains("renamed"),
        "{stderr}"
    );
    let lock: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir(&runs).join("manifest.lock.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(lock["engine"]["base_model"], "qwen3-tiny");
    assert_eq!(lock["engine_resumed"][0]["base_model"], "renamed");
}

/// A coach served at the rollout engine's URL: warned about, and the
/// hazard recorded in the lock (vLLM's CPU build batches a base request
/// with adapter requests and gives it an adapter's delta).
#[test]
fn a_coach_at_the_engines_url_is_a_named_hazard_in_the_lock() {
    let scratch = scratch();
    let (_server, url) = Server::start("vllm", 0);
    let text = fixture_manifest("tiny-arith-lora").replace(
        "[coach.scripted]\nview = \"oracle\"\nstrength = \"medium\"\nseed = 3\n",
        &format!(
            "[coach.settings]\nmax_tokens = 4\n\n[coach.openai]\nbase_url = \"{url}\"\nmodel = \"qwen3-tiny\"\n"
        ),
    );
    let path = scratch.path().join("manifest.toml");
    std::fs::write(
        &path,
        format!("{text}\n[rollout.engine]\nurl = \"{url}\"\n"),
    )
    .unwrap();
    let runs = scratch.path().join("runs");
    let out = succeeds(
        mappa()
            .arg("run")
            .arg(&path)
            .args(["--max-steps", "1", "--runs-dir"])
            .arg(&runs),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: the coach is served by the rollout engine"),
        "{stderr}"
    );
    let lock: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir(&runs).join("manifest.lock.json")).unwrap(),
    )
    .unwrap();
    let hazards = lock["engine"]["hazards"].as_array().unwrap();
    assert!(
        hazards[0].as_str().unwrap().contains("adapter's delta"),
        "{lock}"
    );
}

/// A proxy on 127.0.0.1 in front of `upstream` that sends every completion
/// to the base model, as a misrouting load balancer would: the engine
/// answers truthfully as the base. Returns its base URL.
fn misrouting_proxy(upstream: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let upstream = upstream.clone();
            std::thread::spawn(move || forward(stream, &upstream));
        }
    });
    url
}

fn forward(mut stream: std::net::TcpStream, upstream: &str) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let mut parts = line.split(' ');
    let (method, path) = (
        parts.next().unwrap().to_string(),
        parts.next().unwrap().to_string(),
    );
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header == "\r\n" || header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let root = upstream.trim_end_matches("/v1");
    let target = format!("{root}{path}");
    let reply = if method == "GET" {
        ureq::get(&target).call()
    } else {
        let mut body: Value = serde_json::from_slice(&body).unwrap();
        if path.ends_with("/completions") {
            body["model"] = json!("qwen3-tiny");
        }
        ureq::post(&target).send_json(body)
    };
    let (code, text) = match reply {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => (502, e.to_string()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

#[test]
fn a_completion_from_another_model_than_the_adapter_asked_for_stops_the_run() {
    let scratch = scratch();
    let (_server, upstream) = Server::start("vllm", 0);
    let url = misrouting_proxy(upstream);
    let manifest = manifest_with(
        scratch.path(),
        &format!("[rollout.engine]\nurl = \"{url}\"\nretry_for_s = 30\n"),
    );
    let runs = scratch.path().join("runs");
    let stderr = fails(
        mappa()
            .arg("run")
            .arg(&manifest)
            .arg("--runs-dir")
            .arg(&runs),
    );
    assert!(
        stderr.contains("answered as `qwen3-tiny`")
            && stderr.contains("refusing a completion from another adapter version"),
        "{stderr}"
    );
    // Nothing was trained on it.
    let metrics = std::fs::read_to_string(run_dir(&runs).join("metrics.jsonl")).unwrap_or_default();
    assert!(!metrics.contains("\"kind\":\"train\""), "{metrics}");
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
