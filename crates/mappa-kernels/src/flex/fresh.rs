//! New output buffers for the CPU kernels, zeroed by the tasks that write
//! them rather than by the calling thread.
//!
//! `vec![0.0; n]` has the thread that asks for a buffer clear it, serially,
//! before any kernel task starts: with freed memory kept for reuse
//! (`crate::alloc`), `calloc` cannot hand out pages known to be zero, so it
//! runs `memset` over recycled memory. In a 1m training step that was about
//! a quarter of the calling thread's time, while rayon's workers waited.
//! Here a buffer is allocated uninitialised and cut into the kernel's task
//! chunks; each task zeroes its own chunk (in cache, just before writing
//! it) and then runs the kernel on it. The kernels see zeroed chunks as
//! before, so every result keeps its bits. Copies ([`copied`]) write
//! their chunks without zeroing them first.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// `N` new buffers of `lens[i]` elements, each cut into chunks of
/// `chunks[i]` elements (the last may be shorter), and
/// `f(task, [chunk of each buffer])` run on every task's chunks, zeroed
/// first: on rayon's threads when there is more than one task, on the
/// calling thread otherwise (handing a small job to rayon's pool from
/// outside it costs two thread switches).
///
/// # Panics
/// If the buffers do not cut into the same number of chunks, or a chunk
/// size is 0 for a non-empty buffer.
pub(super) fn buffers<const N: usize>(
    lens: [usize; N],
    chunks: [usize; N],
    f: impl Fn(usize, [&mut [f32]; N]) + Sync,
) -> [Vec<f32>; N] {
    // SAFETY: `zeroed` initialises every element of every chunk.
    unsafe { uninit_buffers(lens, chunks, |task, parts| f(task, parts.map(zeroed))) }
}

/// A new buffer of `len` elements, copied from slices of other buffers:
/// `sources(start)` yields, in order, the slices that fill the chunk of
/// `chunk` elements that starts at `start` (tasks as in [`buffers`]).
/// Nothing is zeroed first.
///
/// # Panics
/// If a chunk's slices do not add up to its length.
pub(super) fn copied<'a, S: Iterator<Item = &'a [f32]>>(
    len: usize,
    chunk: usize,
    sources: impl Fn(usize) -> S + Sync,
) -> Vec<f32> {
    let fill = |start: usize, out: &mut [MaybeUninit<f32>]| {
        let mut filled = 0;
        for source in sources(start) {
            for (o, &v) in out[filled..filled + source.len()].iter_mut().zip(source) {
                o.write(v);
            }
            filled += source.len();
        }
        assert_eq!(filled, out.len(), "fresh copy: sources of the wrong length");
    };
    // SAFETY: `fill` writes every element of its chunk or panics.
    unsafe { written(len, chunk, fill) }
}

/// A new buffer of `len` elements written by `f(start, chunk)` over chunks of
/// `chunk` elements (`start` is the chunk's first index; tasks as in
/// [`buffers`]). Nothing is zeroed first.
///
/// # Safety
/// `f` must initialise every element of the chunk it is given (or panic).
pub(super) unsafe fn written(
    len: usize,
    chunk: usize,
    f: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    // SAFETY: the caller's promise.
    let [out] = unsafe { uninit_buffers([len], [chunk], |task, [out]| f(task * chunk, out)) };
    out
}

/// [`buffers`] without the zeroing.
///
/// # Safety
/// `f` must initialise every element of the chunks it is given (or panic).
pub(super) unsafe fn uninit_buffers<const N: usize>(
    lens: [usize; N],
    chunks: [usize; N],
    f: impl Fn(usize, [&mut [MaybeUninit<f32>]; N]) + Sync,
) -> [Vec<f32>; N] {
    let mut outs: [Vec<f32>; N] = lens.map(Vec::with_capacity);
    let tasks = lens[0].div_ceil(chunks[0].max(1));
    {
        let mut parts: Vec<_> = outs
            .iter_mut()
            .zip(lens.iter().zip(&chunks))
            .map(|(out, (&len, &chunk))| {
                assert!(
                    len.div_ceil(chunk.max(1)) == tasks && (chunk > 0 || len == 0),
                    "fresh buffers: {len} elements in chunks of {chunk}, expected {tasks} chunks"
                );
                out.spare_capacity_mut()[..len].chunks_mut(chunk.max(1))
            })
            .collect();
        let task_parts: Vec<[&mut [MaybeUninit<f32>]; N]> = (0..tasks)
            .map(|_| {
                std::array::from_fn(|i| parts[i].next().expect("each buffer has `tasks` chunks"))
            })
            .collect();
        if tasks <= 1 {
            task_parts
                .into_iter()
                .enumerate()
                .for_each(|(t, p)| f(t, p));
        } else {
            task_parts
                .into_par_iter()
                .enumerate()
                .for_each(|(t, p)| f(t, p));
        }
    }
    for (out, len) in outs.iter_mut().zip(lens) {
        // SAFETY: the `tasks` chunks cover the first `len` elements of the
        // spare capacity (checked above), and `f` initialised each of them
        // (the caller's promise).
        unsafe { out.set_len(len) };
    }
    outs
}

