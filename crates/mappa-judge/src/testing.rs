//! A minimal OpenAI-compatible chat server on 127.0.0.1, for tests of
//! coaches and policies (feature `testing`). Each request's JSON body and
//! headers go to a handler, which returns the reply: a chat completion, an
//! HTTP error, a delay, a truncated body.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

/// A request as the handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request line's path (`/v1/models`).
    pub path: String,
    /// The JSON body (`model`, `messages`, ...).
    pub body: Value,
    /// Headers, with lower-case names.
    pub headers: BTreeMap<String, String>,
}

impl Request {
    /// The text of message `i`, or "".
    pub fn message(&self, i: usize) -> &str {
        self.body["messages"][i]["content"].as_str().unwrap_or("")
    }

    /// Number of messages.
    pub fn turns(&self) -> usize {
        self.body["messages"].as_array().map_or(0, Vec::len)
    }
}

/// What the server sends back.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body as sent.
    pub body: String,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Reply {
    /// A 200 chat completion with `content` and a token usage block.
    pub fn content(content: &str) -> Self {
        let body = json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        });
        Self::raw(200, body.to_string())
    }

    /// Any status and body.
    pub fn raw(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    /// With a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// After a delay.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

fn handle(
    mut stream: TcpStream,
    handler: &(dyn Fn(&Request) -> Reply + Send + Sync),
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split(' ').nth(1).unwrap_or("").to_string();
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let request = Request {
        path,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        headers,
    };
    let reply = handler(&request);
    std::thread::sleep(reply.delay);
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reply.body.len()
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(reply.body.as_bytes())
}

/// Start a server answering with `handler`; returns its base URL
/// (`http://127.0.0.1:PORT/v1`). It runs until the process ends.
pub fn serve(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free local port");
    let url = format!(
        "http://{}/v1",
        listener.local_addr().expect("a bound address")
    );
    let handler: Arc<dyn Fn(&Request) -> Reply + Send + Sync> = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handler = handler.clone();
            std::thread::spawn(move || {
                let _ = handle(stream, handler.as_ref());
            });
        }
    });
    url
}
