//! Hostile and ordinary programs in the Python sandbox: each hostile one must
//! be contained, get the right status, and leave the host healthy.
//!
//! The interpreter is the one `just setup-python` makes (see
//! `mappa_env::sandbox::find_python`).

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mappa_env::sandbox::{find_python, FileChangeKind, RunResult, Sandbox, SandboxConfig, Status};

fn config() -> SandboxConfig {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python =
        find_python(Some(&workspace)).expect("a sandbox interpreter: run `just setup-python`");
    let mut config = SandboxConfig::with_python(python);
    // Tests take uids (when run as root) apart from the default range used by real runs.
    config.uid_base = 1_960_100_000;
    config.limits.wall_time = Duration::from_secs(10);
    config.limits.cpu_time_s = 10;
    config
}

/// A scratch directory the sandbox's unprivileged uid (when tests run as
/// root) can traverse, and a working directory inside it.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = mappa_env::sandbox::scratch_dir().unwrap();
    let work = dir.path().join("work");
    (dir, work)
}

/// Processes still alive that belong to the run (its uid, when it had one),
/// by the real uid in `/proc/<pid>/status` (a non-dumpable process's
/// `/proc` entries are owned by root).
fn survivors(result: &RunResult) -> usize {
    let Some(uid) = result.isolation.uid else {
        return 0;
    };
    let real_uid = |pid: &std::path::Path| -> Option<u32> {
        let status = std::fs::read_to_string(pid.join("status")).ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
        line.split_whitespace().next()?.parse().ok()
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| real_uid(&e.path()) == Some(uid))
        .count()
}

fn host_is_healthy() {
    let status = std::process::Command::new("true")
        .status()
        .expect("the host can still start processes");
    assert!(status.success());
}

fn run_with(config: SandboxConfig, code: &str) -> (RunResult, tempfile::TempDir, PathBuf) {
    let (dir, work) = scratch();
    let sandbox = Sandbox::new(config).unwrap();
    let result = sandbox.run(&work, code).unwrap();
    (result, dir, work)
}

#[test]
fn ordinary_program_runs_and_reports_its_files() {
    let (result, _dir, work) = run_with(
        config(),
        "import os\nprint('hello from', os.getcwd())\nopen('answer.txt', 'w').write('42')\n",
    );
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(result.exit_code, Some(0));
    assert!(result.stdout.starts_with("hello from"), "{}", result.stdout);
    assert_eq!(result.files.len(), 1);
    assert_eq!(result.files[0].path, "answer.txt");
    assert_eq!(result.files[0].change, FileChangeKind::Created);
    assert_eq!(
        std::fs::read_to_string(work.join("answer.txt")).unwrap(),
        "42"
    );
}

#[test]
fn files_persist_across_actions_of_a_trajectory() {
    let (_dir, work) = scratch();
    let sandbox = Sandbox::new(config()).unwrap();
    let first = sandbox
        .run(&work, "open('state.txt', 'w').write('1')")
        .unwrap();
    assert_eq!(first.files[0].change, FileChangeKind::Created);
    let second = sandbox
        .run(&work, "n = int(open('state.txt').read())\nopen('state.txt', 'w').write(str(n + 10))\nprint(n)")
        .unwrap();
    assert_eq!(second.status, Status::Ok, "{second:?}");
    assert_eq!(second.stdout.trim(), "1");
    assert_eq!(second.files[0].path, "state.txt");
    assert_eq!(second.files[0].change, FileChangeKind::Modified);
    assert_eq!(
        std::fs::read_to_string(work.join("state.txt")).unwrap(),
        "11"
    );
}

#[test]
fn exceptions_are_errors_with_the_traceback() {
    let (result, _dir, _work) = run_with(config(), "raise ValueError('bad model')");
    assert_eq!(result.status, Status::Error);
    assert_eq!(result.exit_code, Some(1));
    assert!(
        result.stderr.contains("ValueError: bad model"),
        "{}",
        result.stderr
    );
}

#[test]
fn outputs_do_not_name_where_the_run_lives() {
    // Python puts the program's absolute path in a syntax error; the
    // sandbox shows it relative to the working directory.
    let (result, _dir, work) = run_with(config(), "print((1)");
    assert_eq!(result.status, Status::Error);
    assert!(result.stderr.contains("SyntaxError"), "{}", result.stderr);
    assert!(
        result.stderr.contains("./.mappa/main.py"),
        "{}",
        result.stderr
    );
    let canonical = work.canonicalize().unwrap();
    assert!(
        !result.stderr.contains(&*canonical.to_string_lossy()),
        "{}",
        result.stderr
    );
}

