//! Declarative workflows (`experiments/workflows/*.toml`): the agents, their
//! order, prompts, tools, action limits, stop conditions, what each sees and
//! which files each must produce. The agents and their order are data.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use crate::AgentError;

/// A tool an agent may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    /// No tool: every action is plain text.
    None,
    /// Fenced ```python blocks in an action run in the sandbox; the output
    /// comes back as a tool turn.
    Python,
}

/// One agent of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The role id; it also selects the coach's rubric.
    pub role: String,
    /// A readable name.
    pub title: String,
    /// The system message (role text).
    pub system: String,
    /// minijinja template of the first user message. Variables: `task`,
    /// `files` (the agent's directory listing), and for every role in `sees`
    /// `<role>.output` (its last message), `<role>.outputs` (all of them) and
    /// `<role>.tool_output` (its last tool output, or "N/A").
    pub prompt: String,
    /// Upstream roles whose outputs this agent sees.
    #[serde(default)]
    pub sees: Vec<String>,
    /// Its tool.
    pub tool: Tool,
    /// Most actions (model calls) in one trajectory.
    pub max_actions: usize,
    /// With the Python tool: an action without code ends the agent's turn.
    #[serde(default)]
    pub stop_when_no_code: bool,
    /// End the turn once every required file exists.
    #[serde(default)]
    pub stop_when_files_exist: bool,
    /// Files this agent must produce (the coach's blame chain).
    #[serde(default)]
    pub required_files: Vec<String>,
    /// Glob patterns of the files passed on to the next agent.
    #[serde(default)]
    pub pass_files: Vec<String>,
    /// With the Python tool: a minijinja template of the program to run,
    /// given the action's text as `output` (trimmed), instead of the
    /// action's own ```python blocks. Agents then emit short choices that a
    /// fixed program carries out (CPU-scale experiments).
    #[serde(default)]
    pub program: Option<String>,
    /// Text every action of this agent begins with: the prompt ends with it
    /// and the model continues it (e.g. `"Plan:"`), a format cue for small
    /// models. The action's text includes it; its trained tokens do not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reply_prefix: String,
    /// Most new tokens per action (default: the manifest's
    /// `rollout.max_new_tokens`, which bounds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    /// Strings that end an action once its text contains one (kept in the
    /// text; the action is not truncated), e.g. the closing fence of a code
    /// block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

impl AgentSpec {
    /// How this agent's replies are made.
    pub fn reply_format(&self) -> crate::policy::ReplyFormat {
        crate::policy::ReplyFormat {
            prefix: self.reply_prefix.clone(),
            max_new_tokens: self.max_new_tokens,
            stop: self.stop.clone(),
        }
    }
}

/// A template environment as workflows render them: strict about undefined
/// variables, with a fuel budget.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(mappa_core::TEMPLATE_FUEL));
    env
}

/// The program an agent's `program` template makes of an action's text.
pub fn render_program(template: &str, output: &str) -> Result<String, String> {
    let mut env = environment();
    env.add_template("program", template)
        .map_err(|e| format!("{e:#}"))?;
    env.get_template("program")
        .and_then(|t| t.render(minijinja::context! { output => output.trim() }))
        .map_err(|e| format!("{e:#}"))
}

/// A workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// Its name.
    pub name: String,
    /// What it is for.
    pub description: String,
    /// The coach's rubric set for these roles: a shipped one (`mathchat`,
    /// `dsbench`: `mappa_judge::rubric::shipped_domains`) or one of your own
    /// (`[coach] rubric_dir`).
    pub coach_domain: String,
    /// Appended to the task text agents see (after a blank line).
    #[serde(default)]
    pub task_suffix: Option<String>,
    /// The role whose last output holds the final answer.
    pub final_answer_from: String,
    /// The agents, in order.
    pub agents: Vec<AgentSpec>,
}

impl Workflow {
    /// Whether agents hand files to each other (required or passed files),
    /// so that the coach is shown each action's file lists.
    pub fn hands_off_files(&self) -> bool {
        self.agents
            .iter()
            .any(|a| !a.required_files.is_empty() || !a.pass_files.is_empty())
    }

