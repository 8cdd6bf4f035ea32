//! `mappa sandbox run FILE.py`: run one Python program in the sandbox and
//! print its result (status, output, exit code, time used, files changed and
//! the protections in force) as JSON.

use anyhow::anyhow;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use mappa_env::sandbox::{find_python, Sandbox, SandboxConfig};

/// Subcommands of `mappa sandbox`.
#[derive(Subcommand, Debug)]
pub enum SandboxCommand {
    /// Run one Python program under the sandbox's limits and print the result as JSON.
    Run(RunArgs),
}

/// Arguments of `mappa sandbox run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The Python program.
    file: PathBuf,
    /// Working directory (created if missing; kept). Default: a fresh temporary directory, removed afterwards.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Wall-clock and CPU-time limit, in seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Address-space limit, in MiB.
    #[arg(long, default_value_t = 4096)]
    memory: u64,
    /// Python interpreter. Default: $MAPPA_SANDBOX_PYTHON, $MAPPA_SANDBOX_VENV/bin/python,
    /// .venv-sandbox/bin/python here or above, then python3 on PATH.
    #[arg(long)]
    python: Option<PathBuf>,
}

/// Runs `mappa sandbox ...`.
pub fn run(command: &SandboxCommand) -> anyhow::Result<()> {
    match command {
        SandboxCommand::Run(args) => run_file(args),
    }
}

fn run_file(args: &RunArgs) -> anyhow::Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(anyhow!(
            "--timeout {}: expected a positive number of seconds",
            args.timeout
        ));
    }
    if args.memory == 0 {
        return Err(anyhow!("--memory 0: expected a positive number of MiB"));
    }
    let code =
        std::fs::read_to_string(&args.file).map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let python = match &args.python {
        Some(p) => p.clone(),
        None => find_python(None)?,
    };
    let mut config = SandboxConfig::with_python(python);
    config.limits.wall_time = Duration::from_secs_f64(args.timeout);
    config.limits.cpu_time_s = args.timeout.ceil() as u64;
    config.limits.memory_mb = args.memory;
    let sandbox = Sandbox::new(config)?;

    // A temporary directory must be traversable by the unprivileged uid a run
    // takes when mappa runs as root.
    let temp;
    let workdir = match &args.workdir {
        Some(dir) => dir.clone(),
        None => {
            temp = mappa_env::sandbox::scratch_dir()?;
            temp.path().join("work")
        }
    };
    let result = sandbox.run(&workdir, &code)?;
    let json = serde_json::to_string_pretty(&result)?;
    println!("{json}");
    Ok(())
}
