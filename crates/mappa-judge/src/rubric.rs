//! Rubric templates: the coach prompts, as minijinja files in the repository
//! (`crates/mappa-judge/rubrics/<domain>/<role>.j2`, each extending its
//! domain's `_base.j2`). A template renders two blocks, `system` and `user`.

use std::collections::BTreeMap;
use std::path::Path;

use mappa_core::hash::sha256_hex;
use minijinja::{context, Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use crate::context::{ActionContext, GroundTruth};
use crate::CoachError;

/// Tool observations are cut to this many characters (docs/METHOD.md section 3).
pub const MAX_TOOL_OBSERVATION_CHARS: usize = 2000;

pub use mappa_core::chat::Message;

/// The rubric sets shipped in this crate (`crates/mappa-judge/rubrics/`):
/// a domain name, as workflows name it in `coach_domain`, and its files.
/// A new domain is a directory of templates there and one entry here, or
/// any directory given as `[coach] rubric_dir`.
const SHIPPED: &[(&str, &[(&str, &str)])] = &[
    (
        "mathchat",
        &[
            ("_base.j2", include_str!("../rubrics/mathchat/_base.j2")),
            (
                "problem_solver.j2",
                include_str!("../rubrics/mathchat/problem_solver.j2"),
            ),
            (
                "code_executor.j2",
                include_str!("../rubrics/mathchat/code_executor.j2"),
            ),
            (
                "verifier.j2",
                include_str!("../rubrics/mathchat/verifier.j2"),
            ),
        ],
    ),
    (
        "dsbench",
        &[
            ("_base.j2", include_str!("../rubrics/dsbench/_base.j2")),
            (
                "data_engineer.j2",
                include_str!("../rubrics/dsbench/data_engineer.j2"),
            ),
            ("modeler.j2", include_str!("../rubrics/dsbench/modeler.j2")),
            ("analyst.j2", include_str!("../rubrics/dsbench/analyst.j2")),
        ],
    ),
];

/// The names of the shipped rubric domains.
pub fn shipped_domains() -> Vec<&'static str> {
    SHIPPED.iter().map(|(name, _)| *name).collect()
}

/// A prompt ready for a coach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderedPrompt {
    /// System and user messages.
    pub messages: Vec<Message>,
    /// sha256 of the role template and its base (see [`RubricSet::template_sha256`]).
    pub template_sha256: String,
    /// Whether the reply must carry `ANSWER_CORRECT`.
    pub asks_answer_correct: bool,
}

/// The rubric templates of one domain: `_base.j2` and one `<role>.j2` per
/// role. When the base template uses `ask_answer_correct`, the last agent's
/// coach is asked for `ANSWER_CORRECT` whenever it sees the ground truth.
#[derive(Debug)]
pub struct RubricSet {
    domain: String,
    asks_answer_correct: bool,
    env: Environment<'static>,
    shas: BTreeMap<String, String>,
}

impl RubricSet {
    /// The rubrics of a shipped domain (`crates/mappa-judge/rubrics/<domain>/`).
    pub fn builtin(domain: &str) -> Result<Self, CoachError> {
        let (_, files) = SHIPPED.iter().find(|(name, _)| *name == domain).ok_or_else(|| {
            CoachError::Config(format!(
                "coach domain {domain:?}: no shipped rubrics (shipped: {}); give your own as [coach] rubric_dir",
                shipped_domains().join(", ")
            ))
        })?;
        let files = files
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect();
        Self::from_sources(domain, files, "builtin")
    }

