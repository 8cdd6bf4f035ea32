//! The task-tied coach fails where the agents fail; the input-only coach's
//! mistakes are independent of theirs. Agents here are simulated Problem
//! Solvers that slip the structural way with a probability tilted by each
//! problem's difficulty, as the warm-started agents learn from the teacher
//! (`warm_start.difficulty_weight`); both coaches judge every action and the
//! audit's error table gives the correlation.

use mappa_core::rng::SeedTree;
use mappa_env::math_tasks::{generate, Tier};
use mappa_env::slips::{rate_for, slip, SlipKind};
use mappa_judge::scripted::{ScriptedCoach, ScriptedConfig, Strength, View};
use mappa_judge::{ActionContext, ErrorTable, KnownSolution};

/// The error table of `view` (slip rate 0.1) over `samples` attempts at each
/// of 300 problems by agents slipping at 0.3, both with difficulty weight 2
/// (the input-only view: the agents' only).
fn errors_of(view: View, samples: u64) -> ErrorTable {
    let w = 2.0;
    let coach = ScriptedCoach::new(ScriptedConfig {
        seed: 3,
        slip_rate: 0.1,
        slips: SlipKind::Structural,
        difficulty_weight: if view == View::TaskTied { w } else { 0.0 },
        ..ScriptedConfig::new(view, Strength::Strong)
    })
    .unwrap();
    let agents = SeedTree::new(9);
    let mut table = ErrorTable::default();
    for problem in generate(Tier::SmallArithmetic, 300, 17) {
        let right = problem.expression().to_string();
        for sample in 0..samples {
            let mut rng = agents.stream(&format!("{}/{sample}", problem.id));
            let p = rate_for(0.3, w, &right);
            let plan = if rng.uniform() < p {
                slip(SlipKind::Structural, "problem_solver", &right, &mut rng)
            } else {
                right.clone()
            };
            let ctx = ActionContext {
                id: format!("{}/{sample}/problem_solver", problem.id),
                task: problem.statement().to_string(),
                role: "problem_solver".into(),
                agent_input: format!("[user]\n{}", problem.statement()),
                output: format!("Plan: {plan}"),
                solution: Some(KnownSolution {
                    task_kind: "small_arithmetic".into(),
                    answer: Some(problem.answer.to_string()),
                    plan: Some(right.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            table.add(coach.score_one(&ctx).unwrap().audit.unwrap());
        }
    }
    table
}

#[test]
fn the_task_tied_coach_errs_where_the_agents_err() {
    let tied = errors_of(View::TaskTied, 4);
    let independent = errors_of(View::InputOnly, 4);
    let (tied_phi, independent_phi) = (tied.phi().unwrap(), independent.phi().unwrap());
    assert!(tied_phi > 0.1, "task-tied phi {tied_phi:+.3}: {tied:?}");
    assert!(
        independent_phi.abs() < 0.06,
        "input-only phi {independent_phi:+.3}: {independent:?}"
    );
    // At the same base slip rate, both coaches are about 90% accurate.
    for table in [tied, independent] {
        let accuracy = table.coach_accuracy().unwrap();
        assert!((0.85..0.95).contains(&accuracy), "{accuracy}: {table:?}");
    }
}
