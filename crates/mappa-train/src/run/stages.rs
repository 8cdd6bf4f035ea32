//! One training step as stages, each a function whose inputs are its
//! arguments and whose outputs are its return value;
//! [`Runner::train_step`] passes each what it needs:
//!
//! 1. [`rollout_coaching_early`]: roll out the batch; each agent but the
//!    last is coached while the next one generates.
//! 2. [`grade`]: grade every trajectory (the task family's grader).
//! 3. [`coach_last`]: coach the last agent, shown the graded ground truth
//!    (DSBench: the submission's metrics).
//! 4. [`assemble`]: one [`StepTrajectory`] per trajectory, each action with
//!    its score; a count that does not match is an error.
//! 5. [`assign_credit`]: rewards, advantages, each action's credit and the
//!    training samples, through `mappa-credit` ([`build_samples`]).
//! 6. [`update`]: one optimiser step per agent.
//! 7. [`record`]: the step's [`TrainLine`] and [`TrajectoryLine`]s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mappa_agents::{action_contexts, ActionRecord, TaskInput, Trajectory, Workflow};
use mappa_env::tabular::FairSummary;
use mappa_judge::{ActionContext, ActionScore, Coach, ErrorTable, FallbackKind, GroundTruth};
use mappa_model::AutodiffModelBackend;

use super::remove_work;
use super::runner::Runner;
use super::timing::{seconds, TimingLine};
use mappa_credit::CreditConfig;

use crate::learner::{AgentLearner, StepMetrics, TrainSample};
use crate::loss::LossConfig;
use crate::records::{
    ActionLine, EvalActionLine, EvalLine, EvalTrajectoryLine, TrainLine, TrajectoryLine,
    UniformOutcome, SCHEMA_VERSION,
};
use crate::step::{build_samples, loss_config, CreditedStep, RolloutAction, RolloutTrajectory};
use crate::tasks::{Graded, TaskSet};
use crate::TrainError;

/// Coach scores of one agent's actions in one trajectory, keyed by
/// (trajectory index, agent index).
type ScoresByAgent = BTreeMap<(usize, usize), Vec<ActionScore>>;

/// A trajectory as a training step carries it from stage to stage.
pub(super) struct StepTrajectory {
    /// The rollout's record.
    pub trajectory: Trajectory,
    /// Its grade.
    pub graded: Graded,
    /// The coach's score of each action, in action order.
    pub scores: Vec<ActionScore>,
}

/// The task each trajectory ran on.
fn task_of<'t>(
    by_id: &BTreeMap<&str, &'t TaskInput>,
    t: &Trajectory,
) -> Result<&'t TaskInput, TrainError> {
    by_id
        .get(t.task_id.as_str())
        .copied()
        .ok_or_else(|| TrainError::Input(format!("trajectory of unknown task {:?}", t.task_id)))
}

fn by_id(tasks: &[TaskInput]) -> BTreeMap<&str, &TaskInput> {
    tasks.iter().map(|t| (t.id.as_str(), t)).collect()
}

/// Score `contexts` and split the scores among `owners` (key, count),
/// checking the count.
fn score_owned(
    coach: &dyn Coach,
    contexts: &[ActionContext],
    owners: Vec<((usize, usize), usize)>,
) -> Result<ScoresByAgent, TrainError> {
    let scores = coach.score_batch(contexts)?;
    if scores.len() != contexts.len() {
        return Err(TrainError::Input(format!(
            "coach {}: {} scores for {} actions",
            coach.name(),
            scores.len(),
            contexts.len()
        )));
    }
    let mut it = scores.into_iter();
    Ok(owners
        .into_iter()
        .map(|(key, n)| (key, it.by_ref().take(n).collect()))
        .collect())
}

