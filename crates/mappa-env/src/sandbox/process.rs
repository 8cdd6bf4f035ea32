//! Starting, limiting, watching and killing one sandboxed Python process (Linux).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::files::{diff, snapshot, Snapshot};
use super::{
    landlock, FileChange, Isolation, Limits, RunResult, SandboxConfig, SandboxError, Status,
    PRIVATE_DIR,
};

/// Prepare this process to host runs: mark it non-dumpable, so that code
/// running under the same uid cannot read `/proc/<pid>/environ` (where API
/// keys live) or attach to it; and make it a child subreaper, so that the
/// orphans of a killed run become its children and are reaped by it (an
/// init that never reaps, common in containers, would otherwise keep them as
/// zombies, which count against the process limit).
pub(super) fn prepare_parent() {
    // SAFETY: plain prctls on the calling process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// (pid, parent pid, process group, real uid) of every process. The uid
/// comes from `/proc/<pid>/status`, not from the owner of `/proc/<pid>`:
/// a process that makes itself non-dumpable has its `/proc` entries owned
/// by root, and must not hide from the sweep that way.
fn process_table() -> Vec<(libc::pid_t, libc::pid_t, libc::pid_t, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: libc::pid_t = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))?
                    .split_whitespace()
                    .next()?
                    .parse::<i64>()
                    .ok()
            };
            let uid = u32::try_from(field("Uid:")?).ok()?;
            let ppid = field("PPid:")? as libc::pid_t;
            // The process group is in `status` since Linux 4.1 (first entry:
            // as this /proc sees it); older kernels have it only in `stat`.
            let pgrp = match field("NSpgid:") {
                Some(pgrp) => pgrp as libc::pid_t,
                None => {
                    let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
                    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(2);
                    fields.next()?.parse().ok()?
                }
            };
            Some((pid, ppid, pgrp, uid))
        })
        .collect()
}

