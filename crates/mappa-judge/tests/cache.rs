//! The SQLite cache under concurrent writers (threads and processes) and a
//! `kill -9` in the middle of writing.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use mappa_judge::cache::{CacheMode, CoachCache};
use mappa_judge::ActionScore;

fn score(i: usize, writer: &str) -> ActionScore {
    ActionScore {
        score: (i % 11) as f64,
        rationale: format!("{writer} entry {i}"),
        fallback: false,
        fallback_reason: None,
        answer_correct: None,
        raw_response: format!("{} PROCESS_SCORE: {}", "x".repeat(2000), i % 11),
        coach: "test".into(),
        template_sha256: "t".into(),
        cached: false,
        audit: None,
    }
}

fn write_entries(path: &Path, writer: &str, count: usize) {
    let cache = CoachCache::open(path, CacheMode::ReadWrite).unwrap();
    for i in 0..count {
        cache
            .put(&format!("{writer}-{i}"), "m", "t", &score(i, writer))
            .unwrap();
    }
}

/// Run as a child process by the tests below (does nothing otherwise).
#[test]
fn cache_writer_child() {
    let (Ok(path), Ok(writer), Ok(count)) = (
        std::env::var("MAPPA_CACHE_CHILD_PATH"),
        std::env::var("MAPPA_CACHE_CHILD_WRITER"),
        std::env::var("MAPPA_CACHE_CHILD_COUNT"),
    ) else {
        return;
    };
    write_entries(Path::new(&path), &writer, count.parse().unwrap());
}

fn child(path: &Path, writer: &str, count: usize) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cache_writer_child", "--test-threads=1"])
        .env("MAPPA_CACHE_CHILD_PATH", path)
        .env("MAPPA_CACHE_CHILD_WRITER", writer)
        .env("MAPPA_CACHE_CHILD_COUNT", count.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn concurrent_writers_in_threads_and_processes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.sqlite");
    CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
    let mut a = child(&path, "proc-a", 300);
    let mut b = child(&path, "proc-b", 300);
    std::thread::scope(|s| {
        for t in 0..4 {
            let path = &path;
            s.spawn(move || write_entries(path, &format!("thread-{t}"), 100));
        }
    });
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let cache = CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
    assert_eq!(cache.len().unwrap(), 1000);
    assert_eq!(cache.integrity_check().unwrap(), "ok");
    assert_eq!(
        cache.get("proc-b-299").unwrap().unwrap(),
        score(299, "proc-b")
    );
    assert_eq!(
        cache.get("thread-3-99").unwrap().unwrap(),
        score(99, "thread-3")
    );
}

#[test]
fn a_kill_9_mid_write_leaves_a_sound_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.sqlite");
    CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
    let mut victim = child(&path, "victim", 1_000_000);
    // Let it write for a while, then kill it without warning.
    let cache = CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cache.len().unwrap() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the child wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    drop(cache);

    let cache = CoachCache::open(&path, CacheMode::ReadWrite).unwrap();
    assert_eq!(cache.integrity_check().unwrap(), "ok");
    let n = cache.len().unwrap() as usize;
    assert!(n >= 200);
    // Every committed entry is whole, and the cache still takes writes.
    for i in 0..n {
        assert_eq!(
            cache.get(&format!("victim-{i}")).unwrap().unwrap(),
            score(i, "victim"),
            "entry {i} of {n}"
        );
    }
    cache.put("after", "m", "t", &score(1, "after")).unwrap();
    assert_eq!(cache.len().unwrap() as usize, n + 1);
}