/// Stage 4: each trajectory with its grade and every action's score (from
/// the early or the last agent's coaching), in action order.
pub(super) fn assemble(
    trajectories: Vec<Trajectory>,
    graded: Vec<Graded>,
    mut scores: ScoresByAgent,
) -> Result<Vec<StepTrajectory>, TrainError> {
    let mut out = Vec::with_capacity(trajectories.len());
    for (i, (trajectory, graded)) in trajectories.into_iter().zip(graded).enumerate() {
        let mut mine: BTreeMap<usize, std::vec::IntoIter<ActionScore>> = BTreeMap::new();
        let mut action_scores = Vec::with_capacity(trajectory.actions.len());
        for a in &trajectory.actions {
            let queue = mine
                .entry(a.agent)
                .or_insert_with(|| scores.remove(&(i, a.agent)).unwrap_or_default().into_iter());
            action_scores.push(queue.next().ok_or_else(|| {
                TrainError::Input(format!(
                    "trajectory {i} ({}): no coach score for {} action {}",
                    trajectory.task_id, a.role, a.turn
                ))
            })?);
        }
        if let Some((agent, extra)) = mine.iter().find(|(_, q)| q.len() > 0) {
            return Err(TrainError::Input(format!(
                "trajectory {i} ({}): {} coach scores too many for agent {agent}",
                trajectory.task_id,
                extra.len()
            )));
        }
        out.push(StepTrajectory {
            trajectory,
            graded,
            scores: action_scores,
        });
    }
    Ok(out)
}

/// What the coach said over a step's actions, per role, and tool use.
#[derive(Default)]
struct CoachTally {
    /// Per role: (sum of scores, actions).
    scores: BTreeMap<String, (f64, usize)>,
    /// Per role: (audited verdicts that agreed with the truth, audited actions).
    agreements: BTreeMap<String, (f64, usize)>,
    /// Per role: the coach's errors against the agent's.
    errors: BTreeMap<String, ErrorTable>,
    /// Fallbacks by reason (every reason present, 0 included).
    fallbacks: BTreeMap<String, usize>,
    /// Actions of tool-using agents.
    tool_actions: usize,
    /// Of which ran code.
    with_code: usize,
}

impl CoachTally {
    fn of(workflow: &Workflow, scored: &[StepTrajectory]) -> Self {
        let mut tally = Self {
            fallbacks: FallbackKind::ALL
                .iter()
                .map(|k| (k.as_str().to_string(), 0))
                .collect(),
            ..Self::default()
        };
        for t in scored {
            for (a, s) in t.trajectory.actions.iter().zip(&t.scores) {
                let e = tally.scores.entry(a.role.clone()).or_default();
                e.0 += s.score;
                e.1 += 1;
                if let Some(audit) = s.audit {
                    let e = tally.agreements.entry(a.role.clone()).or_default();
                    e.0 += f64::from(u8::from(audit.agrees()));
                    e.1 += 1;
                    tally.errors.entry(a.role.clone()).or_default().add(audit);
                }
                if let Some(kind) = s.fallback_kind() {
                    *tally
                        .fallbacks
                        .entry(kind.as_str().to_string())
                        .or_default() += 1;
                }
                if workflow.agents[a.agent].tool == mappa_agents::Tool::Python {
                    tally.tool_actions += 1;
                    tally.with_code += a.code.is_some() as usize;
                }
            }
        }
        tally
    }
}

/// `sum / n` per key.
fn ratios(sums: BTreeMap<String, (f64, usize)>) -> BTreeMap<String, f64> {
    sums.into_iter()
        .map(|(key, (sum, n))| (key, sum / n as f64))
        .collect()
}

