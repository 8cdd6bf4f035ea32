//! Whole steps (a generation, a forward pass, a training step) run on a
//! thread of a kernel pool rather than on the thread that asks for them.
//!
//! A kernel called from outside rayon's pool hands its tasks to the pool
//! and sleeps until they are done: every operation of a step pays a wake-up
//! of the workers and one of the caller, and the workers idle through the
//! caller's serial work between operations. A step run on one of the
//! pool's own threads splits its operations as rayon does inside a pool:
//! that thread works on the tasks itself while the others steal, and
//! nobody sleeps between operations. Measured in
//! `docs/experiments/speed.md`, steps interleaved one by one in one process:
//! about +7% for the 1m training step and +22-30% for generation at 1m and
//! 25m.
//!
//! The pool is mappa's own, not rayon's global one, and hosts one step at a
//! time. Two steps on one pool can deadlock: a worker waiting for its own
//! step's tasks may take up the other step and run it on top of its own,
//! which then waits for whatever the other step holds (two learners in one
//! process hung that way, with rayon's global pool). A step that finds the
//! pool busy, or that is already on a thread of some rayon pool (a warm-start
//! role's one-thread pool, a step inside a step), runs where it is, as
//! before. Threads never split a sum (see [`super`]), so where a step runs
//! changes no bit of its results.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The pool's threads' stacks: as large as a main thread's (8 MiB) and then
/// some, since a step that ran on the main thread may now run here.
const STACK_BYTES: usize = 16 << 20;

/// The step pool; `None` if its threads could not be started (steps then
/// run on their callers' threads, with the same results).
static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// Whether a step is running on [`POOL`].
static BUSY: AtomicBool = AtomicBool::new(false);

/// Runs `f` on a thread of the step pool if it is free and the caller is not
/// on a rayon pool's thread already; on the calling thread otherwise.
/// A panic in `f` reaches the caller and frees the pool.
pub(crate) fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let Some(pool) = POOL.get_or_init(start).as_ref() else {
        return f();
    };
    if BUSY
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return f();
    }
    let _held = Held;
    pool.install(f)
}

/// Frees the pool when dropped, also while a panic unwinds.
struct Held;

impl Drop for Held {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

/// A pool with as many threads as rayon's global one (`RAYON_NUM_THREADS`,
/// or one per core).
fn start() -> Option<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .stack_size(STACK_BYTES)
        .thread_name(|i| format!("mappa-step-{i}"))
        .build()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// One test, not several: the pool is shared by the whole process, and
    /// tests run at once would find it busy at random.
    #[test]
    fn steps_run_on_the_pool_one_at_a_time_and_a_panic_frees_it() {
        // A step runs on one of the pool's threads, and a step inside it
        // runs where it is.
        let (outer, inner) = run(|| {
            let here = std::thread::current().name().map(str::to_owned);
            (
                here,
                run(|| std::thread::current().name().map(str::to_owned)),
            )
        });
        assert!(
            outer
                .as_deref()
                .is_some_and(|n| n.starts_with("mappa-step-")),
            "{outer:?}"
        );
        assert_eq!(inner, outer);

        // Two steps at once: both must be inside at the same time for the
        // barrier to let either go, so the second cannot wait behind the
        // first (it runs on its own thread) nor be nested under it.
        let barrier = Barrier::new(2);
        let names: Vec<Option<String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        run(|| {
                            barrier.wait();
                            std::thread::current().name().map(str::to_owned)
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let on_pool = names
            .iter()
            .filter(|n| n.as_deref().is_some_and(|n| n.starts_with("mappa-step-")))
            .count();
        assert_eq!(on_pool, 1, "{names:?}");

        // A panic reaches the caller and leaves the pool free.
        let caught = std::panic::catch_unwind(|| run(|| panic!("a failing step")));
        assert!(caught.is_err());
        assert!(!BUSY.load(Ordering::Acquire));
        let after = run(|| std::thread::current().name().map(str::to_owned));
        assert!(
            after
                .as_deref()
                .is_some_and(|n| n.starts_with("mappa-step-")),
            "{after:?}"
        );
    }
}
