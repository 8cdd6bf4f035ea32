//! How fast each CPU the process may run on computes right now: the time of
//! one fixed loop of arithmetic on each, all at once, each on a thread pinned
//! to it.
//!
//! On the project's 2-vCPU VMs the host sometimes runs one vCPU at about two
//! thirds of its usual speed, for seconds to minutes. A step that splits each
//! operation into equal parts for two threads then runs at twice the slow
//! vCPU's pace, and the round trip of [`crate::core_distance`] does not show
//! it (docs/experiments/speed.md, "A fresh clone at `60470f5`").
//! `bench_json` records each CPU's time next to each workload's timing, so
//! that a table's slow runs can be told apart from slow code.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Independent multiply-add chains in the loop: enough for the CPU to run
/// several at once, so that the loop measures throughput, which a busy
/// neighbour on the same physical core takes away, rather than latency.
const CHAINS: usize = 16;

/// `rounds` rounds of [`CHAINS`] multiply-adds; returns their sum, so that
/// the work cannot be skipped.
fn fixed_work(rounds: u32) -> f32 {
    let factors = black_box([1.000_001_f32; CHAINS]);
    let mut sums = [0.0_f32; CHAINS];
    for _ in 0..rounds {
        for (sum, factor) in sums.iter_mut().zip(&factors) {
            *sum = *sum * factor + 1.0e-7;
        }
        sums = black_box(sums);
    }
    sums.iter().sum()
}

/// The microseconds each CPU of the process's affinity mask takes for
/// `rounds` rounds of a fixed loop ([`CHAINS`] multiply-adds each), in CPU
/// order, all CPUs at once from a common start. Empty where the mask cannot
/// be read or a thread cannot be pinned (other systems than Linux).
pub fn cpu_loop_us(rounds: u32) -> Vec<f64> {
    let cpus = allowed_cpus();
    let start = Barrier::new(cpus.len());
    let times: Vec<Option<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let start = &start;
                scope.spawn(move || {
                    let pinned = pin_to(cpu);
                    start.wait();
                    let began = Instant::now();
                    black_box(fixed_work(rounds));
                    let us = began.elapsed().as_secs_f64() * 1e6;
                    pinned.then_some(us)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a CPU's loop panicked"))
            .collect()
    });
    times
        .into_iter()
        .collect::<Option<Vec<f64>>>()
        .unwrap_or_default()
}

/// The CPUs the process may run on.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit set, zeroed, and its size is passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`; whether it could.
#[cfg(target_os = "linux")]
fn pin_to(cpu: usize) -> bool {
    // SAFETY: as in `allowed_cpus`; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

#[cfg(not(target_os = "linux"))]
fn pin_to(_cpu: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allowed_cpu_gets_a_positive_time() {
        let times = cpu_loop_us(20_000);
        assert_eq!(times.len(), allowed_cpus().len());
        assert!(!times.is_empty(), "Linux reports at least one CPU");
        assert!(times.iter().all(|t| t.is_finite() && *t > 0.0), "{times:?}");
    }
}
