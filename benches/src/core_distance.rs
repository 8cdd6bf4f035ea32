//! How far apart the machine runs two threads, measured as the round trip of
//! one cache line between them.
//!
//! On the project's 2-vCPU VMs the host moves the two vCPUs between nearby
//! cores (a shared L3) and distant ones, and a step whose two threads hand
//! buffers to each other runs slower in the second case (the 1m training step
//! at about 18k instead of 22k tok/s on an AMD EPYC Zen 4, while one thread
//! alone runs at the same speed in both). `bench_json` records this round trip
//! next to each workload's timing, so that a table can be read with the
//! placement its runs had (docs/experiments/speed.md, "The AMD EPYC Zen 4
//! again").

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Round trips run before the timed ones, so that both threads are running.
const WARM_UP: u32 = 1_000;

/// The flag's values: the line is with the second thread (`PING`), back with
/// the first (`PONG`), or the measurement is over (`STOP`).
const PONG: u32 = 0;
const PING: u32 = 1;
const STOP: u32 = 2;

/// One flag alone on its cache line (and the next, which some CPUs fetch in pairs).
#[repr(align(128))]
struct Line(AtomicU32);

/// The mean time, in nanoseconds, for one thread to hand a cache line to a
/// second thread and get it back, over at most `round_trips` trips and at
/// most `budget` of time (checked every 64 trips; the warm-up has a budget
/// of its own).
///
/// The threads are not pinned: on a 2-CPU machine the two spinning threads
/// take one CPU each. Each side spins without `pause` (which would add its own
/// latency, longer on some CPUs than the trip). Where the two threads share a
/// CPU with other work, a trip waits for time slices, and the result says so
/// by its size; the budget bounds how long that takes.
pub fn core_round_trip_ns(round_trips: u32, budget: Duration) -> f64 {
    let line = Line(AtomicU32::new(PONG));
    let bounce = || {
        line.0.store(PING, Ordering::Release);
        while line.0.load(Ordering::Acquire) != PONG {}
    };
    // Both loops bounce in chunks and look at the clock between chunks.
    let bounce_for = |trips: u32, budget: Duration| {
        let start = Instant::now();
        let mut done = 0;
        while done < trips && start.elapsed() <= budget {
            let chunk = (trips - done).min(64);
            for _ in 0..chunk {
                bounce();
            }
            done += chunk;
        }
        done
    };
    std::thread::scope(|scope| {
        scope.spawn(|| loop {
            match line.0.load(Ordering::Acquire) {
                PING => line.0.store(PONG, Ordering::Release),
                STOP => break,
                _ => {}
            }
        });
        bounce_for(WARM_UP, budget);
        let start = Instant::now();
        let done = bounce_for(round_trips, budget);
        let elapsed = start.elapsed();
        line.0.store(STOP, Ordering::Release);
        elapsed.as_nanos() as f64 / f64::from(done.max(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_takes_a_positive_finite_time() {
        let ns = core_round_trip_ns(10_000, Duration::from_millis(200));
        assert!(ns.is_finite() && ns > 0.0, "round trip {ns} ns");
    }
}
