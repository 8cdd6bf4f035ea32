//! The scripted teacher of a warm start: its settings (`[warm_start]`) and
//! what a task family hands back for it ([`Teacher`]).

use std::collections::BTreeMap;

use mappa_agents::{ScriptedPolicy, TaskInput};
use mappa_env::slips::SlipKind;
use serde::{Deserialize, Serialize};

/// A supervised warm start before RL: demonstrations from a scripted
/// teacher that makes mistakes at a set rate per role, so that the starting
/// system is imperfect in known ways. The tuned models are cached by a hash
/// of everything they depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmStart {
    /// The teacher: `arith` (plan -> program -> boxed answer, for the arith workflow).
    pub teacher: String,
    /// Demonstrations per role (training problems, cycled).
    pub demonstrations: usize,
    /// Probability that the teacher's action of a role is wrong.
    #[serde(default)]
    pub error_rates: BTreeMap<String, f64>,
    /// What a wrong action looks like (`digit` by default).
    #[serde(default)]
    pub slips: SlipKind,
    /// How much a role's error rate grows with the difficulty of the plan
    /// it writes or relays ([`mappa_env::slips::difficulty`], arith teacher
    /// only): the rate on a plan of difficulty `d` is `rate * (1 + w) *
    /// d^w`, clamped to [0, 1] ([`mappa_env::slips::slip_probability`]); a
    /// relayed value keeps `rate`. 0 (the default): the same rate on every
    /// instance.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub difficulty_weight: f64,
    /// Supervised settings.
    #[serde(default)]
    pub sft: crate::sft::SftConfig,
}

/// For `skip_serializing_if`: a setting at its default of 0 stays out of
/// the manifest's serialised form (and so out of its hash).
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// A warm-start teacher: its tasks and one scripted policy per agent.
pub struct Teacher {
    /// The demonstration tasks (none held out).
    pub tasks: Vec<TaskInput>,
    /// One policy per agent, in workflow order.
    pub policies: Vec<ScriptedPolicy>,
}
