//! A parallel map over a slice on a fixed number of scoped threads, for
//! work that blocks (sandboxed programs, HTTP requests) rather than
//! computes. Each thread takes the next item until none is left, so the
//! number of threads is the cap whatever the number of items: a rollout of
//! 1,200 trajectories runs its programs on `max_workers` threads, not on
//! 1,200 (whose stacks made every `fork` of a sandboxed program copy
//! thousands of mappings).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f` applied to every item of `items`, on at most `workers` threads
/// (at least one); the results in the order of `items`. With one worker, or
/// one item, everything runs on the calling thread.
pub fn map_bounded<T, R, F>(items: &[T], workers: usize, f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    let workers = workers.max(1).min(items.len());
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let result = f(item);
                *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item was mapped")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn results_keep_the_order_and_threads_stay_within_the_cap() {
        let items: Vec<u64> = (0..200).collect();
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let out = map_bounded(&items, 3, |&x| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(200));
            running.fetch_sub(1, Ordering::SeqCst);
            x * x
        });
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
        let most = most.load(Ordering::SeqCst);
        assert!((1..=3).contains(&most), "{most} at once");
    }

    #[test]
    fn no_items_and_zero_workers_are_fine() {
        assert!(map_bounded(&[] as &[u8], 4, |&x| x).is_empty());
        assert_eq!(map_bounded(&[1, 2], 0, |&x| x + 1), [2, 3]);
    }
}