    /// Read and validate a workflow file.
    pub fn load(path: &Path) -> Result<Self, AgentError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AgentError::Workflow(format!("{}: {e}", path.display())))?;
        let workflow: Self = toml::from_str(&text)
            .map_err(|e| AgentError::Workflow(format!("{}: {e}", path.display())))?;
        workflow
            .validate()
            .map_err(|e| AgentError::Workflow(format!("{}: {e}", path.display())))?;
        Ok(workflow)
    }

    /// Check names, references and templates; the error names the agent and field.
    pub fn validate(&self) -> Result<(), String> {
        if self.agents.is_empty() {
            return Err("agents: expected at least one agent".into());
        }
        if self.coach_domain.is_empty() || self.coach_domain.contains(['/', ' ']) {
            return Err(format!(
                "coach_domain = {:?}: expected a rubric set's name (shipped: {})",
                self.coach_domain,
                mappa_judge::rubric::shipped_domains().join(", ")
            ));
        }
        let mut seen = Vec::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}] ({})", agent.role);
            if agent.role.is_empty()
                || agent.role.contains(['/', ' '])
                || seen.contains(&agent.role.as_str())
            {
                return Err(format!(
                    "{at}.role: expected a unique id without spaces or slashes"
                ));
            }
            if agent.max_actions == 0 {
                return Err(format!("{at}.max_actions: expected at least 1"));
            }
            if agent.max_new_tokens == Some(0) {
                return Err(format!("{at}.max_new_tokens: expected at least 1"));
            }
            if agent.stop.iter().any(String::is_empty) {
                return Err(format!("{at}.stop: expected non-empty strings"));
            }
            if agent.tool == Tool::None && (agent.stop_when_no_code || agent.stop_when_files_exist)
            {
                return Err(format!(
                    "{at}: stop conditions on code or files need tool = \"python\""
                ));
            }
            for upstream in &agent.sees {
                if !seen.contains(&upstream.as_str()) {
                    return Err(format!("{at}.sees: {upstream:?} is not an earlier agent"));
                }
            }
            mappa_env::sandbox::workspace::FilePatterns::new(&agent.pass_files)
                .map_err(|e| format!("{at}.pass_files: {e}"))?;
            render_prompt(agent, "TASK", &[], &BTreeMap::new())
                .map_err(|e| format!("{at}.prompt: {e}"))?;
            if let Some(program) = &agent.program {
                if agent.tool != Tool::Python {
                    return Err(format!("{at}.program: needs tool = \"python\""));
                }
                render_program(program, "CHOICE").map_err(|e| format!("{at}.program: {e}"))?;
            }
            seen.push(&agent.role);
        }
        if !seen.contains(&self.final_answer_from.as_str()) {
            return Err(format!(
                "final_answer_from = {:?}: expected one of the agents' roles",
                self.final_answer_from
            ));
        }
        Ok(())
    }

    /// The task text agents see: the task and the suffix.
    pub fn task_text(&self, task: &str) -> String {
        match &self.task_suffix {
            Some(suffix) => format!("{task}\n\n{suffix}"),
            None => task.to_string(),
        }
    }
}

/// What an upstream agent did, as a prompt sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Upstream {
    /// Its last message.
    pub output: String,
    /// All its messages.
    pub outputs: Vec<String>,
    /// Its last tool output, or "N/A".
    pub tool_output: String,
}