    /// Rubrics from a directory holding `_base.j2` and one `<role>.j2` per
    /// role (copy `crates/mappa-judge/rubrics/<domain>` to start); the
    /// domain is the directory's name.
    pub fn from_dir(dir: &Path) -> Result<Self, CoachError> {
        let read_err =
            |e: std::io::Error| CoachError::Config(format!("rubrics {}: {e}", dir.display()));
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(read_err)? {
            let path = entry.map_err(read_err)?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.ends_with(".j2") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| CoachError::Config(format!("rubric {}: {e}", path.display())))?;
                files.push((name.to_string(), text));
            }
        }
        if !files.iter().any(|(n, _)| n == "_base.j2") {
            return Err(CoachError::Config(format!(
                "rubrics {}: no _base.j2",
                dir.display()
            )));
        }
        files.sort();
        let domain = dir
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        Self::from_sources(&domain, files, &dir.display().to_string())
    }

    fn from_sources(
        domain: &str,
        files: Vec<(String, String)>,
        origin: &str,
    ) -> Result<Self, CoachError> {
        let base = files
            .iter()
            .find(|(n, _)| n == "_base.j2")
            .map(|(_, s)| s.clone())
            .unwrap_or_default();
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // A hostile rubric (an endless loop) is an error, not a hang.
        env.set_fuel(Some(mappa_core::TEMPLATE_FUEL));
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .build()
                .expect("the default delimiters are valid"),
        );
        let mut shas = BTreeMap::new();
        for (name, text) in files {
            if let Some(role) = name.strip_suffix(".j2").filter(|r| *r != "_base") {
                shas.insert(
                    role.to_string(),
                    sha256_hex(format!("{text}\n\0\n{base}").as_bytes()),
                );
            }
            env.add_template_owned(name.clone(), text)
                .map_err(|e| CoachError::Config(format!("rubric {origin}/{name}: {e:#}")))?;
        }
        if shas.is_empty() {
            return Err(CoachError::Config(format!(
                "rubrics {origin}: no role templates besides _base.j2"
            )));
        }
        Ok(Self {
            domain: domain.to_string(),
            asks_answer_correct: base.contains("ask_answer_correct"),
            env,
            shas,
        })
    }

    /// The domain's name.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The roles with a template, in name order.
    pub fn roles(&self) -> Vec<&str> {
        self.shas.keys().map(String::as_str).collect()
    }

    /// sha256 of a role's template: its file, a NUL line, and `_base.j2`.
    pub fn template_sha256(&self, role: &str) -> Option<&str> {
        self.shas.get(role).map(String::as_str)
    }

    /// Render the coach prompt for one action. The ground truth is shown only
    /// to the last agent's coach and only when `coach_sees_ground_truth`.
    pub fn render(
        &self,
        ctx: &ActionContext,
        coach_sees_ground_truth: bool,
    ) -> Result<RenderedPrompt, CoachError> {
        let sha = self.template_sha256(&ctx.role).ok_or_else(|| {
            CoachError::Config(format!(
                "action {:?}: role {:?} has no {} rubric (roles: {})",
                ctx.id,
                ctx.role,
                self.domain,
                self.roles().join(", ")
            ))
        })?;
        let ground_truth = ctx
            .ground_truth
            .as_ref()
            .filter(|_| coach_sees_ground_truth && ctx.is_last_agent)
            .map(GroundTruth::render);
        let asks_answer_correct = ground_truth.is_some() && self.asks_answer_correct;
        let observation = match ctx.tool_observation.as_deref() {
            Some(o) if !o.trim().is_empty() => cut(o, MAX_TOOL_OBSERVATION_CHARS),
            _ => "N/A".to_string(),
        };
        let files = ctx.files.clone().unwrap_or_default();
        let template = self
            .env
            .get_template(&format!("{}.j2", ctx.role))
            .map_err(|e| CoachError::Config(format!("rubric {}: {e:#}", ctx.role)))?;
        let mut captured = template
            .render_captured(context! {
                task => &ctx.task,
                role => &ctx.role,
                role_title => role_title(&ctx.role),
                agent_input => &ctx.agent_input,
                output => &ctx.output,
                tool_observation => observation,
                files => minijinja::Value::from(minijinja::value::Serde(&files)),
                ground_truth => ground_truth,
                ask_answer_correct => asks_answer_correct,
            })
            .map_err(|e| CoachError::Config(format!("rubric {}: {e:#}", ctx.role)))?;
        let mut block = |name: &str| {
            captured
                .with_state_mut(|state| state.render_block(name))
                .map(|s| collapse_blank_lines(s.trim()))
                .map_err(|e| CoachError::Config(format!("rubric {} block {name}: {e:#}", ctx.role)))
        };
        Ok(RenderedPrompt {
            messages: vec![
                Message::new("system", block("system")?),
                Message::new("user", block("user")?),
            ],
            template_sha256: sha.to_string(),
            asks_answer_correct,
        })
    }
}

