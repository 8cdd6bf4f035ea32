//! The C allocator's settings for the CPU backend's way of allocating.
//!
//! burn-flex allocates a fresh buffer for every operation's output and
//! frees it soon after. By default glibc's `malloc` hands the free top of
//! its heaps back to the kernel once 128 KiB have gathered there, so the
//! next step faults the same pages in again, zeroed: on the arith warm
//! start (three small models fine-tuned on 2 cores) that was 18 s of
//! system time in a 106 s run. [`keep_freed_memory`] keeps freed memory for
//! reuse instead. Allocation does not touch any value, so results are the
//! same bits either way.

/// Tells glibc's `malloc` to keep freed memory in the process (give it back
/// only when 2 GiB are free at a heap's top), to serve every request from
/// its heaps, and to serve every thread from its main heap.
///
/// By default glibc maps each request above its mmap threshold (at most
/// 32 MiB) on its own and unmaps it when freed, so such a buffer was
/// faulted in and zeroed by the kernel on every call: the 25m benchmark's
/// logits (`[8, 128, 8192]` f32, 32 MiB and a header) and their gradient,
/// SmolLM2's (200 MiB). Served from the heap, the 25m forward pass ran
/// 1.05x and its training step 1.07x faster, with `just bench-memory`'s
/// peaks unchanged (`docs/experiments/speed.md`). The one heap is for the
/// threads that run whole steps (`flex/steps.rs`): a thread's own arena
/// is made of mapped heaps of at most 64 MiB, each unmapped as soon as
/// everything in it is freed, so a step's buffers were faulted in again on
/// every step (the 1m training step's page faults went from 22k to 40k per
/// bench run when it moved off the main thread, and back with one heap).
/// Call it at the start of `main`, before other threads exist; elsewhere
/// than glibc it does nothing. The process's peak memory is unchanged;
/// between peaks it no longer shrinks.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes malloc's parameters; called before
    // other threads allocate.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_MAX, 0);
    }
}