/// Stage 7: the step's metrics line and one record per trajectory.
pub(super) fn record(
    step: usize,
    workflow: &Workflow,
    scored: &[StepTrajectory],
    credited: &CreditedStep,
    agents: Vec<StepMetrics>,
) -> (TrainLine, Vec<TrajectoryLine>) {
    let credit = &credited.credit;
    let uniform_sets = credited.uniform_sets;
    let rollout_mismatch = by_role(&agents, &credited.mismatch);
    let rollout_correction = by_role(&agents, &credited.correction);
    let tally = CoachTally::of(workflow, scored);
    let accuracy =
        scored.iter().map(|t| t.graded.outcome).sum::<f64>() / scored.len().max(1) as f64;
    let line = TrainLine {
        schema: SCHEMA_VERSION,
        step,
        train_accuracy: accuracy,
        coach_mean_score: ratios(tally.scores),
        coach_accuracy: ratios(tally.agreements),
        coach_errors: tally.errors,
        coach_fallbacks: tally.fallbacks,
        uniform_outcome: UniformOutcome::of(scored.iter().map(|t| t.graded.outcome)),
        uniform_sets: (!uniform_sets.handling.is_keep()).then_some(uniform_sets),
        tool_call_rate: (tally.tool_actions > 0)
            .then(|| tally.with_code as f64 / tally.tool_actions as f64),
        rollout_mismatch,
        rollout_correction,
        agents,
    };
    let rows = scored
        .iter()
        .zip(credit)
        .map(|(t, credit)| TrajectoryLine {
            schema: SCHEMA_VERSION,
            step,
            task_id: t.trajectory.task_id.clone(),
            sample: t.trajectory.sample,
            outcome: t.graded.outcome,
            actions: t
                .trajectory
                .actions
                .iter()
                .zip(&t.scores)
                .zip(credit)
                .map(|((a, s), c)| ActionLine {
                    role: a.role.clone(),
                    turn: a.turn,
                    text: a.text.clone(),
                    truncated: a.truncated,
                    code: a.code.clone(),
                    tool_observation: a.tool_observation.clone(),
                    tool_status: a.tool_status,
                    score: s.score,
                    rationale: s.rationale.clone(),
                    coach_fallback: s.fallback,
                    reward: c.reward,
                    advantage_mean: c.advantage_mean,
                })
                .collect(),
        })
        .collect();
    (line, rows)
}

/// The agents' values keyed by role, where they have one.
fn by_role<T: Copy>(agents: &[StepMetrics], values: &[Option<T>]) -> BTreeMap<String, T> {
    agents
        .iter()
        .zip(values)
        .filter_map(|(a, v)| v.map(|v| (a.agent.clone(), v)))
        .collect()
}

/// An evaluation line: accuracy over `trajectories`, plus DSBench's fair
/// metrics for tasks graded on a submission; and each trajectory's record
/// (what the agents wrote, the graded outcome).
pub(super) fn eval_line(
    step: usize,
    workflow: &Workflow,
    tasks: &TaskSet,
    trajectories: &[Trajectory],
) -> Result<(EvalLine, Vec<EvalTrajectoryLine>), TrainError> {
    let by_id = by_id(&tasks.eval);
    let mut correct = 0.0;
    let mut submissions = Vec::new();
    let mut rows = Vec::with_capacity(trajectories.len());
    for t in trajectories {
        let task = task_of(&by_id, t)?;
        let graded = tasks.grader.grade(workflow, task, t)?;
        correct += graded.outcome;
        rows.push(eval_trajectory_line(step, task, t, graded.outcome));
        if let Some(GroundTruth::Submission(outcome)) = graded.ground_truth {
            submissions.push(*outcome);
        }
    }
    let line = EvalLine {
        schema: SCHEMA_VERSION,
        step,
        accuracy: correct / trajectories.len().max(1) as f64,
        trajectories: trajectories.len(),
        tabular: (!submissions.is_empty()).then(|| FairSummary::from_outcomes(&submissions)),
        checkpoint: None,
        policy: None,
    };
    Ok((line, rows))
}

/// The record of one evaluated trajectory of `task`.
fn eval_trajectory_line(
    step: usize,
    task: &TaskInput,
    t: &Trajectory,
    outcome: f64,
) -> EvalTrajectoryLine {
    EvalTrajectoryLine {
        schema: SCHEMA_VERSION,
        step,
        task_id: t.task_id.clone(),
        sample: t.sample,
        task: task.text.clone(),
        reference: task.ground_truth.clone(),
        outcome,
        actions: t
            .actions
            .iter()
            .map(|a| EvalActionLine {
                role: a.role.clone(),
                turn: a.turn,
                input: a
                    .messages
                    .last()
                    .map(|m| m.content.clone())
                    .unwrap_or_default(),
                text: a.text.clone(),
                truncated: a.truncated,
                code: a.code.clone(),
                tool_observation: a.tool_observation.clone(),
            })
            .collect(),
    }
}

