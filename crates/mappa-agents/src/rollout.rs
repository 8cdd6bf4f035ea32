//! The rollout engine: runs a workflow on a batch of tasks. Agents go in
//! order; for each agent, every trajectory's action of the same turn is
//! generated in one policy batch, and the Python tool runs concurrently
//! across trajectories (bounded by the sandbox's worker cap).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mappa_env::sandbox::workspace::{FilePatterns, TrajectoryWorkspace};
use mappa_env::sandbox::{FileChangeKind, RunResult, Sandbox, Status, PRIVATE_DIR};

use crate::policy::{Message, Policy, PolicyOutput, PolicyRequest};
use crate::trajectory::{ActionRecord, TaskInput, Trajectory};
use crate::workflow::{render_program, render_prompt, AgentSpec, Tool, Upstream, Workflow};
use crate::AgentError;

/// Whether an agent with a tool acts again: not when its required files
/// exist (with `stop_when_files_exist`) or it wrote no code (with
/// `stop_when_no_code`).
fn continues(agent: &AgentSpec, dir: &Path, wrote_code: bool) -> bool {
    let files_done =
        agent.stop_when_files_exist && agent.required_files.iter().all(|f| dir.join(f).exists());
    let no_code = agent.stop_when_no_code && !wrote_code;
    agent.tool == Tool::Python && !files_done && !no_code
}

/// Tool outputs shown to agents are cut to this many characters.
pub const MAX_OBSERVATION_CHARS: usize = 4000;

/// Runs a workflow.
pub struct RolloutEngine<'a> {
    workflow: &'a Workflow,
    policies: Vec<&'a dyn Policy>,
    sandbox: &'a Sandbox,
    work_root: PathBuf,
}

/// A trajectory in progress.
struct Running {
    task: usize,
    sample: usize,
    workspace: TrajectoryWorkspace,
    upstream: BTreeMap<String, Upstream>,
    saved: BTreeSet<String>,
    actions: Vec<ActionRecord>,
}

impl<'a> RolloutEngine<'a> {
    /// An engine with one policy per agent (in workflow order); working
    /// directories go under `work_root/<task id>/s<sample>/<role>/`.
    pub fn new(
        workflow: &'a Workflow,
        policies: Vec<&'a dyn Policy>,
        sandbox: &'a Sandbox,
        work_root: impl Into<PathBuf>,
    ) -> Result<Self, AgentError> {
        if policies.len() != workflow.agents.len() {
            return Err(AgentError::Workflow(format!(
                "workflow {} has {} agents but {} policies were given",
                workflow.name,
                workflow.agents.len(),
                policies.len()
            )));
        }
        Ok(Self {
            workflow,
            policies,
            sandbox,
            work_root: work_root.into(),
        })
    }

    /// Run `samples` trajectories of every task.
    pub fn run(&self, tasks: &[TaskInput], samples: usize) -> Result<Vec<Trajectory>, AgentError> {
        self.run_with(tasks, samples, &mut |_, _| {})
    }

