//! Workspace-level scenario tests live beside this file, one `[[test]]` per
//! scenario (see `Cargo.toml`). This library locates shared fixtures and
//! holds the fake OpenAI-compatible judge several scenarios run against.

#![warn(missing_docs)]

use std::path::PathBuf;

/// The repository's `fixtures/` directory.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// The fake judge's reply to `request`: `PROCESS_SCORE` is the length of
/// the request body modulo 11, so two runs that ask the same questions get
/// the same answers.
pub fn fake_judge_reply(request: &mappa_judge::testing::Request) -> mappa_judge::testing::Reply {
    let length = request.body.to_string().len();
    mappa_judge::testing::Reply::content(&format!(
        "Judged.\nPROCESS_SCORE: {}\nANSWER_CORRECT: 0",
        length % 11
    ))
}

/// An HTTP coach at `base_url` named `fake-judge`, without a key, with a
/// retry budget of two attempts 10 ms apart.
pub fn fake_judge_config(base_url: String) -> mappa_judge::config::Judge {
    mappa_judge::config::Judge::OpenAi(mappa_judge::openai::OpenAiConfig {
        base_url,
        model: "fake-judge".into(),
        api_key_env: None,
        timeout_s: 10.0,
        max_attempts: 2,
        initial_backoff_s: 0.01,
        max_backoff_s: 0.05,
        requests_per_minute: None,
        usd_per_million_prompt_tokens: 0.0,
        usd_per_million_completion_tokens: 0.0,
        seed: 0,
    })
}
