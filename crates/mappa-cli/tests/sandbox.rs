//! `mappa sandbox run` as a user runs it, including a program that hunts for
//! the secrets in mappa's own environment.

use serde_json::Value;

mod common;
use common::*;

fn run_json(args: &[&str], envs: &[(&str, &str)]) -> Value {
    let out = mappa()
        .arg("sandbox")
        .arg("run")
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn prints_the_documented_result() {
    let dir = scratch();
    let program = dir.path().join("hello.py");
    std::fs::write(
        &program,
        "print(6 * 7)\nopen('result.txt', 'w').write('42')\n",
    )
    .unwrap();
    let work = dir.path().join("work");
    let result = run_json(
        &[
            program.to_str().unwrap(),
            "--workdir",
            work.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(result["status"], "ok");
    assert_eq!(result["exit_code"], 0);
    assert_eq!(result["stdout"], "42\n");
    assert_eq!(result["files"][0]["path"], "result.txt");
    assert_eq!(result["files"][0]["change"], "created");
    for key in [
        "stderr",
        "signal",
        "wall_time_s",
        "cpu_time_s",
        "isolation",
        "stdout_truncated",
    ] {
        assert!(result.get(key).is_some(), "missing {key}");
    }
    assert_eq!(
        std::fs::read_to_string(work.join("result.txt")).unwrap(),
        "42"
    );
}

#[test]
fn timeout_and_memory_flags_apply() {
    let dir = scratch();
    let spin = dir.path().join("spin.py");
    std::fs::write(&spin, "while True:\n    pass\n").unwrap();
    let result = run_json(&[spin.to_str().unwrap(), "--timeout", "1"], &[]);
    assert_eq!(result["status"], "timeout");
    let hog = dir.path().join("hog.py");
    std::fs::write(&hog, "x = bytearray(600 * 1024 ** 2)\n").unwrap();
    let result = run_json(&[hog.to_str().unwrap(), "--memory", "512"], &[]);
    assert_eq!(result["status"], "memory");
}

#[test]
fn secrets_in_mappas_environment_do_not_reach_the_program() {
    let dir = scratch();
    let program = dir.path().join("hunt.py");
    std::fs::write(
        &program,
        "\
import os
found = [k for k, v in os.environ.items() if 'hunter2' in v]
try:
    with open(f'/proc/{os.getppid()}/environ', 'rb') as f:
        if b'hunter2' in f.read():
            found.append('parent-environ')
except OSError as e:
    print('parent environ unreadable:', e.strerror)
print('FOUND' if found else 'clean', found)
",
    )
    .unwrap();
    let result = run_json(
        &[program.to_str().unwrap()],
        &[
            ("OPENAI_API_KEY", "sk-hunter2"),
            ("MAPPA_COACH_API_KEY", "hunter2"),
        ],
    );
    assert_eq!(result["status"], "ok", "{result}");
    let stdout = result["stdout"].as_str().unwrap();
    assert!(stdout.contains("clean"), "{stdout}");
    assert!(!stdout.contains("FOUND"), "{stdout}");
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let out = mappa()
        .args(["sandbox", "run", "/nonexistent/prog.py"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/prog.py"), "{stderr}");
}
