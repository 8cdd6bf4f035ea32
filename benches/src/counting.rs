//! A global allocator that counts the bytes it has out, and a [`Meter`]
//! that reads them: the live bytes beside the resident size, for `just
//! bench-memory` and the tests that hold the memory plan to them.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::memory::{Meter, ProcessMemory};

/// `inner` (the allocator every call goes to, unchanged), counting the
/// bytes allocated and not yet freed, and their peak since the last reset.
/// Declare it as the `#[global_allocator]` static.
pub struct Counting<A> {
    inner: A,
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl<A> Counting<A> {
    /// Counts what `inner` allocates.
    pub const fn new(inner: A) -> Self {
        Self {
            inner,
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated and not yet freed.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    fn added(&self, bytes: usize) {
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to `inner` unchanged; only counters move.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            self.added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(ptr, layout) };
        self.live.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            self.live.fetch_sub(layout.size(), Ordering::Relaxed);
            self.added(new_size);
        }
        p
    }
}

/// Reads a [`Counting`] allocator's live bytes from when it was made, and
/// the process's resident size where given one.
pub struct CountingMeter<A: 'static> {
    counting: &'static Counting<A>,
    base: usize,
    process: Option<ProcessMemory>,
}

impl<A> CountingMeter<A> {
    /// A meter whose baseline is now; `process` adds the resident size.
    pub fn new(counting: &'static Counting<A>, process: Option<ProcessMemory>) -> Self {
        Self {
            counting,
            base: counting.live(),
            process,
        }
    }
}

impl<A> Meter for CountingMeter<A> {
    fn reset(&mut self) {
        if let Some(process) = &mut self.process {
            process.reset();
        }
        self.counting
            .peak
            .store(self.counting.live(), Ordering::Relaxed);
    }
    fn peak(&self) -> Option<u64> {
        self.process.as_ref().and_then(ProcessMemory::peak)
    }
    fn live_peak(&self) -> Option<u64> {
        let peak = self.counting.peak.load(Ordering::Relaxed);
        Some(peak.saturating_sub(self.base) as u64)
    }
    fn live_now(&self) -> Option<u64> {
        Some(self.counting.live().saturating_sub(self.base) as u64)
    }
}