/// A chunk of uninitialised memory set to `+0.0`, as `&mut [f32]`.
fn zeroed(chunk: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    chunk.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just initialised, and `MaybeUninit<f32>`
    // has the size and alignment of `f32`.
    unsafe { &mut *(chunk as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// A new buffer of `len` elements, `f(start, chunk)` run over chunks of
/// `chunk` elements (`start` is the chunk's first index), each zeroed first.
pub(super) fn in_chunks(
    len: usize,
    chunk: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let [out] = buffers([len], [chunk], |task, [out]| f(task * chunk, out));
    out
}

/// A new buffer of `x`'s length, `f(row, out_row)` run for each row of `d`
/// elements of `x`, [`super::ROWS_PER_TASK`] rows per task.
pub(super) fn rows(x: &[f32], d: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<f32> {
    if d == 0 {
        return Vec::new();
    }
    let chunk = d * super::ROWS_PER_TASK;
    in_chunks(x.len(), chunk, |start, out| {
        for (out, row) in out.chunks_mut(d).zip(x[start..].chunks(d)) {
            f(row, out);
        }
    })
}

/// A new buffer of `a`'s length, `f(a_row, b_row, out_row)` run for each
/// row of `d` elements (tasks as in [`rows`]).
pub(super) fn row_pairs(
    a: &[f32],
    b: &[f32],
    d: usize,
    f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    if d == 0 {
        return Vec::new();
    }
    let chunk = d * super::ROWS_PER_TASK;
    in_chunks(a.len(), chunk, |start, out| {
        let rows = out
            .chunks_mut(d)
            .zip(a[start..].chunks(d))
            .zip(b[start..].chunks(d));
        for ((out, a), b) in rows {
            f(a, b, out);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk reaches the kernel zeroed, once, with its task's index,
    /// whether the buffer was recycled dirty memory or not.
    #[test]
    fn every_chunk_is_zeroed_and_visited_once() {
        for len in [0, 1, 5, 64, 1000, 1 << 15] {
            // Leave dirty memory behind for the allocator to hand out again.
            drop(vec![f32::NAN; len]);
            let [a, b] = buffers([len, len.div_ceil(7)], [7, 1], |task, [a, b]| {
                assert!(a.iter().chain(b.iter()).all(|&v| v.to_bits() == 0));
                for (i, v) in a.iter_mut().enumerate() {
                    *v = (task * 7 + i) as f32;
                }
                b[0] = task as f32;
            });
            assert_eq!(a, (0..len).map(|i| i as f32).collect::<Vec<_>>());
            assert_eq!(
                b,
                (0..len.div_ceil(7)).map(|i| i as f32).collect::<Vec<_>>()
            );
        }
    }

    /// A copy fills each chunk from its sources, across task boundaries.
    #[test]
    fn a_copy_fills_each_chunk_from_its_sources() {
        let source: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let source = &source;
        // Chunks of 30 from runs of 10, read backwards run by run.
        let out = copied(100, 30, |start| {
            let runs = 30.min(100 - start) / 10;
            (0..runs).map(move |r| &source[90 - start - 10 * r..][..10])
        });
        let expected: Vec<f32> = (0..10)
            .rev()
            .flat_map(|r| (10 * r..10 * r + 10).map(|i| i as f32))
            .collect();
        assert_eq!(out, expected);
    }

    #[test]
    #[should_panic(expected = "sources of the wrong length")]
    fn a_copy_must_fill_its_chunks() {
        copied(40, 20, |start| {
            std::iter::once(&[0.0f32; 10][..]).take(start + 1)
        });
    }

    #[test]
    #[should_panic(expected = "expected 2 chunks")]
    fn buffers_must_cut_into_as_many_chunks() {
        buffers([10, 10], [5, 2], |_, _| {});
    }
}