impl<B: AutodiffModelBackend> Runner<'_, B>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    /// Evaluate the current weights on the held-out tasks: the line, each
    /// trajectory's record, and the time it took.
    pub(super) fn evaluate(
        &self,
        step: usize,
    ) -> Result<(EvalLine, Vec<EvalTrajectoryLine>, TimingLine), TrainError> {
        let start = Instant::now();
        let sandbox_before = self.sandbox.batch_time();
        let e = &self.manifest.eval;
        let (trajectories, work) = self.rollout(
            &self.tasks.eval,
            e.samples,
            e.temperature,
            &format!("eval/step-{step}"),
            &mut |_, _| {},
        )?;
        let rollout_s = seconds(start.elapsed());
        let (line, rows) = eval_line(step, &self.workflow, &self.tasks, &trajectories)?;
        remove_work(&work)?;
        let timing = TimingLine {
            phase: "eval".into(),
            step,
            wall_s: seconds(start.elapsed()),
            rollout_s,
            sandbox_s: seconds(self.sandbox.batch_time() - sandbox_before),
            ..TimingLine::default()
        };
        Ok((line, rows, timing))
    }

    /// One training step on `batch`: the stages in order, each given what
    /// it reads and returning what it makes.
    pub(super) fn train_step(
        &mut self,
        step: usize,
        batch: &[TaskInput],
    ) -> Result<(TrainLine, Vec<TrajectoryLine>, TimingLine), TrainError> {
        let start = Instant::now();
        let sandbox_before = self.sandbox.batch_time();
        let coach = self
            .coach
            .as_deref()
            .ok_or_else(|| TrainError::Config("training needs a coach".into()))?;
        let r = &self.manifest.rollout;
        let stream = format!("rollout/step-{step}");
        let samples = r.samples_per_prompt;
        let early = rollout_coaching_early(coach, &self.workflow, batch, samples, |on_done| {
            self.rollout(batch, samples, r.temperature, &stream, on_done)
        })?;
        let rollout_s = seconds(start.elapsed());
        let sandbox_s = seconds(self.sandbox.batch_time() - sandbox_before);
        let graded = grade(&self.tasks, &self.workflow, batch, &early.trajectories)?;
        remove_work(&early.work)?;
        let coaching = Instant::now();
        let last = coach_last(coach, &self.workflow, batch, &early.trajectories, &graded)?;
        let coach_last_s = seconds(coaching.elapsed());
        let updating = Instant::now();
        let mut scores = early.scores;
        scores.extend(last);
        let scored = assemble(early.trajectories, graded, scores)?;
        let mask_truncated = self.manifest.rollout.mask_truncated;
        let compare = self.manifest.rollout_logprobs_compare().is_ok();
        let credited = assign_credit(
            &self.learners,
            &self.manifest.credit,
            (mask_truncated, compare),
            &scored,
        )?;
        let loss = loss_config(&self.manifest.train, &self.manifest.credit);
        let agents = update(&mut self.learners, &loss, &credited.samples)?;
        let update_s = seconds(updating.elapsed());
        let (line, rows) = record(step, &self.workflow, &scored, &credited, agents);
        let timing = TimingLine {
            phase: "train".into(),
            step,
            wall_s: seconds(start.elapsed()),
            rollout_s,
            sandbox_s,
            coach_s: seconds(early.coach_time) + coach_last_s,
            coach_last_s,
            update_s,
        };
        Ok((line, rows, timing))
    }
}