/// At most one blank line in a row (template conditionals leave more).
fn collapse_blank_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        blank_run = if line.trim().is_empty() {
            blank_run + 1
        } else {
            0
        };
        if blank_run <= 1 {
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.trim_end().to_string()
}

/// `problem_solver` -> `Problem Solver`.
fn role_title(role: &str) -> String {
    role.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first `max` characters, with a marker when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!(
            "{}\n[... cut: {} more characters]",
            &text[..at],
            text[at..].chars().count()
        ),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(role: &str) -> ActionContext {
        ActionContext {
            id: "t0/a".into(),
            task: "Find 2+2.".into(),
            role: role.into(),
            agent_input: "Solve it.".into(),
            output: "It is \\boxed{4}.".into(),
            ground_truth: Some("4".into()),
            is_last_agent: true,
            ..Default::default()
        }
    }

    #[test]
    fn ground_truth_only_for_the_last_agent_and_when_switched_on() {
        let set = RubricSet::builtin("mathchat").unwrap();
        let shown = set.render(&ctx("verifier"), true).unwrap();
        assert!(shown.asks_answer_correct);
        assert!(shown.messages[1].content.contains("Ground truth answer"));
        assert!(shown.messages[0].content.contains("ANSWER_CORRECT"));
        let hidden = set.render(&ctx("verifier"), false).unwrap();
        assert!(!hidden.asks_answer_correct);
        assert!(!hidden.messages[1].content.contains("Ground truth"));
        let mut early = ctx("problem_solver");
        early.is_last_agent = false;
        assert!(!set.render(&early, true).unwrap().messages[1]
            .content
            .contains("Ground truth"));
    }

    #[test]
    fn long_observations_are_cut_and_missing_ones_say_na() {
        let set = RubricSet::builtin("mathchat").unwrap();
        let mut c = ctx("code_executor");
        let user = |c: &ActionContext| set.render(c, true).unwrap().messages[1].content.clone();
        assert!(user(&c).contains("## Last tool output\nN/A"));
        c.tool_observation = Some("x".repeat(2500));
        let text = user(&c);
        assert!(text.contains("[... cut: 500 more characters]"));
        assert!(!text.contains(&"x".repeat(2001)));
    }

    /// A rubric directory with a trivial template per role of `roles`,
    /// except `role`'s, which is `text`.
    fn rubric_dir(roles: &[&str], role: &str, text: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for r in roles {
            let body = if *r == role {
                text
            } else {
                "{% block system %}x{% endblock %}"
            };
            std::fs::write(dir.path().join(format!("{r}.j2")), body).unwrap();
        }
        dir
    }

    #[test]
    fn unknown_roles_and_broken_templates_are_named() {
        let set = RubricSet::builtin("dsbench").unwrap();
        let err = set.render(&ctx("verifier"), true).unwrap_err().to_string();
        assert!(
            err.contains("verifier") && err.contains("data_engineer"),
            "{err}"
        );
        let dir = rubric_dir(
            &["_base", "data_engineer", "modeler", "analyst"],
            "modeler",
            "{% block system %}{{ unclosed {% endblock %}",
        );
        let err = RubricSet::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("modeler.j2"), "{err}");
    }

    #[test]
    fn an_endless_rubric_is_an_error_not_a_hang() {
        let dir = rubric_dir(
            &["_base", "problem_solver", "code_executor", "verifier"],
            "verifier",
            "{% block system %}{% for i in range(100000) %}{% for j in range(100000) %}x\
             {% endfor %}{% endfor %}{% endblock %}",
        );
        let set = RubricSet::from_dir(dir.path()).unwrap();
        let err = set.render(&ctx("verifier"), true).unwrap_err().to_string();
        assert!(err.contains("fuel"), "{err}");
    }

    #[test]
    fn template_hashes_differ_by_role_and_follow_the_text() {
        let set = RubricSet::builtin("mathchat").unwrap();
        let a = set.template_sha256("problem_solver").unwrap();
        let b = set.template_sha256("verifier").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
    }
}
