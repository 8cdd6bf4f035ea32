//! The memory allocator of mappa's binaries, chosen for the CPU backend's
//! way of allocating.
//!
//! burn-flex allocates a fresh buffer for every operation's output and
//! frees it soon after, and a step's operations run on two or more threads
//! at once; gemm allocates its packing buffers on every call. Under glibc's
//! `malloc` those threads either shared one heap, with one lock for every
//! allocation and free (the setting that kept freed memory: a thread's own
//! glibc heap is unmapped as soon as it is empty, so a step's buffers were
//! faulted in again every step), or faulted their memory in again.
//! mimalloc ([`Allocator`]) gives each thread heaps of its own that keep
//! their freed memory, with no lock between threads, and backs them with
//! transparent huge pages where the kernel allows. Against glibc so set,
//! in alternating pairs on an Intel Xeon: the 1m forward pass 1.11x, its
//! training step 1.07x, 25m generation 1.10x; SmolLM2's peak memory in
//! `just bench-memory` 7-15% higher (`docs/experiments/speed.md`).
//! Allocation does not touch any value, so results are the same bits
//! either way.
//!
//! A binary declares it and calls [`keep_freed_memory`] first thing:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: mappa_kernels::alloc::Allocator = mappa_kernels::alloc::Allocator;
//!
//! fn main() {
//!     mappa_kernels::alloc::keep_freed_memory();
//!     // ...
//! }
//! ```

/// The global allocator of mappa's binaries: mimalloc (its 3.x series).
pub use mimalloc::MiMalloc as Allocator;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_t`, which
/// the Rust bindings do not name): how many milliseconds mimalloc waits
/// before it hands freed memory back to the kernel (1000 by default); -1
/// for never.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc to keep freed memory for reuse rather than hand it back
/// to the kernel a second after it is freed, for the next step to fault in
/// again, zeroed. The process's peak memory is unchanged; between peaks it
/// no longer shrinks. Call it at the start of `main`, before other threads
/// exist; it only matters where [`Allocator`] is the global allocator.
pub fn keep_freed_memory() {
    // SAFETY: setting an option only changes mimalloc's parameters; called
    // before other threads allocate.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
}

#[cfg(test)]
mod tests {
    /// [`super::PURGE_DELAY`] names the option whose default is 1000 ms,
    /// between a deprecated one (1) and `use_numa_nodes` (0). Fails if
    /// `MIMALLOC_PURGE_DELAY` is set in the environment.
    #[test]
    fn purge_delay_is_mimallocs_option() {
        use libmimalloc_sys::mi_option_get;
        // SAFETY: reading an option has no other effect.
        let [before, delay, after] =
            [14, super::PURGE_DELAY, 16].map(|option| unsafe { mi_option_get(option) });
        assert_eq!([before, delay, after], [1, 1000, 0]);
    }
}
