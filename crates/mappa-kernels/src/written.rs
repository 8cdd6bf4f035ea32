//! Kernel outputs written straight into uninitialised memory, without unsafe
//! code in the kernels.
//!
//! A new output buffer needs no zeroing when its kernel writes every element
//! before it reads any: zeroing it first only doubles the stores. A kernel's
//! first pass therefore writes a `&mut [MaybeUninit<f32>]` through
//! [`write_all`] (or [`write_rows`], row by row), which hands the same memory
//! back as `&mut [f32]` once every element holds a value. The buffer code
//! (`flex/fresh.rs`) takes a kernel's word for nothing: it checks that what
//! comes back is the memory it handed out, which safe code can only have
//! produced by writing all of it.

use std::mem::MaybeUninit;

/// `out[i]` set to the `i`-th of `values` for every element of `out`, which
/// is returned as written `f32`s. The loop vectorises as a plain `zip` does.
///
/// # Panics
/// If `values` ends before `out` does.
#[inline(always)]
pub(crate) fn write_all(
    out: &mut [MaybeUninit<f32>],
    values: impl Iterator<Item = f32>,
) -> &mut [f32] {
    let mut written = 0;
    for (o, v) in out.iter_mut().zip(values) {
        o.write(v);
        written += 1;
    }
    assert_eq!(
        written,
        out.len(),
        "write_all: {written} values for {} elements",
        out.len()
    );
    // SAFETY: the loop wrote each of `out`'s elements (counted just above).
    unsafe { assume_init_mut(out) }
}

/// `out` cut into rows of `d` elements (the last may be shorter), each
/// written by `row(index, row)`, which returns that row written; `out` is
/// then returned written.
///
/// # Panics
/// If `d` is 0 for a non-empty `out`, or a row comes back as other memory
/// (see [`is_written`]).
#[inline(always)]
pub(crate) fn write_rows(
    out: &mut [MaybeUninit<f32>],
    d: usize,
    mut row: impl FnMut(usize, &mut [MaybeUninit<f32>]) -> &mut [f32],
) -> &mut [f32] {
    if !out.is_empty() {
        for (i, chunk) in out.chunks_mut(d).enumerate() {
            let (start, len) = (chunk.as_ptr(), chunk.len());
            assert!(
                is_written(start, len, row(i, chunk)),
                "write_rows: row {i} came back as other memory"
            );
        }
    }
    // SAFETY: every row of `out` came back as a `&mut [f32]` over that same
    // row (checked above), so each of its elements holds a value.
    unsafe { assume_init_mut(out) }
}

/// `chunk` as the values it holds (what `<[MaybeUninit<f32>]>::assume_init_mut`
/// does from Rust 1.93, newer than this workspace's minimum).
///
/// # Safety
/// Every element of `chunk` must have been written.
pub(crate) unsafe fn assume_init_mut(chunk: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: the caller's promise; `MaybeUninit<f32>` has the size and
    // alignment of `f32`.
    unsafe { &mut *(chunk as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// Whether `written` is the `len` elements that start at `start`: the
/// memory a kernel was handed uninitialised, come back as `f32`s. Safe code
/// cannot make a `&mut [f32]` over uninitialised memory, so if it is, each
/// element holds a value.
pub(crate) fn is_written(start: *const MaybeUninit<f32>, len: usize, written: &[f32]) -> bool {
    std::ptr::eq(written.as_ptr(), start.cast::<f32>()) && written.len() == len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uninit(len: usize) -> Vec<MaybeUninit<f32>> {
        vec![MaybeUninit::uninit(); len]
    }

    #[test]
    fn write_all_writes_every_element_in_order() {
        let mut out = uninit(37);
        let written = write_all(&mut out, (0..40).map(|i| i as f32));
        assert_eq!(written, (0..37).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    #[should_panic(expected = "3 values for 4 elements")]
    fn write_all_needs_a_value_for_each_element() {
        write_all(&mut uninit(4), [1.0, 2.0, 3.0].into_iter());
    }

    #[test]
    fn write_rows_visits_each_row_once_the_last_one_short() {
        let mut out = uninit(10);
        let mut seen = Vec::new();
        let written = write_rows(&mut out, 4, |i, row| {
            seen.push((i, row.len()));
            write_all(row, std::iter::repeat(i as f32))
        });
        assert_eq!(written, [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0]);
        assert_eq!(seen, [(0, 4), (1, 4), (2, 2)]);
        assert!(write_rows(&mut [], 0, |_, row| write_all(row, std::iter::empty())).is_empty());
    }

    #[test]
    #[should_panic(expected = "row 0 came back as other memory")]
    fn write_rows_rejects_a_row_that_is_not_the_one_handed_out() {
        write_rows(&mut uninit(4), 2, |_, _| Box::leak(Box::new([0.0f32; 2])));
    }
}