/// What stage 1 returns: the trajectories, their working directory (to
/// remove once graded), the early agents' scores and the time spent
/// scoring them.
struct EarlyCoached {
    trajectories: Vec<Trajectory>,
    work: PathBuf,
    scores: ScoresByAgent,
    coach_time: Duration,
}

/// An agent's finished actions, per trajectory index, as a rollout hands
/// them over.
type AgentDone = (usize, Vec<(usize, Vec<ActionRecord>)>);

/// Stage 1: roll out `batch` by `rollout` (`samples` per task); every agent
/// but the last is coached while the next one generates (the last agent's
/// coach may need the graded outcome).
fn rollout_coaching_early(
    coach: &dyn Coach,
    workflow: &Workflow,
    batch: &[TaskInput],
    samples: usize,
    rollout: impl FnOnce(
        &mut dyn FnMut(usize, Vec<(usize, Vec<ActionRecord>)>),
    ) -> Result<(Vec<Trajectory>, PathBuf), TrainError>,
) -> Result<EarlyCoached, TrainError> {
    let last_agent = workflow.agents.len() - 1;
    let (sender, receiver) = std::sync::mpsc::channel::<AgentDone>();
    let (rolled, early) = std::thread::scope(|s| {
        let scorer = s.spawn(move || -> Result<(ScoresByAgent, Duration), TrainError> {
            let mut scored = BTreeMap::new();
            let mut busy = Duration::ZERO;
            for (agent, done) in receiver {
                let mut contexts = Vec::new();
                let mut owners = Vec::new();
                for (i, actions) in &done {
                    let task = &batch[i / samples];
                    contexts.extend(action_contexts(workflow, task, i % samples, actions));
                    owners.push(((*i, agent), actions.len()));
                }
                let start = Instant::now();
                scored.extend(score_owned(coach, &contexts, owners)?);
                busy += start.elapsed();
            }
            Ok((scored, busy))
        });
        let rolled = rollout(&mut |agent, done| {
            if agent != last_agent {
                let _ = sender.send((agent, done));
            }
        });
        drop(sender);
        (rolled, scorer.join().expect("the coaching thread"))
    });
    let (trajectories, work) = rolled?;
    let (scores, coach_time) = early?;
    Ok(EarlyCoached {
        trajectories,
        work,
        scores,
        coach_time,
    })
}

/// Stage 2: grade every trajectory by the task set's grader.
fn grade(
    tasks: &TaskSet,
    workflow: &Workflow,
    batch: &[TaskInput],
    trajectories: &[Trajectory],
) -> Result<Vec<Graded>, TrainError> {
    let by_id = by_id(batch);
    trajectories
        .iter()
        .map(|t| tasks.grader.grade(workflow, task_of(&by_id, t)?, t))
        .collect()
}

/// Stage 3: the last agent's scores, each action shown its trajectory's
/// graded ground truth.
fn coach_last(
    coach: &dyn Coach,
    workflow: &Workflow,
    batch: &[TaskInput],
    trajectories: &[Trajectory],
    graded: &[Graded],
) -> Result<ScoresByAgent, TrainError> {
    let last_agent = workflow.agents.len() - 1;
    let by_id = by_id(batch);
    let mut contexts = Vec::new();
    let mut owners = Vec::new();
    for (i, (t, g)) in trajectories.iter().zip(graded).enumerate() {
        let last: Vec<ActionRecord> = t
            .actions
            .iter()
            .filter(|a| a.agent == last_agent)
            .cloned()
            .collect();
        let task = task_of(&by_id, t)?;
        contexts.extend(
            action_contexts(workflow, task, t.sample, &last)
                .into_iter()
                .map(|mut c| {
                    c.ground_truth = g.ground_truth.clone();
                    c
                }),
        );
        owners.push(((i, last_agent), last.len()));
    }
    score_owned(coach, &contexts, owners)
}