    /// [`Self::run`], calling `on_agent_done(agent, actions)` as soon as an
    /// agent has finished in every trajectory, with that agent's actions per
    /// trajectory (trajectory index in the returned order: task by task,
    /// `samples` each). A caller can coach them while the next agent generates.
    pub fn run_with(
        &self,
        tasks: &[TaskInput],
        samples: usize,
        on_agent_done: &mut dyn FnMut(usize, Vec<(usize, Vec<ActionRecord>)>),
    ) -> Result<Vec<Trajectory>, AgentError> {
        let mut running = Vec::new();
        for (t, task) in tasks.iter().enumerate() {
            for sample in 0..samples {
                let root = self.work_root.join(&task.id).join(format!("s{sample}"));
                let workspace = TrajectoryWorkspace::create(root).map_err(AgentError::Sandbox)?;
                running.push(Running {
                    task: t,
                    sample,
                    workspace,
                    upstream: BTreeMap::new(),
                    saved: BTreeSet::new(),
                    actions: Vec::new(),
                });
            }
        }
        for (k, agent) in self.workflow.agents.iter().enumerate() {
            self.run_agent(k, agent, tasks, &mut running)?;
            let done = running
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    (
                        i,
                        r.actions.iter().filter(|a| a.agent == k).cloned().collect(),
                    )
                })
                .collect();
            on_agent_done(k, done);
        }
        let last = &self.workflow.final_answer_from;
        Ok(running
            .into_iter()
            .map(|r| Trajectory {
                task_id: tasks[r.task].id.clone(),
                group: tasks[r.task].group,
                sample: r.sample,
                final_output: r.upstream.get(last).map(|u| u.output.clone()),
                actions: r.actions,
                workdir: r.workspace.root().to_path_buf(),
            })
            .collect())
    }

    /// Hand the previous agent's files over (the task's inputs, for the
    /// first agent), then each trajectory's first conversation.
    fn first_prompts(
        &self,
        k: usize,
        agent: &AgentSpec,
        tasks: &[TaskInput],
        running: &mut [Running],
    ) -> Result<Vec<Vec<Message>>, AgentError> {
        let mut conversations = Vec::with_capacity(running.len());
        for r in running.iter_mut() {
            if k == 0 {
                r.workspace
                    .stage_inputs(&agent.role, &tasks[r.task].inputs)?;
            } else {
                let previous = &self.workflow.agents[k - 1];
                let patterns = FilePatterns::new(&previous.pass_files)?;
                r.workspace
                    .hand_off(&previous.role, &agent.role, &patterns)?;
            }
            let files = listing(&r.workspace.agent_dir(&agent.role)?);
            let task = self.workflow.task_text(&tasks[r.task].text);
            let prompt = render_prompt(agent, &task, &files, &r.upstream)
                .map_err(|e| AgentError::Workflow(format!("agent {}: prompt: {e}", agent.role)))?;
            conversations.push(vec![
                Message::new("system", &agent.system),
                Message::new("user", prompt),
            ]);
        }
        Ok(conversations)
    }

    /// One turn of agent `k` in the `active` trajectories: one policy batch.
    fn generate_turn(
        &self,
        k: usize,
        turn: usize,
        tasks: &[TaskInput],
        running: &[Running],
        active: &[usize],
        conversations: &[Vec<Message>],
    ) -> Result<Vec<PolicyOutput>, AgentError> {
        let agent = &self.workflow.agents[k];
        let role = &agent.role;
        let requests: Vec<PolicyRequest> = active
            .iter()
            .map(|&i| PolicyRequest {
                messages: conversations[i].clone(),
                stream: format!(
                    "rollout/{}/s{}/{role}/{turn}",
                    tasks[running[i].task].id, running[i].sample
                ),
                reply: agent.reply_format(),
            })
            .collect();
        let generated = self.policies[k].generate(&requests)?;
        if generated.len() != requests.len() {
            return Err(AgentError::Policy(format!(
                "policy {} returned {} completions for {} prompts",
                self.policies[k].name(),
                generated.len(),
                requests.len()
            )));
        }
        Ok(generated)
    }

    /// The program each output runs: its own Python, or the workflow's
    /// program template filled with the output.
    fn programs(
        agent: &AgentSpec,
        generated: &[PolicyOutput],
    ) -> Result<Vec<Option<String>>, AgentError> {
        generated
            .iter()
            .map(|g| match (&agent.tool, &agent.program) {
                (Tool::Python, Some(program)) => {
                    render_program(program, &g.text).map(Some).map_err(|e| {
                        AgentError::Workflow(format!("agent {}: program: {e}", agent.role))
                    })
                }
                (Tool::Python, None) => Ok(extract_python(&g.text)),
                (Tool::None, _) => Ok(None),
            })
            .collect()
    }

    fn run_agent(
        &self,
        k: usize,
        agent: &AgentSpec,
        tasks: &[TaskInput],
        running: &mut [Running],
    ) -> Result<(), AgentError> {
        let mut conversations = self.first_prompts(k, agent, tasks, running)?;
        let mut active: Vec<usize> = (0..running.len()).collect();
        let mut outputs: Vec<Vec<String>> = vec![Vec::new(); running.len()];
        let mut last_tool: Vec<Option<String>> = vec![None; running.len()];
        for turn in 0..agent.max_actions {
            if active.is_empty() {
                break;
            }
            let generated = self.generate_turn(k, turn, tasks, running, &active, &conversations)?;
            let dirs: Vec<PathBuf> = active
                .iter()
                .map(|&i| running[i].workspace.agent_dir(&agent.role))
                .collect::<Result<_, _>>()?;
            let codes = Self::programs(agent, &generated)?;
            // The files each action could use, before its code runs.
            let available: Vec<Vec<String>> = dirs.iter().map(|d| listing(d)).collect();
            let results = self.run_code(&dirs, &codes)?;
            let mut still_active = Vec::new();
            for (j, &i) in active.iter().enumerate() {
                let output = &generated[j];
                let observation = results[j].as_ref().map(observation);
                let saved = results[j].iter().flat_map(|r| &r.files);
                running[i].saved.extend(
                    saved
                        .filter(|c| c.change != FileChangeKind::Deleted)
                        .map(|c| c.path.clone()),
                );
                running[i].actions.push(ActionRecord {
                    agent: k,
                    role: agent.role.clone(),
                    turn,
                    messages: conversations[i].clone(),
                    text: output.text.clone(),
                    prompt_ids: output.prompt_ids.clone(),
                    completion_ids: output.completion_ids.clone(),
                    old_logprobs: output.logprobs.clone(),
                    truncated: output.truncated,
                    code: codes[j].clone(),
                    tool_observation: observation.clone(),
                    tool_status: results[j].as_ref().map(|r| r.status),
                    files_available: available[j].clone(),
                    files_saved: running[i].saved.iter().cloned().collect(),
                });
                outputs[i].push(output.text.clone());
                conversations[i].push(Message::new("assistant", output.text.clone()));
                if let Some(obs) = &observation {
                    last_tool[i] = Some(obs.clone());
                    conversations[i]
                        .push(Message::new("user", format!("Output of your code:\n{obs}")));
                }
                if continues(agent, &dirs[j], codes[j].is_some()) {
                    still_active.push(i);
                }
            }
            active = still_active;
        }
        for ((r, outputs), last_tool) in running.iter_mut().zip(outputs).zip(last_tool) {
            r.upstream.insert(
                agent.role.clone(),
                Upstream {
                    output: outputs.last().cloned().unwrap_or_default(),
                    outputs,
                    tool_output: last_tool.unwrap_or_else(|| "N/A".into()),
                },
            );
        }
        Ok(())
    }

    /// Run each trajectory's code (if any), at most the sandbox's
    /// `max_workers` at once (on as many threads).
    fn run_code(
        &self,
        dirs: &[PathBuf],
        codes: &[Option<String>],
    ) -> Result<Vec<Option<RunResult>>, AgentError> {
        let jobs: Vec<(&std::path::Path, Option<&str>)> = dirs
            .iter()
            .zip(codes)
            .map(|(dir, code)| (dir.as_path(), code.as_deref()))
            .collect();
        self.sandbox
            .run_all(&jobs)
            .into_iter()
            .map(|r| r.transpose().map_err(AgentError::Sandbox))
            .collect()
    }
}

