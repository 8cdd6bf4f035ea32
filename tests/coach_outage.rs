//! A training run whose HTTP coach goes away for longer than its retry
//! budget, then comes back.
//!
//! Both runs use `fixtures/manifests/tiny-arith.toml` (three steps of 2 x 2
//! trajectories, untrained random fixture models: machinery only) with a
//! fake OpenAI-compatible judge whose score is a function of the request, so
//! any two runs that ask the same questions get the same answers. The judge
//! answers 503 from its `outage_from`-th request on, until it is back.
//!
//! - `on_outage = "stop"` (the default): the run stops at the step whose
//!   coach batch could not be scored, with an error that says so and what to
//!   do; resumed (`--resume`) once the coach is back, it ends with metrics
//!   and trajectories equal to those of a run that was never interrupted.
//! - `on_outage = "wait"`: the run asks again every `outage_poll_s` seconds
//!   and, once the coach is back, goes on; its records equal the
//!   uninterrupted run's.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use mappa_judge::cache::CacheMode;
use mappa_judge::config::Judge;
use mappa_judge::llm::OnOutage;
use mappa_judge::testing::{serve, Reply};
use mappa_tests::{fake_judge_config, fake_judge_reply, fixtures};
use mappa_train::manifest::Manifest;
use mappa_train::run::{run, RunOptions};
use mappa_train::TrainError;

type B = Autodiff<mappa_model::backend::Cpu>;

/// When the fake judge is down.
#[derive(Default)]
struct Outage {
    /// Requests received so far.
    requests: AtomicUsize,
    /// The first request answered with 503 (`usize::MAX`: never).
    from: AtomicUsize,
    /// When the outage began.
    began: Mutex<Option<Instant>>,
    /// How long it lasts (`None`: until `back` is set).
    lasts: Option<Duration>,
    /// Set by the test: the judge is back.
    back: AtomicBool,
    /// 503 replies sent.
    refused: AtomicUsize,
}

impl Outage {
    fn new(from: usize, lasts: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            from: AtomicUsize::new(from),
            lasts,
            ..Default::default()
        })
    }

    fn is_down(&self) -> bool {
        let n = self.requests.fetch_add(1, Ordering::SeqCst);
        if n < self.from.load(Ordering::SeqCst) || self.back.load(Ordering::SeqCst) {
            return false;
        }
        let mut began = self.began.lock().unwrap();
        let began = *began.get_or_insert_with(Instant::now);
        self.lasts.is_none_or(|d| began.elapsed() < d)
    }
}

/// The fake judge (`mappa_tests::fake_judge_reply`), answering 503 while down.
fn judge(outage: Arc<Outage>) -> Judge {
    let base_url = serve(move |request| {
        if outage.is_down() {
            outage.refused.fetch_add(1, Ordering::SeqCst);
            return Reply::raw(503, "{\"error\": \"the judge is down\"}");
        }
        fake_judge_reply(request)
    });
    fake_judge_config(base_url)
}

/// The tiny manifest with `judge` and a fresh read-write cache in `dir`.
fn manifest(dir: &Path, judge: Judge) -> Manifest {
    let mut manifest = Manifest::load(&fixtures().join("manifests/tiny-arith.toml")).unwrap();
    manifest.coach.cache = Some(dir.join("coach-cache.sqlite"));
    manifest.coach.cache_mode = CacheMode::ReadWrite;
    manifest.coach.judge = judge;
    manifest
}

/// `metrics.jsonl` and `trajectories.jsonl` of a run directory.
fn records(dir: &Path) -> (String, String) {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    (read("metrics.jsonl"), read("trajectories.jsonl"))
}

/// An uninterrupted run's records, and the number of coach requests it made.
fn uninterrupted(scratch: &Path) -> ((String, String), usize) {
    let outage = Outage::new(usize::MAX, None);
    let dir = scratch.join("uninterrupted");
    run::<B>(
        &manifest(&dir, judge(outage.clone())),
        &dir.join("run"),
        &RunOptions::default(),
        &Default::default(),
    )
    .unwrap();
    (
        records(&dir.join("run")),
        outage.requests.load(Ordering::SeqCst),
    )
}

#[test]
fn a_run_stops_when_its_coach_is_gone_and_resumes_to_the_same_records() {
    let scratch = mappa_env::sandbox::scratch_dir().unwrap();
    let (expected, requests) = uninterrupted(scratch.path());
    let outage = Outage::new(requests / 2, None);
    let dir = scratch.path().join("interrupted");
    let manifest = manifest(&dir, judge(outage.clone()));
    let run_dir = dir.join("run");
    let e = run::<B>(
        &manifest,
        &run_dir,
        &RunOptions::default(),
        &Default::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            &e,
            TrainError::Coach(mappa_judge::CoachError::Unavailable { .. })
        ),
        "{e}"
    );
    let message = e.to_string();
    assert!(
        message.contains("did not answer") && message.contains("--resume"),
        "{message}"
    );
    assert!(outage.refused.load(Ordering::SeqCst) > 0);

    outage.back.store(true, Ordering::SeqCst);
    run::<B>(
        &manifest,
        &run_dir,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
        &Default::default(),
    )
    .unwrap();
    assert!(records(&run_dir) == expected, "resumed records differ");
}

#[test]
fn a_run_waits_for_its_coach_and_goes_on_with_nothing_lost() {
    let scratch = mappa_env::sandbox::scratch_dir().unwrap();
    let (expected, requests) = uninterrupted(scratch.path());
    // Down for 1.5 s: far longer than the retry budget (two attempts, 10 ms apart).
    let outage = Outage::new(requests / 2, Some(Duration::from_millis(1500)));
    let dir = scratch.path().join("waiting");
    let mut manifest = manifest(&dir, judge(outage.clone()));
    let settings = &mut manifest.coach.settings;
    settings.on_outage = OnOutage::Wait;
    settings.outage_poll_s = 0.3;
    settings.max_outage_wait_s = 60.0;
    run::<B>(
        &manifest,
        &dir.join("run"),
        &RunOptions::default(),
        &Default::default(),
    )
    .unwrap();
    assert!(
        outage.refused.load(Ordering::SeqCst) > 0,
        "the judge was down"
    );
    assert!(records(&dir.join("run")) == expected, "records differ");
}
