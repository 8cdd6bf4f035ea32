//! A fake OpenAI-compatible server on 127.0.0.1 whose behaviour per request
//! is chosen by a scenario word in the action's task text, and action
//! contexts that name those scenarios.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mappa_judge::ActionContext;
use serde_json::{json, Value};

/// The fake API key the tests set; no file may contain it.
pub const FAKE_KEY: &str = "sk-mappa-test-FAKE-KEY-1234567890";
/// The environment variable holding it.
pub const KEY_VAR: &str = "MAPPA_TEST_COACH_API_KEY";

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub scenario: String,
    pub reprompt: bool,
    pub authorization: Option<String>,
}

/// The running server.
pub struct FakeServer {
    pub base_url: String,
    pub log: Arc<Mutex<Vec<Seen>>>,
}

impl FakeServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = shared.clone();
                std::thread::spawn(move || handle(stream, log));
            }
        });
        Self { base_url, log }
    }

    /// Requests seen for a scenario.
    pub fn count(&self, scenario: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.scenario == scenario)
            .count()
    }

    pub fn total(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

fn handle(mut stream: TcpStream, log: Arc<Mutex<Vec<Seen>>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut headers = BTreeMap::new();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    let request: Value = serde_json::from_slice(&body).unwrap();
    let messages = request["messages"].as_array().unwrap();
    let user = messages[1]["content"].as_str().unwrap();
    let scenario = user
        .split_whitespace()
        .find_map(|w| w.strip_prefix("SCENARIO="))
        .unwrap_or("good")
        .to_string();
    let reprompt = messages.len() > 2;
    let attempt = {
        let mut log = log.lock().unwrap();
        log.push(Seen {
            scenario: scenario.clone(),
            reprompt,
            authorization: headers.get("authorization").cloned(),
        });
        log.iter().filter(|s| s.scenario == scenario).count()
    };
    let reply = |content: &str| {
        json!({
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        })
        .to_string()
    };
    let (status, extra, body) = match (scenario.as_str(), attempt) {
        ("good", _) => (
            200,
            "",
            reply("The step is right and clear.\nPROCESS_SCORE: 8"),
        ),
        ("verdict", _) => (
            200,
            "",
            reply("Correct final answer.\nPROCESS_SCORE: 9\nANSWER_CORRECT: 1"),
        ),
        ("malformed-then-good", _) if !reprompt => (200, "", reply("I would rate this highly.")),
        ("malformed-then-good", _) => (200, "", reply("Fine.\nPROCESS_SCORE: 6")),
        ("always-malformed", _) => (200, "", reply("No score from me.")),
        ("rate-limited", 1) => (
            429,
            "Retry-After: 1\r\n",
            "{\"error\": \"slow down\"}".to_string(),
        ),
        ("rate-limited", _) => (200, "", reply("PROCESS_SCORE: 7")),
        ("server-error", _) => (500, "", "{\"error\": \"boom\"}".to_string()),
        ("slow", 1) => {
            std::thread::sleep(Duration::from_secs(5));
            (200, "", reply("PROCESS_SCORE: 1"))
        }
        ("slow", _) => (200, "", reply("PROCESS_SCORE: 4")),
        ("truncated", 1) => (200, "", reply("PROCESS_SCORE: 2")[..40].to_string()),
        ("truncated", _) => (200, "", reply("PROCESS_SCORE: 3")),
        ("unauthorized", _) => (401, "", "{\"error\": \"bad key\"}".to_string()),
        (other, _) => panic!("unknown scenario {other}"),
    };
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
}

/// An action whose task names a scenario.
pub fn action(id: &str, scenario: &str, role: &str) -> ActionContext {
    ActionContext {
        id: id.into(),
        task: format!("What is 6 * 7? SCENARIO={scenario}"),
        role: role.into(),
        agent_input: "Solve the problem.".into(),
        output: "6 * 7 = 42, so \\boxed{42}".into(),
        tool_observation: None,
        ground_truth: Some("42".into()),
        is_last_agent: role == "verifier",
        ..Default::default()
    }
}

/// Set the fake key once for the whole test binary.
pub fn set_fake_key() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var(KEY_VAR, FAKE_KEY));
}