/// Render an agent's first user message. Only the roles in `sees` are
/// visible; a template naming another is an error.
pub fn render_prompt(
    agent: &AgentSpec,
    task: &str,
    files: &[String],
    upstream: &BTreeMap<String, Upstream>,
) -> Result<String, String> {
    let mut env = environment();
    env.add_template("prompt", &agent.prompt)
        .map_err(|e| format!("{e:#}"))?;
    let mut ctx = BTreeMap::new();
    ctx.insert("task".to_string(), minijinja::Value::from(task));
    ctx.insert(
        "files".to_string(),
        minijinja::Value::from(minijinja::value::Serde(files)),
    );
    for role in &agent.sees {
        let value = upstream.get(role).cloned().unwrap_or_else(|| Upstream {
            output: String::new(),
            outputs: Vec::new(),
            tool_output: "N/A".into(),
        });
        ctx.insert(
            role.clone(),
            minijinja::Value::from(minijinja::value::Serde(&value)),
        );
    }
    env.get_template("prompt")
        .and_then(|t| t.render(minijinja::Value::from(minijinja::value::Serde(&ctx))))
        .map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflows_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/workflows")
    }

    #[test]
    fn the_shipped_workflows_load() {
        for name in [
            "mathchat",
            "arith",
            "dsbench",
            "arith-compact",
            "tabular-compact",
            "mathchat-smol",
        ] {
            let w = Workflow::load(&workflows_dir().join(format!("{name}.toml"))).unwrap();
            assert_eq!(w.name, name);
            assert_eq!(w.agents.len(), 3);
        }
    }

    #[test]
    fn an_agent_cannot_see_what_it_does_not_name() {
        let mut w = Workflow::load(&workflows_dir().join("mathchat.toml")).unwrap();
        // The Verifier sees only the Code Executor; a template naming the Solver fails.
        w.agents[2].prompt = "{{ problem_solver.output }}".into();
        let err = w.validate().unwrap_err();
        assert!(err.contains("agents[2] (verifier).prompt"), "{err}");
        w.agents[2].prompt = "{{ task }}".into();
        w.agents[2].sees = vec!["analyst".into()];
        assert!(w.validate().unwrap_err().contains("not an earlier agent"));
    }

    #[test]
    fn reply_formats_are_read_and_checked() {
        let mut w = Workflow::load(&workflows_dir().join("mathchat-smol.toml")).unwrap();
        let solver = w.agents[0].reply_format();
        assert_eq!(solver.prefix, "Plan:");
        assert_eq!(solver.stop, ["\n"]);
        assert_eq!(solver.max_new_tokens, Some(24));
        assert_eq!(
            Workflow::load(&workflows_dir().join("mathchat.toml"))
                .unwrap()
                .agents[0]
                .reply_format(),
            crate::policy::ReplyFormat::default()
        );
        // The Verifier sees at most the first 1000 characters of the output.
        let mut upstream = BTreeMap::new();
        upstream.insert(
            "code_executor".to_string(),
            Upstream {
                tool_output: "7".repeat(5000),
                ..Default::default()
            },
        );
        let prompt = render_prompt(&w.agents[2], "t", &[], &upstream).unwrap();
        assert_eq!(prompt, format!("Output:\n{}", "7".repeat(1000)));
        w.agents[1].max_new_tokens = Some(0);
        let err = w.validate().unwrap_err();
        assert!(
            err.contains("agents[1] (code_executor).max_new_tokens"),
            "{err}"
        );
        w.agents[1].max_new_tokens = None;
        w.agents[2].stop = vec![String::new()];
        let err = w.validate().unwrap_err();
        assert!(err.contains("agents[2] (verifier).stop"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        let text = std::fs::read_to_string(workflows_dir().join("mathchat.toml")).unwrap();
        std::fs::write(
            &path,
            text.replace(
                "max_actions = 1\nsees = []",
                "max_actions = 1\nsees = []\nmax_tokens = 3",
            ),
        )
        .unwrap();
        let err = Workflow::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("max_tokens") && err.contains("w.toml"),
            "{err}"
        );
    }

    #[test]
    fn programs_render_choices_and_are_checked() {
        let program = "choice = {{ output | tojson }}\nprint(choice)";
        assert_eq!(
            render_program(program, "  onehot\n").unwrap(),
            "choice = \"onehot\"\nprint(choice)"
        );
        // Quotes in a choice cannot break out of the string.
        assert_eq!(
            render_program(program, "a\"); import os; (\"").unwrap(),
            "choice = \"a\\\"); import os; (\\\"\"\nprint(choice)"
        );
        let mut w = Workflow::load(&workflows_dir().join("arith.toml")).unwrap();
        w.agents[0].program = Some("print(1)".into());
        assert!(w
            .validate()
            .unwrap_err()
            .contains("agents[0] (problem_solver).program: needs tool"));
        w.agents[0].program = None;
        w.agents[1].program = Some("{{ nothing }}".into());
        assert!(w
            .validate()
            .unwrap_err()
            .contains("agents[1] (code_executor).program"));
    }
}