/// Reap the run's processes that became our children once their parents
/// died, until none of the run's processes (group `pgid`, or `uid`) is left,
/// or two seconds pass.
fn reap_run(pgid: libc::pid_t, uid: Option<u32>) {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let run: Vec<_> = process_table()
            .into_iter()
            .filter(|&(_, _, pgrp, owner)| pgrp == pgid || Some(owner) == uid)
            .collect();
        if run.is_empty() || Instant::now() >= deadline {
            return;
        }
        for &(pid, ppid, _, _) in &run {
            if ppid == me {
                // SAFETY: `pid` is our child (reparented to us as subreaper).
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether the kernel lets us give a child its own network namespace, and
/// which `unshare` flags do it (probed once per process).
fn namespace_flags(python: &Path, root: bool) -> Option<libc::c_int> {
    static PROBE: OnceLock<Option<libc::c_int>> = OnceLock::new();
    *PROBE.get_or_init(|| {
        let flags = if root {
            libc::CLONE_NEWNET
        } else {
            libc::CLONE_NEWUSER | libc::CLONE_NEWNET
        };
        let mut cmd = Command::new(python);
        cmd.args(["-c", ""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: the closure only makes a system call.
        unsafe {
            cmd.pre_exec(move || cvt(libc::unshare(flags)));
        }
        let ok = match cmd.spawn() {
            Ok(mut child) => match wait_at_most(&mut child, HELPER_DEADLINE) {
                Some(status) => status.success(),
                None => {
                    eprintln!("warning: sandbox: the network-namespace probe was still running after {HELPER_DEADLINE:?} and was killed: runs go without a network namespace");
                    false
                }
            },
            Err(_) => false,
        };
        ok.then_some(flags)
    })
}

/// How long a helper child (the namespace probe, the uid sweep) may run:
/// each makes a few system calls, then execs or exits, so only a child
/// stuck before `exec` reaches it (a fork of a multi-threaded process under
/// `qemu-user` can be: docs/reproducibility.md#64-bit-arm).
const HELPER_DEADLINE: Duration = Duration::from_secs(30);

/// Waits for `child` for at most `limit`; past it, kills and reaps it and
/// returns `None`.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// The kernel's Landlock ABI, asked once per process; where there is none
/// (an old or configured-out kernel, or an emulator such as `qemu-aarch64`
/// that does not pass Landlock's system calls through) the sandbox says so
/// on stderr, once, and every run's `isolation` reports it.
fn landlock_abi() -> Option<u32> {
    static ABI: OnceLock<Option<u32>> = OnceLock::new();
    *ABI.get_or_init(|| {
        let abi = landlock::abi_version();
        if abi.is_none() {
            eprintln!(
                "warning: sandbox: Landlock is unavailable on this kernel (or emulator): agent code runs without it, so its writes are not confined to its working directory and TCP is blocked only by a network namespace where one can be made (each run's `isolation` says which)"
            );
        }
        abi
    })
}

/// A system call's result (an `int` or, from `syscall`, a `long`) as an
/// `io::Result`: negative is `errno`.
fn cvt(r: impl Into<libc::c_long>) -> io::Result<()> {
    if r.into() < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A uid reserved for one run (root only), held by an exclusive lock on a
/// file named after it, so that concurrent runs, in this process or another,
/// never share one.
struct UidLease {
    uid: u32,
    _lock: File,
}

const UID_RANGE: u32 = 4096;

fn lease_uid(base: u32) -> Result<UidLease, SandboxError> {
    let dir = std::env::temp_dir().join("mappa-sandbox-uids");
    std::fs::create_dir_all(&dir).map_err(|e| SandboxError::io(&dir, e))?;
    for uid in base..base.saturating_add(UID_RANGE) {
        let path = dir.join(uid.to_string());
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| SandboxError::io(&path, e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(UidLease { uid, _lock: file });
        }
    }
    Err(SandboxError::io(
        &dir,
        io::Error::other(format!(
            "all {UID_RANGE} sandbox uids from {base} are in use"
        )),
    ))
}

/// Kill every process running as `uid`, by forking a child that becomes
/// `uid` and signals everything it may (`kill(-1)` spares the caller).
/// Nothing is forked when no process of `uid` is alive: forking this
/// process (a trainer holding models) costs far more than reading `/proc`,
/// and a run that left nothing behind is the common case.
fn kill_uid(program: &Path, uid: u32) {
    if !process_table().iter().any(|&(_, _, _, owner)| owner == uid) {
        return;
    }
    let mut cmd = Command::new(program);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only system calls, then _exit: the child never returns to Rust code.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgid(uid) == 0 && libc::setuid(uid) == 0 {
                libc::kill(-1, libc::SIGKILL);
            }
            libc::_exit(0)
        });
    }
    if let Ok(mut child) = cmd.spawn() {
        if wait_at_most(&mut child, HELPER_DEADLINE).is_none() {
            eprintln!("warning: sandbox: the sweep of uid {uid}'s processes was still running after {HELPER_DEADLINE:?} and was killed");
        }
    }
}

/// Change the owner of `root` and everything beneath it (symlinks themselves,
/// not their targets).
fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), SandboxError> {
    std::os::unix::fs::lchown(root, Some(uid), Some(gid)).map_err(|e| SandboxError::io(root, e))?;
    if root
        .symlink_metadata()
        .map_err(|e| SandboxError::io(root, e))?
        .is_dir()
    {
        for entry in std::fs::read_dir(root).map_err(|e| SandboxError::io(root, e))? {
            let entry = entry.map_err(|e| SandboxError::io(root, e))?;
            chown_tree(&entry.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Check that an unprivileged `uid` can traverse every directory above `path`
/// and, when `exec`, read and execute `path` itself.
fn check_reachable(path: &Path, uid: u32, exec: bool) -> Result<(), SandboxError> {
    let real = path.canonicalize().map_err(|e| SandboxError::io(path, e))?;
    let unreachable = |reason: String| SandboxError::Unreachable {
        path: path.to_path_buf(),
        uid,
        reason,
    };
    for dir in real.ancestors().skip(1) {
        let meta = dir.metadata().map_err(|e| SandboxError::io(dir, e))?;
        if meta.uid() != uid && meta.mode() & 0o001 == 0 {
            return Err(unreachable(format!(
                "{} has mode {:o}",
                dir.display(),
                meta.mode() & 0o777
            )));
        }
    }
    if exec {
        let mode = real
            .metadata()
            .map_err(|e| SandboxError::io(&real, e))?
            .permissions()
            .mode();
        if mode & 0o005 != 0o005 {
            return Err(unreachable(format!(
                "{} has mode {:o}",
                real.display(),
                mode & 0o777
            )));
        }
    }
    Ok(())
}

/// Processes of the real uid now alive (for the process limit where neither
/// a uid of its own nor a user namespace is available).
fn processes_of_current_user() -> u64 {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    process_table().iter().filter(|p| p.3 == uid).count() as u64
}

/// Everything the child does between clone and exec, prepared in the parent
/// so that the child only makes system calls.
#[derive(Clone, Copy)]
struct ChildPlan {
    rlimits: [(libc::__rlimit_resource_t, libc::rlim_t, libc::rlim_t); 5],
    nproc: libc::rlim_t,
    unshare_flags: libc::c_int,
    /// Set `RLIMIT_NPROC` after `unshare`: in a new user namespace the count
    /// starts afresh, while the namespace's creator is still checked against
    /// its own (higher) limit.
    nproc_after_unshare: bool,
    drop_to: Option<u32>,
    landlock_fd: Option<libc::c_int>,
}

impl ChildPlan {
    /// # Safety
    /// Must run in a new child before exec: it changes the calling
    /// process's limits, namespaces and credentials. It makes only system
    /// calls (no allocation, no lock), so the child may share the parent's
    /// memory ([`spawn`]).
    unsafe fn apply(&self) -> io::Result<()> {
        unsafe {
            for &(resource, soft, hard) in &self.rlimits {
                cvt(libc::setrlimit(
                    resource,
                    &libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    },
                ))?;
            }
            let nproc = libc::rlimit {
                rlim_cur: self.nproc,
                rlim_max: self.nproc,
            };
            if !self.nproc_after_unshare {
                cvt(libc::setrlimit(libc::RLIMIT_NPROC, &nproc))?;
            }
            if self.unshare_flags != 0 {
                cvt(libc::unshare(self.unshare_flags))?;
            }
            if self.nproc_after_unshare {
                cvt(libc::setrlimit(libc::RLIMIT_NPROC, &nproc))?;
            }
            if let Some(uid) = self.drop_to {
                // Raw system calls: glibc's wrappers would also change the
                // credentials of every thread they know of, which in a child
                // sharing the parent's memory are the parent's threads.
                cvt(libc::syscall(
                    libc::SYS_setgroups,
                    0,
                    std::ptr::null::<libc::gid_t>(),
                ))?;
                cvt(libc::syscall(libc::SYS_setgid, uid))?;
                cvt(libc::syscall(libc::SYS_setuid, uid))?;
            }
            if let Some(fd) = self.landlock_fd {
                landlock::restrict_self(fd)?;
            }
            cvt(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
        }
        Ok(())
    }
}

/// Read a pipe to its end, keeping the first `cap` bytes; returns them and
/// the total byte count.
fn read_capped(mut pipe: impl Read, cap: usize) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    (kept, total)
}

/// `text` with every `workdir/` written as `./`.
fn relative_to(text: &str, workdir: &Path) -> String {
    text.replace(&format!("{}/", workdir.display()), "./")
}

/// Lossy UTF-8, with a marker when bytes were dropped.
fn render_output(kept: Vec<u8>, total: u64) -> (String, bool) {
    let truncated = total > kept.len() as u64;
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if truncated {
        text.push_str(&format!(
            "\n[mappa sandbox: output truncated: kept the first {} of {} bytes]\n",
            kept.len(),
            total
        ));
    }
    (text, truncated)
}

/// Environment of the program: nothing inherited.
fn environment(python: &Path, workdir: &Path, tmp: &Path) -> Vec<(&'static str, String)> {
    let bin = python
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let w = workdir.display().to_string();
    vec![
        ("PATH", format!("{bin}:/usr/local/bin:/usr/bin:/bin")),
        ("HOME", w.clone()),
        ("PYTHONPATH", w),
        ("TMPDIR", tmp.display().to_string()),
        ("MPLCONFIGDIR", tmp.display().to_string()),
        ("LANG", "C.UTF-8".into()),
        ("LC_ALL", "C.UTF-8".into()),
        ("PYTHONHASHSEED", "0".into()),
        ("PYTHONDONTWRITEBYTECODE", "1".into()),
        ("PYTHONUNBUFFERED", "1".into()),
        ("PYTHONIOENCODING", "utf-8".into()),
        ("MPLBACKEND", "Agg".into()),
        ("OPENBLAS_NUM_THREADS", "1".into()),
        ("OMP_NUM_THREADS", "1".into()),
        ("MKL_NUM_THREADS", "1".into()),
        ("NUMEXPR_NUM_THREADS", "1".into()),
    ]
}

/// Run `code` in `workdir` under `config`'s limits.
pub(super) fn run(
    config: &SandboxConfig,
    workdir: &Path,
    code: &str,
) -> Result<RunResult, SandboxError> {
    let limits = &config.limits;
    let dir = prepare_workdir(workdir, code)?;
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    // The lease is held (its lock file open) until this function returns.
    let (lease, owner) = hand_over_workdir(config, &dir.path, root)?;
    let uid = lease.as_ref().map(|l| l.uid);
    // `_ruleset` owns the Landlock descriptor that `plan` names by number: it
    // stays open until this function returns, long after the child applied it.
    let (plan, isolation, _ruleset) = plan_child(config, &dir.path, root, uid)?;
    let (child, start) = spawn(config, &dir, plan).map_err(SandboxError::Spawn)?;
    let pid = child.pid;
    let (rx_out, rx_err) = read_outputs(child.stdout, child.stderr, limits.max_output_bytes);

    let sweep = || sweep_run(pid, &config.python, uid);
    let ended = wait_run(pid, start + limits.wall_time, &sweep)?;
    let wall_time_s = start.elapsed().as_secs_f64();
    sweep();
    reap_run(pid, uid);
    let output = collect_output(rx_out, rx_err, &dir.path);

    if lease.is_some() {
        chown_tree(&dir.path, owner.uid(), owner.gid())?;
    }
    let after = snapshot(&dir.path)?;
    let files = diff(&dir.before, &after);
    Ok(run_result(
        limits,
        ended,
        output,
        wall_time_s,
        files,
        isolation,
    ))
}

/// A run's working directory, made ready for the program.
struct RunDir {
    /// The working directory, canonical.
    path: PathBuf,
    /// The program's temporary directory (inside [`PRIVATE_DIR`]).
    tmp: PathBuf,
    /// The working directory's files before the run.
    before: Snapshot,
}

/// Create the working directory and its private `tmp`, write the program to
/// `PRIVATE_DIR/main.py`, and snapshot the files.
fn prepare_workdir(workdir: &Path, code: &str) -> Result<RunDir, SandboxError> {
    std::fs::create_dir_all(workdir).map_err(|e| SandboxError::io(workdir, e))?;
    let workdir = workdir
        .canonicalize()
        .map_err(|e| SandboxError::io(workdir, e))?;
    let private = workdir.join(PRIVATE_DIR);
    let tmp = private.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| SandboxError::io(&tmp, e))?;
    let program = private.join("main.py");
    std::fs::write(&program, code).map_err(|e| SandboxError::io(&program, e))?;
    let before = snapshot(&workdir)?;
    Ok(RunDir {
        path: workdir,
        tmp,
        before,
    })
}

/// As root: lease a uid for the run, check that it can reach Python and the
/// working directory, kill what a crashed run left under it, and give it the
/// working directory. Returns the lease (`None` unless root) and the working
/// directory's metadata from before (its owner, to give it back to).
fn hand_over_workdir(
    config: &SandboxConfig,
    workdir: &Path,
    root: bool,
) -> Result<(Option<UidLease>, std::fs::Metadata), SandboxError> {
    let lease = if root {
        Some(lease_uid(config.uid_base)?)
    } else {
        None
    };
    let owner = workdir
        .metadata()
        .map_err(|e| SandboxError::io(workdir, e))?;
    if let Some(lease) = &lease {
        check_reachable(&config.python, lease.uid, true)?;
        check_reachable(workdir, lease.uid, false)?;
        kill_uid(&config.python, lease.uid); // leftovers of a crashed run
        chown_tree(workdir, lease.uid, lease.uid)?;
    }
    Ok((lease, owner))
}

/// A built Landlock ruleset: its descriptor and what it enforces.
type Ruleset = (OwnedFd, landlock::Coverage);

/// Decide the run's isolation (namespaces, Landlock, process-limit scope,
/// uid to drop to) and prepare the [`ChildPlan`] that applies it. Returns the
/// plan, the isolation report, and the built Landlock ruleset, whose
/// descriptor the plan names and the caller must keep open until the spawn.
fn plan_child(
    config: &SandboxConfig,
    workdir: &Path,
    root: bool,
    uid: Option<u32>,
) -> Result<(ChildPlan, Isolation, Option<Ruleset>), SandboxError> {
    let limits = &config.limits;
    let unshare_flags = namespace_flags(&config.python, root);
    let ruleset = match landlock_abi() {
        Some(abi) => Some(landlock::build(abi, workdir).map_err(|e| SandboxError::io(workdir, e))?),
        None => None,
    };
    let user_ns = unshare_flags.is_some_and(|f| f & libc::CLONE_NEWUSER != 0);
    let (nproc, scope) = if root {
        (limits.max_processes, "run-uid")
    } else if user_ns {
        (limits.max_processes, "user-namespace")
    } else {
        (processes_of_current_user() + limits.max_processes, "user")
    };
    let isolation = Isolation {
        network_namespace: unshare_flags.is_some(),
        tcp_blocked: ruleset.as_ref().is_some_and(|(_, c)| c.tcp_blocked),
        writes_confined: ruleset.as_ref().is_some_and(|(_, c)| c.writes_confined),
        uid,
        process_limit_scope: scope.to_string(),
    };
    let plan = ChildPlan {
        rlimits: rlimits(limits),
        nproc,
        unshare_flags: unshare_flags.unwrap_or(0),
        nproc_after_unshare: user_ns,
        drop_to: uid,
        landlock_fd: ruleset.as_ref().map(|(fd, _)| fd.as_raw_fd()),
    };
    Ok((plan, isolation, ruleset))
}

/// The resource limits the child sets (besides `RLIMIT_NPROC`), as
/// (resource, soft, hard).
fn rlimits(limits: &Limits) -> [(libc::__rlimit_resource_t, libc::rlim_t, libc::rlim_t); 5] {
    let mib = 1024 * 1024;
    [
        (libc::RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),
        (
            libc::RLIMIT_AS,
            limits.memory_mb * mib,
            limits.memory_mb * mib,
        ),
        (
            libc::RLIMIT_FSIZE,
            limits.max_file_mb * mib,
            limits.max_file_mb * mib,
        ),
        (libc::RLIMIT_CORE, 0, 0),
        (
            libc::RLIMIT_NOFILE,
            limits.max_open_files,
            limits.max_open_files,
        ),
    ]
}

/// A started run: its process and the read ends of its output pipes.
struct Spawned {
    pid: libc::pid_t,
    stdout: File,
    stderr: File,
}

/// Everything the new process needs between clone and exec, made in the
/// parent: the child only makes system calls on it.
struct Launch {
    program: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    /// Standard input, output and error, in that order.
    stdio: [libc::c_int; 3],
    /// Write end of a close-on-exec pipe: a failure before exec is written
    /// there as an errno, and success closes it.
    report: libc::c_int,
    plan: ChildPlan,
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors are new and owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The path to execute `program` by: absolute, searched in `path` (the
/// child's `PATH`) when it is a bare name, as a shell would.
fn resolve_program(program: &Path, path: &str) -> io::Result<PathBuf> {
    if program.components().count() > 1 || program.is_absolute() {
        return std::path::absolute(program);
    }
    path.split(':')
        // Only absolute directories: a relative one would be looked up here
        // and executed from the run's working directory.
        .filter(|dir| Path::new(dir).is_absolute())
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not on PATH ({path})", program.display()),
            )
        })
}

fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// The new process, from clone to exec (or `_exit` on failure).
///
/// # Safety
/// `arg` points to a [`Launch`] that outlives the call; the process shares
/// the parent's memory (which is suspended until exec), so this makes only
/// system calls.
extern "C" fn launch_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: as documented above.
    unsafe {
        let launch = &*(arg as *const Launch);
        let fail = |err: io::Error| -> ! {
            let errno = err.raw_os_error().unwrap_or(libc::EINVAL);
            libc::write(
                launch.report,
                (&errno as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>(),
            );
            libc::_exit(127)
        };
        // Handlers the parent installed must not run here, and every signal
        // the parent ignores (SIGPIPE, which Rust ignores; SIGHUP under
        // nohup) becomes default again: the program starts with no
        // disposition inherited from the trainer (std::process::Command
        // resets only SIGPIPE).
        for signal in 1..=libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        for (target, &fd) in launch.stdio.iter().enumerate() {
            if libc::dup2(fd, target as libc::c_int) < 0 {
                fail(io::Error::last_os_error());
            }
        }
        if libc::chdir(launch.cwd.as_ptr()) != 0 || libc::setpgid(0, 0) != 0 {
            fail(io::Error::last_os_error());
        }
        if let Err(err) = launch.plan.apply() {
            fail(err);
        }
        libc::execve(
            launch.program.as_ptr(),
            launch.argv.as_ptr(),
            launch.envp.as_ptr(),
        );
        fail(io::Error::last_os_error())
    }
}

/// Start Python on the program in its own process group, with a clean
/// environment, piped output, and `plan` applied before exec. Returns the
/// process and when it was started.
///
/// The process is made as `posix_spawn` makes one (`clone` with `CLONE_VM |
/// CLONE_VFORK`): a fork would copy the page tables of this process, which
/// holds models and optimiser state, only for exec to throw them away; at
/// thousands of short programs per run that was about a sixth of an RL
/// run's CPU time (`perf`). Dropping the uid in the child marks the memory
/// it shares with the trainer non-dumpable, which the trainer already is
/// ([`prepare_parent`]).
fn spawn(config: &SandboxConfig, dir: &RunDir, plan: ChildPlan) -> io::Result<(Spawned, Instant)> {
    let env = environment(&config.python, &dir.path, &dir.tmp);
    let path = env
        .iter()
        .find(|(k, _)| *k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    let program = resolve_program(&config.python, path)?;
    // Relative to the working directory, so that tracebacks do not show
    // where the run directory is (outputs stay the same wherever a run lives).
    let script = Path::new(PRIVATE_DIR).join("main.py");
    let args = [
        c_string(config.python.as_os_str().as_bytes())?,
        c_string(b"-s")?,
        c_string(script.as_os_str().as_bytes())?,
    ];
    let vars = env
        .iter()
        .map(|(k, v)| c_string(format!("{k}={v}").as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let null = File::open("/dev/null")?; // std opens files close-on-exec
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let (report_read, report_write) = pipe()?;
    let launch = Launch {
        program: c_string(program.as_os_str().as_bytes())?,
        argv: args
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect(),
        envp: vars
            .iter()
            .map(|v| v.as_ptr())
            .chain([std::ptr::null()])
            .collect(),
        cwd: c_string(dir.path.as_os_str().as_bytes())?,
        stdio: [
            null.as_raw_fd(),
            out_write.as_raw_fd(),
            err_write.as_raw_fd(),
        ],
        report: report_write.as_raw_fd(),
        plan,
    };
    let start = Instant::now();
    let pid = clone_child(&launch)?;
    drop((null, out_write, err_write, report_write));
    exec_report(File::from(report_read), pid)?;
    Ok((
        Spawned {
            pid,
            stdout: File::from(out_read),
            stderr: File::from(err_read),
        },
        start,
    ))
}

/// Start the child of `launch` as `posix_spawn` does (`clone` with
/// `CLONE_VM | CLONE_VFORK`, every signal blocked around it); returns once
/// it has exec'd or exited.
fn clone_child(launch: &Launch) -> io::Result<libc::pid_t> {
    let mut stack = vec![0u8; 256 * 1024];
    // SAFETY: the stack grows down from the end of a live buffer, aligned to
    // 16 bytes.
    let stack_top = unsafe {
        let end = stack.as_mut_ptr().add(stack.len());
        end.sub(end as usize % 16)
    };
    // SAFETY: no signal handler may run in the child before it resets them
    // (all signals are blocked around clone); the parent is suspended until
    // the child execs or exits (CLONE_VFORK), so `launch` and `stack` outlive
    // its use of them.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            launch_child,
            stack_top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (launch as *const Launch).cast_mut().cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        drop(stack);
        if pid < 0 {
            return Err(clone_error);
        }
        Ok(pid)
    }
}

/// The child's report pipe (its write end closed here): empty when it
/// exec'd; otherwise the errno it failed with before exec, after reaping it.
fn exec_report(mut report: File, pid: libc::pid_t) -> io::Result<()> {
    let mut errno = [0u8; std::mem::size_of::<libc::c_int>()];
    if let Ok(n @ 1..) = report.read(&mut errno) {
        // SAFETY: `pid` is our child, which failed before exec.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        let errno = if n == errno.len() {
            libc::c_int::from_ne_bytes(errno)
        } else {
            libc::EIO
        };
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(())
}

/// What a reader thread sends: the kept bytes of a pipe and its total length.
type Captured = mpsc::Receiver<(Vec<u8>, u64)>;

/// Read the child's stdout and stderr on two threads, each keeping the first
/// `cap` bytes; the receivers get them when the pipes close.
fn read_outputs(stdout: File, stderr: File, cap: usize) -> (Captured, Captured) {
    let (tx_out, rx_out) = mpsc::channel();
    let (tx_err, rx_err) = mpsc::channel();
    std::thread::spawn(move || tx_out.send(read_capped(stdout, cap)));
    std::thread::spawn(move || tx_err.send(read_capped(stderr, cap)));
    (rx_out, rx_err)
}

/// Kill the run's process group and, with a leased `uid`, every process
/// running as it.
fn sweep_run(pid: libc::pid_t, python: &Path, uid: Option<u32>) {
    // SAFETY: signalling the run's own process group.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    if let Some(uid) = uid {
        kill_uid(python, uid);
    }
}

/// How the run's main process ended.
struct Ended {
    /// The wall-time limit passed (and the run was swept).
    timed_out: bool,
    /// The status from `wait4`.
    wait_status: libc::c_int,
    /// The resources it used, from `wait4`.
    usage: libc::rusage,
}

/// Wait for the child `pid`, polling with a growing pause; past `deadline`,
/// `sweep` the run and wait without polling. A failed wait sweeps the run
/// and is an error.
fn wait_run(pid: libc::pid_t, deadline: Instant, sweep: &dyn Fn()) -> Result<Ended, SandboxError> {
    let mut timed_out = false;
    let mut wait_status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut pause = Duration::from_millis(1);
    loop {
        let flags = if timed_out { 0 } else { libc::WNOHANG };
        // SAFETY: pid is our child; the out-pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut wait_status, flags, &mut usage) };
        if r == pid {
            break;
        }
        if r < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            sweep();
            return Err(SandboxError::Spawn(err));
        }
        if Instant::now() >= deadline {
            timed_out = true;
            sweep();
            continue;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
    Ok(Ended {
        timed_out,
        wait_status,
        usage,
    })
}

/// The run's output, rendered for the report.
struct Output {
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

/// Collect what the reader threads captured and render it, with the working
/// directory written as `./`.
fn collect_output(rx_out: Captured, rx_err: Captured, workdir: &Path) -> Output {
    // Output ends when the last holder of the pipes dies; a process that left
    // the group (possible only without root) may hold them open, so wait a
    // bounded time and then report what arrived.
    let grace = Duration::from_secs(2);
    let (out_kept, out_total) = rx_out.recv_timeout(grace).unwrap_or_default();
    let (err_kept, err_total) = rx_err.recv_timeout(grace).unwrap_or_default();
    let (stdout, stdout_truncated) = render_output(out_kept, out_total);
    let (stderr, stderr_truncated) = render_output(err_kept, err_total);
    // Python names the program by its absolute path in tracebacks; show it
    // relative to the working directory, so that an output (what a coach
    // reads and a cache key hashes) does not depend on where the run lives.
    Output {
        stdout: relative_to(&stdout, workdir),
        stderr: relative_to(&stderr, workdir),
        stdout_truncated,
        stderr_truncated,
    }
}

/// The report of a finished run.
fn run_result(
    limits: &Limits,
    ended: Ended,
    output: Output,
    wall_time_s: f64,
    files: Vec<FileChange>,
    isolation: Isolation,
) -> RunResult {
    let Ended {
        timed_out,
        wait_status,
        usage,
    } = ended;
    let cpu_time_s = tv_secs(usage.ru_utime) + tv_secs(usage.ru_stime);
    let exited = libc::WIFEXITED(wait_status);
    let exit_code = exited.then(|| libc::WEXITSTATUS(wait_status));
    let signal = libc::WIFSIGNALED(wait_status).then(|| libc::WTERMSIG(wait_status));
    let status = classify(
        limits,
        timed_out,
        exit_code,
        signal,
        cpu_time_s,
        &output.stderr,
        output.stdout_truncated || output.stderr_truncated,
    );
    RunResult {
        status,
        exit_code,
        signal,
        stdout: output.stdout,
        stderr: output.stderr,
        stdout_truncated: output.stdout_truncated,
        stderr_truncated: output.stderr_truncated,
        wall_time_s,
        cpu_time_s,
        files,
        isolation,
    }
}

fn tv_secs(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6
}

/// The run's [`Status`] from how it ended.
fn classify(
    limits: &Limits,
    timed_out: bool,
    exit_code: Option<i32>,
    signal: Option<i32>,
    cpu_time_s: f64,
    stderr: &str,
    truncated: bool,
) -> Status {
    let cpu_limit = limits.cpu_time_s as f64;
    if timed_out
        || signal == Some(libc::SIGXCPU)
        || (signal == Some(libc::SIGKILL) && cpu_time_s >= cpu_limit)
    {
        return Status::Timeout;
    }
    if exit_code != Some(0)
        && (stderr.contains("MemoryError") || stderr.contains("Cannot allocate memory"))
    {
        return Status::Memory;
    }
    match (exit_code, signal) {
        (_, Some(_)) => Status::Killed,
        (Some(0), None) if truncated => Status::OutputTruncated,
        (Some(0), None) => Status::Ok,
        _ => Status::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_past_its_deadline_is_killed_and_reaped() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let started = Instant::now();
        assert_eq!(wait_at_most(&mut child, Duration::from_millis(50)), None);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(child.try_wait().unwrap().is_some(), "reaped");
    }

    #[test]
    fn a_helper_that_ends_in_time_gives_its_status() {
        let mut child = Command::new("true").spawn().unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(30)).unwrap();
        assert!(status.success());
    }
}