/// Stage 5: every action's reward and advantages, and each agent's
/// training samples, through `mappa-credit`. `mask_truncated`: truncated
/// actions leave the loss; `compare`: the rollout's log-probs are the
/// sampling policy's ([`crate::Manifest::rollout_logprobs_compare`]), so
/// the mismatch is measured (and a correction may use them).
fn assign_credit<B: AutodiffModelBackend>(
    learners: &[AgentLearner<B>],
    credit: &CreditConfig,
    (mask_truncated, compare): (bool, bool),
    scored: &[StepTrajectory],
) -> Result<CreditedStep, TrainError> {
    let rollout: Vec<RolloutTrajectory<'_>> = scored
        .iter()
        .map(|t| RolloutTrajectory {
            group: t.trajectory.group,
            outcome: t.graded.outcome,
            actions: t
                .trajectory
                .actions
                .iter()
                .zip(&t.scores)
                .map(|(a, s)| RolloutAction {
                    agent: a.agent,
                    prompt: &a.prompt_ids,
                    completion: &a.completion_ids,
                    truncated: a.truncated && mask_truncated,
                    score: s.score,
                    // A policy that reports none (a remote one) has none.
                    rollout_logprobs: (compare && a.old_logprobs.len() == a.completion_ids.len())
                        .then_some(a.old_logprobs.as_slice()),
                })
                .collect(),
        })
        .collect();
    build_samples(learners, &rollout, credit)
}

/// Stage 6: one optimiser step per agent on its own samples.
fn update<B: AutodiffModelBackend>(
    learners: &mut [AgentLearner<B>],
    loss: &LossConfig,
    samples: &[Vec<TrainSample>],
) -> Result<Vec<StepMetrics>, TrainError> {
    learners
        .iter_mut()
        .zip(samples)
        .map(|(learner, samples)| Ok(learner.train_step(samples, loss)?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(agent: usize, turn: usize) -> ActionRecord {
        ActionRecord {
            agent,
            role: format!("agent{agent}"),
            turn,
            messages: Vec::new(),
            text: String::new(),
            prompt_ids: Vec::new(),
            completion_ids: Vec::new(),
            old_logprobs: Vec::new(),
            truncated: false,
            code: None,
            tool_observation: None,
            tool_status: None,
            files_available: Vec::new(),
            files_saved: Vec::new(),
        }
    }

    fn score(x: f64) -> ActionScore {
        ActionScore {
            score: x,
            rationale: String::new(),
            fallback: false,
            fallback_reason: None,
            answer_correct: None,
            raw_response: String::new(),
            coach: "test".into(),
            template_sha256: String::new(),
            cached: false,
            audit: None,
        }
    }

    fn trajectory(actions: Vec<ActionRecord>) -> Trajectory {
        Trajectory {
            task_id: "t".into(),
            group: 0,
            sample: 0,
            actions,
            final_output: None,
            workdir: Default::default(),
        }
    }

    fn graded() -> Graded {
        Graded {
            outcome: 1.0,
            ground_truth: None,
        }
    }

    #[test]
    fn scores_go_to_their_actions_and_miscounts_are_errors() {
        let actions = vec![action(0, 0), action(1, 0), action(1, 1), action(2, 0)];
        let scores: ScoresByAgent = [
            ((0, 0), vec![score(1.0)]),
            ((0, 1), vec![score(2.0), score(3.0)]),
            ((0, 2), vec![score(4.0)]),
        ]
        .into();
        let out = assemble(
            vec![trajectory(actions.clone())],
            vec![graded()],
            scores.clone(),
        )
        .unwrap();
        let got: Vec<f64> = out[0].scores.iter().map(|s| s.score).collect();
        assert_eq!(got, [1.0, 2.0, 3.0, 4.0]);

        let mut short = scores.clone();
        short.get_mut(&(0, 1)).unwrap().pop();
        let e = assemble(vec![trajectory(actions.clone())], vec![graded()], short)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no coach score for agent1 action 1"), "{e}");

        let mut long = scores;
        long.get_mut(&(0, 2)).unwrap().push(score(5.0));
        let e = assemble(vec![trajectory(actions)], vec![graded()], long)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("1 coach scores too many for agent 2"), "{e}");
    }
}
