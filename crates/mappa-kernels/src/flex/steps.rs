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
//! The pool's other threads stay awake for the whole step ([`keep_busy`]).
//! A rayon worker that finds no work yields a few rounds and then sleeps,
//! and waking it costs the issuing thread a system call and the step the
//! wake-up's latency (tens of microseconds in a virtual machine): between
//! two operations, the issuing thread's serial work (autodiff bookkeeping,
//! allocation) is often long enough for the workers to fall asleep, so
//! every small operation paid one. OpenMP runtimes keep their threads
//! spinning for a while in the same way. While a thread waits it yields
//! its core to whatever else is runnable, so other threads of the process
//! (tests run side by side) are not starved.
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
/// on a rayon pool's thread already, with the pool's other threads kept
/// busy on its tasks ([`keep_busy`]) until it returns; on the calling thread
/// otherwise. A panic in `f` reaches the caller and frees the pool.
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
    let _free = StoreOnDrop(&BUSY, false);
    pool.install(|| {
        let issuer = rayon::current_thread_index();
        let done = AtomicBool::new(false);
        rayon::scope(|scope| {
            scope.spawn_broadcast(|_, thread| {
                if Some(thread.index()) != issuer {
                    keep_busy(&done);
                }
            });
            let _done = StoreOnDrop(&done, true);
            f()
        })
    })
}

/// Runs the step's tasks as they come, yielding the core between polls,
/// until `done`: a pool thread that ran out of work would otherwise go to
/// sleep after a few microseconds, and the step's next operation would pay
/// for waking it. Which thread runs a task changes no bit (threads never
/// split a sum).
fn keep_busy(done: &AtomicBool) {
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
}

/// Stores its value in its flag when dropped, also while a panic unwinds:
/// the step's end for [`keep_busy`], the pool's release in [`BUSY`].
struct StoreOnDrop<'a>(&'a AtomicBool, bool);

impl Drop for StoreOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
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