/// File names at the top of an agent's directory, sorted (the sandbox's own files left out).
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != PRIVATE_DIR)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The ```python (or ```py) blocks of a message, joined in order; `None` when there are none.
pub fn extract_python(text: &str) -> Option<String> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(newline) = after.find('\n') else {
            break;
        };
        let lang = after[..newline].trim();
        let body = &after[newline + 1..];
        let Some(end) = body.find("```") else { break };
        if lang == "python" || lang == "py" || lang == "python3" {
            blocks.push(body[..end].trim_end().to_string());
        }
        rest = &body[end + 3..];
    }
    (!blocks.is_empty()).then(|| blocks.join("\n\n"))
}

/// The tool output an agent sees: stdout, stderr and any non-ok status, cut
/// to [`MAX_OBSERVATION_CHARS`].
pub fn observation(result: &RunResult) -> String {
    let mut text = result.stdout.clone();
    if !result.stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr]\n");
        text.push_str(&result.stderr);
    }
    if result.status != Status::Ok {
        let status = serde_json::to_value(result.status)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        text.push_str(&format!("\n[status: {status}]"));
    }
    if text.trim().is_empty() {
        text = "(no output)".into();
    }
    match text.char_indices().nth(MAX_OBSERVATION_CHARS) {
        Some((at, _)) => format!(
            "{}\n[... output cut at {MAX_OBSERVATION_CHARS} characters]",
            &text[..at]
        ),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_blocks_are_found_and_joined() {
        let text = "Let me compute.\n```python\nx = 2\n```\nand\n```py\nprint(x)\n```\n```text\nnot code\n```";
        assert_eq!(extract_python(text).unwrap(), "x = 2\n\nprint(x)");
        assert_eq!(extract_python("no code, answer 5"), None);
        assert_eq!(extract_python("```python\nunclosed"), None);
    }
}
