//! Policies: what turns a batch of chat prompts into completions. The burn
//! model policy lives with the trainer (`mappa-train`); here are the trait
//! and a scripted policy for workflow and harness tests.

use serde::{Deserialize, Serialize};

use crate::AgentError;

pub use mappa_core::chat::Message;

/// One prompt of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRequest {
    /// The conversation so far (the agent's full input).
    pub messages: Vec<Message>,
    /// Name of the RNG stream this sample draws from (task, sample, agent,
    /// turn), so a completion does not depend on its batch mates.
    pub stream: String,
    /// How the agent's reply is made (its workflow entry's `reply_prefix`,
    /// `max_new_tokens` and `stop`); the policy's settings where unset.
    #[serde(default)]
    pub reply: ReplyFormat,
}

/// How an agent's reply is made: the text it is made to begin with, and
/// when its generation stops.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplyFormat {
    /// Text the reply begins with: appended to the prompt after the chat
    /// template's generation prompt, so the model continues it; the reply's
    /// text starts with it, its generated tokens do not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// Most new tokens (none: the policy's own limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    /// Strings that end the completion once its text contains one (kept in
    /// the text; a completion ended so is not truncated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

/// One completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyOutput {
    /// The completion text.
    pub text: String,
    /// The prompt as the model saw it (token ids; empty for untokenised policies).
    pub prompt_ids: Vec<u32>,
    /// The completion (token ids; empty for untokenised policies).
    pub completion_ids: Vec<u32>,
    /// Per-token log-probs of the completion under the policy.
    pub logprobs: Vec<f32>,
    /// Generation stopped at the token limit before EOS.
    pub truncated: bool,
}

/// Generates completions for a batch of chat prompts.
pub trait Policy: Send + Sync {
    /// A name for records (scripted policies say "scripted").
    fn name(&self) -> String;
    /// One completion per request, in order.
    fn generate(&self, requests: &[PolicyRequest]) -> Result<Vec<PolicyOutput>, AgentError>;
}

/// A function from a request to a reply, or to why it cannot reply.
pub type Script = dyn Fn(&PolicyRequest) -> Result<String, String> + Send + Sync;

/// A policy that answers from a script (canned or computed replies), with
/// no tokens or log-probs: for workflow tests and pipeline demonstrations,
/// never for training.
pub struct ScriptedPolicy {
    name: String,
    script: Box<Script>,
}

impl ScriptedPolicy {
    /// A scripted policy called `scripted-<name>`.
    pub fn new(
        name: &str,
        script: impl Fn(&PolicyRequest) -> String + Send + Sync + 'static,
    ) -> Self {
        Self::fallible(name, move |r| Ok(script(r)))
    }

    /// A scripted policy whose script may fail: a teacher that cannot read
    /// its prompt (say, a workflow's wording changed) stops the rollout with
    /// the script's error instead of writing a wrong demonstration.
    pub fn fallible(
        name: &str,
        script: impl Fn(&PolicyRequest) -> Result<String, String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: format!("scripted-{name}"),
            script: Box::new(script),
        }
    }
}

impl Policy for ScriptedPolicy {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn generate(&self, requests: &[PolicyRequest]) -> Result<Vec<PolicyOutput>, AgentError> {
        requests
            .iter()
            .map(|r| {
                let text = (self.script)(r)
                    .map_err(|e| AgentError::Policy(format!("{}: {e}", self.name)))?;
                Ok(PolicyOutput {
                    text,
                    prompt_ids: Vec::new(),
                    completion_ids: Vec::new(),
                    logprobs: Vec::new(),
                    truncated: false,
                })
            })
            .collect()
    }
}
