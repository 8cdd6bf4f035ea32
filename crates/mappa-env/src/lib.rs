//! Everything mappa's agents act on and are graded by, with no tensor library.
//!
//! - [`math`]: extracting a final answer from a model's output, normalising
//!   it, and deciding equivalence with a reference answer, exactly (never by
//!   evaluating the answer as code).
//! - [`datasets`]: the AIME/AMC benchmark files: loading, seeded sampling
//!   without replacement, and train/eval overlap checks.
//! - [`math_tasks`]: a seeded generator of small AIME-format problems
//!   (integer answers 0-999) with solution steps and checking programs.
//! - [`slips`]: the mistakes the arith workflow's agents make (the
//!   warm-start teacher's, and a simulated coach's own).
//! - [`tabular`]: DSBench data-modelling tasks: loading the task files,
//!   scoring submissions joined by id, fair aggregate metrics, and a seeded
//!   generator of tabular tasks with known achievable scores.
//! - [`sandbox`]: running untrusted, agent-written Python with limits, no
//!   network and no writes outside its directory; per-agent working
//!   directories and file hand-off.

#![warn(missing_docs)]

pub mod datasets;
pub mod math;
pub mod math_tasks;
pub mod sandbox;
pub mod slips;
pub mod tabular;
