//! New output buffers for the CPU kernels, written by the tasks that
//! compute them rather than prepared by the calling thread.
//!
//! `vec![0.0; n]` has the thread that asks for a buffer clear it, serially,
//! before any kernel task starts: with freed memory kept for reuse
//! (`crate::alloc`), `calloc` cannot hand out pages known to be zero, so it
//! runs `memset` over recycled memory. In a 1m training step that was about
//! a quarter of the calling thread's time, while rayon's workers waited.
//! Here a buffer is allocated uninitialised and cut into the kernel's task
//! chunks, and each task makes its own chunk:
//! - kernels that write every element before reading any ([`filled`],
//!   [`in_chunks`], [`rows`], [`row_pairs`]) get their chunk uninitialised
//!   and hand it back written (`crate::written`), checked;
//! - kernels that add into their output ([`buffers`]) get their chunk
//!   zeroed, in cache, just before they write it;
//! - copies ([`copied`]) write their chunks from their sources.
//!
//! Either way each element gets the value it got from a zeroed buffer, so
//! every result keeps its bits.

use rayon::prelude::*;
use std::mem::MaybeUninit;

use crate::written::{assume_init_mut, is_written, write_rows};

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
    // SAFETY: every element was just initialised.
    unsafe { assume_init_mut(chunk) }
}

/// `N` new buffers cut into chunks as in [`buffers`], each task's chunks
/// handed to `f(task, chunks)` uninitialised, which returns them written
/// ([`crate::written`]): for kernels that write every element before they
/// read any, which need no zeroing.
///
/// # Panics
/// As [`buffers`] does, and if a chunk comes back as other memory.
pub(super) fn filled<const N: usize>(
    lens: [usize; N],
    chunks: [usize; N],
    f: impl for<'a> Fn(usize, [&'a mut [MaybeUninit<f32>]; N]) -> [&'a mut [f32]; N] + Sync,
) -> [Vec<f32>; N] {
    let task = |task: usize, parts: [&mut [MaybeUninit<f32>]; N]| {
        let handed: [(*const MaybeUninit<f32>, usize); N] =
            std::array::from_fn(|i| (parts[i].as_ptr(), parts[i].len()));
        for (i, (written, (start, len))) in f(task, parts).into_iter().zip(handed).enumerate() {
            assert!(
                is_written(start, len, written),
                "fresh buffers: task {task} gave back other memory for buffer {i}"
            );
        }
    };
    // SAFETY: each chunk came back as a `&mut [f32]` over that same chunk
    // (checked above), so each of its elements holds a value.
    unsafe { uninit_buffers(lens, chunks, task) }
}

/// A new buffer of `len` elements, written by `f(start, chunk)` over chunks
/// of `chunk` elements (`start` is the chunk's first index), which returns
/// its chunk written (tasks as in [`filled`]).
pub(super) fn in_chunks(
    len: usize,
    chunk: usize,
    f: impl Fn(usize, &mut [MaybeUninit<f32>]) -> &mut [f32] + Sync,
) -> Vec<f32> {
    let [out] = filled([len], [chunk], |task, [out]| [f(task * chunk, out)]);
    out
}

/// A new buffer of `x`'s length, written by `f(row, out_row)` for each row
/// of `d` elements of `x` (which returns `out_row` written),
/// [`super::ROWS_PER_TASK`] rows per task.
pub(super) fn rows(
    x: &[f32],
    d: usize,
    f: impl for<'a> Fn(&[f32], &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] + Sync,
) -> Vec<f32> {
    if d == 0 {
        return Vec::new();
    }
    let chunk = d * super::ROWS_PER_TASK;
    in_chunks(x.len(), chunk, |start, out| {
        write_rows(out, d, |i, out| f(&x[start + i * d..][..out.len()], out))
    })
}

/// A new buffer of `a`'s length, written by `f(a_row, b_row, out_row)` for
/// each row of `d` elements (tasks as in [`rows`]).
pub(super) fn row_pairs(
    a: &[f32],
    b: &[f32],
    d: usize,
    f: impl for<'a> Fn(&[f32], &[f32], &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] + Sync,
) -> Vec<f32> {
    if d == 0 {
        return Vec::new();
    }
    let chunk = d * super::ROWS_PER_TASK;
    in_chunks(a.len(), chunk, |start, out| {
        write_rows(out, d, |i, out| {
            let at = start + i * d..start + i * d + out.len();
            f(&a[at.clone()], &b[at], out)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::written::write_all;

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

    /// Written buffers reach the kernel chunk by chunk, once each, and come
    /// back as written; rows are cut within each chunk.
    #[test]
    fn written_buffers_hold_what_each_task_wrote() {
        for len in [0, 1, 5, 64, 1000, 1 << 15] {
            let [a, b] = filled([len, len.div_ceil(7)], [7, 1], |task, [a, b]| {
                let a = write_all(a, (task * 7..).map(|i| i as f32));
                [a, write_all(b, std::iter::once(task as f32))]
            });
            assert_eq!(a, (0..len).map(|i| i as f32).collect::<Vec<_>>());
            assert_eq!(
                b,
                (0..len.div_ceil(7)).map(|i| i as f32).collect::<Vec<_>>()
            );
        }
        let x: Vec<f32> = (0..3 * super::super::ROWS_PER_TASK * 5 + 2)
            .map(|i| i as f32)
            .collect();
        let doubled = rows(&x, 5, |row, out| {
            write_all(out, row.iter().map(|v| 2.0 * v))
        });
        assert_eq!(doubled, x.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
        let summed = row_pairs(&x, &doubled, 5, |a, b, out| {
            write_all(out, a.iter().zip(b).map(|(a, b)| a + b))
        });
        assert_eq!(summed, x.iter().map(|v| 3.0 * v).collect::<Vec<_>>());
    }

    #[test]
    #[should_panic(expected = "task 0 gave back other memory for buffer 0")]
    fn a_written_chunk_must_come_back_as_itself() {
        in_chunks(4, 4, |_, _| Box::leak(Box::new([0.0f32; 4])));
    }

    #[test]
    #[should_panic(expected = "expected 2 chunks")]
    fn buffers_must_cut_into_as_many_chunks() {
        buffers([10, 10], [5, 2], |_, _| {});
    }
}