#[test]
fn infinite_loop_times_out_and_is_killed() {
    let mut config = config();
    config.limits.wall_time = Duration::from_secs(2);
    let start = Instant::now();
    let (result, _dir, _work) = run_with(config, "while True:\n    pass\n");
    assert_eq!(result.status, Status::Timeout, "{result:?}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(survivors(&result), 0);
    host_is_healthy();
}

#[test]
fn cpu_limit_stops_a_busy_program_before_the_wall_clock() {
    let mut config = config();
    config.limits.cpu_time_s = 1;
    config.limits.wall_time = Duration::from_secs(30);
    let (result, _dir, _work) = run_with(config, "while True:\n    pass\n");
    assert_eq!(result.status, Status::Timeout, "{result:?}");
    assert!(result.wall_time_s < 10.0, "{result:?}");
    // The kernel enforces RLIMIT_CPU at tick granularity, on its own clock.
    assert!(result.cpu_time_s >= 0.5, "{result:?}");
    assert_eq!(result.signal, Some(libc::SIGXCPU), "{result:?}");
}

/// A program that makes itself non-dumpable (so that `/proc` shows its
/// entries as root's) and leaves a daemon in a session of its own is still
/// swept: nothing of the run's uid survives it.
#[test]
fn a_hidden_daemon_does_not_outlive_its_run() {
    let code = "import ctypes, os, time\n\
                libc = ctypes.CDLL(None)\n\
                PR_SET_DUMPABLE = 4\n\
                libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)\n\
                if os.fork() == 0:\n    \
                    os.setsid()\n    \
                    if os.fork() == 0:\n        \
                        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)\n        \
                        time.sleep(30)\n    \
                    os._exit(0)\n\
                time.sleep(0.5)\n\
                print('left a daemon')\n";
    let (result, _dir, _work) = run_with(config(), code);
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(survivors(&result), 0, "{result:?}");
    host_is_healthy();
}

#[test]
fn fork_bomb_is_bounded_and_cleaned_up() {
    let mut config = config();
    config.limits.wall_time = Duration::from_secs(3);
    config.limits.max_processes = 16;
    let code =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    let (result, _dir, _work) = run_with(config, code);
    assert_eq!(result.status, Status::Timeout, "{result:?}");
    assert_eq!(survivors(&result), 0);
    host_is_healthy();
}

#[test]
fn process_limit_refuses_extra_processes() {
    let mut config = config();
    config.limits.max_processes = 4;
    let code = "\
import os, time
kids, refused = [], 0
for _ in range(12):
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
print(len(kids), refused)
";
    let (result, _dir, _work) = run_with(config, code);
    assert_eq!(result.status, Status::Ok, "{result:?}");
    let counts: Vec<usize> = result
        .stdout
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        counts[0] <= 3,
        "{} children started with a limit of 4 processes",
        counts[0]
    );
    assert!(counts[1] >= 9, "{result:?}");
    assert_eq!(
        survivors(&result),
        0,
        "sleeping children are killed when the run ends"
    );
}

#[test]
fn ten_gigabyte_allocation_is_a_memory_error() {
    let (result, _dir, _work) =
        run_with(config(), "x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n");
    assert_eq!(result.status, Status::Memory, "{result:?}");
    host_is_healthy();
}

#[test]
fn hundred_megabytes_of_stdout_are_truncated_with_a_marker() {
    let code = "import sys\nblock = 'x' * (1024 * 1024)\nfor _ in range(100):\n    sys.stdout.write(block)\n";
    let (result, _dir, _work) = run_with(config(), code);
    assert_eq!(
        result.status,
        Status::OutputTruncated,
        "status {:?}",
        result.status
    );
    assert!(result.stdout_truncated);
    assert!(
        result.stdout.len() < 70 * 1024,
        "kept {} bytes",
        result.stdout.len()
    );
    assert!(
        result
            .stdout
            .contains("output truncated: kept the first 65536 of 104857600 bytes"),
        "{}",
        &result.stdout[result.stdout.len() - 200..]
    );
}

#[test]
fn writing_outside_the_working_directory_fails() {
    let code = "open('../escape', 'w').write('out')\n";
    let (result, dir, _work) = run_with(config(), code);
    assert_eq!(result.status, Status::Error, "{result:?}");
    assert!(
        result.stderr.contains("Permission denied"),
        "{}",
        result.stderr
    );
    assert!(!dir.path().join("escape").exists());
    // Nor in a world-writable place such as /tmp (Landlock, where available).
    let target = std::env::temp_dir().join(format!("mappa-escape-{}", std::process::id()));
    let code = format!(
        "open({:?}, 'w').write('out')\n",
        target.display().to_string()
    );
    let (result, _dir, _work) = run_with(config(), &code);
    if result.isolation.writes_confined {
        assert_eq!(result.status, Status::Error, "{result:?}");
        assert!(!target.exists());
    }
    let _ = std::fs::remove_file(&target);
}

#[test]
fn no_connection_reaches_a_socket_on_localhost() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'leak')\nprint('connected')\n"
    );
    let (result, _dir, _work) = run_with(config(), &code);
    assert!(
        result.isolation.network_namespace || result.isolation.tcp_blocked,
        "{:?}",
        result.isolation
    );
    assert_eq!(result.status, Status::Error, "{result:?}");
    assert!(!result.stdout.contains("connected"));
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the sandbox reached the host's socket: {other:?}"),
    }
}

#[test]
fn stdin_is_closed() {
    let (result, _dir, _work) = run_with(config(), "import sys\nprint(repr(sys.stdin.read()))\n");
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(result.stdout.trim(), "''");
}

#[test]
fn no_signal_is_blocked_in_the_program() {
    // The sandbox blocks every signal around starting the process; the
    // program must get an empty mask, or it could not be interrupted.
    let code = "import signal\nprint(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n";
    let (result, _dir, _work) = run_with(config(), code);
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(result.stdout.trim(), "[]");
}

#[test]
fn an_interpreter_that_cannot_start_is_a_clear_error() {
    // Executable, reachable, but its own interpreter does not exist: exec
    // fails in the new process, after every check the parent makes.
    let (dir, work) = scratch();
    let broken = dir.path().join("python3");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut config = config();
    config.python = broken;
    let sandbox = Sandbox::new(config).unwrap();
    let err = sandbox.run(&work, "print(1)\n").unwrap_err().to_string();
    assert!(err.contains("No such file"), "{err}");
    host_is_healthy();
}

#[test]
fn worker_cap_bounds_concurrent_runs() {
    let mut config = config();
    config.max_workers = 2;
    let sandbox = Sandbox::new(config).unwrap();
    let dirs: Vec<_> = (0..4).map(|_| scratch()).collect();
    let code = "import time\nstart = time.time()\ntime.sleep(0.5)\nprint(start, time.time())\n";
    let results: Vec<RunResult> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .map(|(_, work)| s.spawn(|| sandbox.run(work, code).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let spans: Vec<(f64, f64)> = results
        .iter()
        .map(|r| {
            let v: Vec<f64> = r
                .stdout
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            (v[0], v[1])
        })
        .collect();
    for &(start, _) in &spans {
        let overlapping = spans
            .iter()
            .filter(|&&(s, e)| s <= start && start < e)
            .count();
        assert!(
            overlapping <= 2,
            "{overlapping} runs at once with a cap of 2: {spans:?}"
        );
    }
}

#[test]
fn data_analysis_stack_is_available() {
    let code = "\
import numpy as np, pandas as pd
from sklearn.linear_model import LogisticRegression
rng = np.random.default_rng(0)
x = rng.normal(size=(200, 3))
y = (x[:, 0] + 0.1 * rng.normal(size=200) > 0).astype(int)
df = pd.DataFrame(x, columns=['a', 'b', 'c'])
model = LogisticRegression().fit(df, y)
df.assign(pred=model.predict(df)).to_csv('predictions.csv', index=False)
print(round(model.score(df, y), 2))
";
    let (result, _dir, work) = run_with(config(), code);
    assert_eq!(result.status, Status::Ok, "{}", result.stderr);
    assert!(result.stdout.trim().parse::<f64>().unwrap() > 0.9);
    assert!(work.join("predictions.csv").exists());
}
