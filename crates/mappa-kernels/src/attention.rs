//! Causal grouped-query attention: the mask ([`CausalMask`]), the public
//! entry points ([`attention`], [`dense_attention`]), and the reference
//! kernels made of burn's operations that the trait's defaults run (what
//! the GPU backends use, and what the CPU kernels are checked against).

use burn::prelude::*;
use burn::tensor::ops::FloatTensor;

use crate::{float, primitive, ModelBackend};

/// Which keys each query of [`attention`] sees: causal attention over a
/// left-padded batch. Row `b` of the batch has `pad_left[b]` padding
/// columns; the queries are columns `start..start + seq` and the keys
/// columns `0..start + seq` (earlier columns come from a KV cache). A query
/// at column `c` sees the keys at columns `pad..=c`, and always itself, so
/// that a padding query has one finite score.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CausalMask {
    /// Padding columns at the left of each batch row.
    pub pad_left: Vec<usize>,
    /// The column of the first query.
    pub start: usize,
    /// Queries per head: the `group * seq` query rows of a key/value head
    /// are its `group` query heads' `seq` queries, head-major.
    pub seq: usize,
}

impl CausalMask {
    /// Whether the mask fits scores of `batch` rows, `rows` query rows per
    /// key/value head (whole heads of `seq` queries) and `keys` keys.
    pub fn fits(&self, batch: usize, rows: usize, keys: usize) -> bool {
        self.pad_left.len() == batch
            && self.seq > 0
            && rows.is_multiple_of(self.seq)
            && keys == self.start + self.seq
    }

    /// The keys the query at column `column` of batch row `row` sees: a
    /// range of key columns.
    pub fn keys(&self, row: usize, column: usize) -> std::ops::RangeInclusive<usize> {
        self.pad_left[row].min(column)..=column
    }

    /// The column of query row `r` (of `group * seq`).
    pub fn column(&self, r: usize) -> usize {
        self.start + r % self.seq
    }

    /// The additive bias of query rows `rows` (of the `group * seq` of a
    /// key/value head) against every key, for each of `kv_heads` heads of
    /// each batch row, shaped like their scores (`[batch, kv_heads,
    /// rows.len(), start + seq]`): 0 where a query sees a key, `-inf`
    /// elsewhere. Written out in full (no broadcasting, which CPU backends
    /// do slowly).
    pub fn bias<B: Backend>(
        &self,
        kv_heads: usize,
        rows: std::ops::Range<usize>,
        device: &B::Device,
    ) -> Tensor<B, 4> {
        let batch = self.pad_left.len();
        let (count, keys) = (rows.len(), self.start + self.seq);
        let mut values = Vec::with_capacity(batch * kv_heads * count * keys);
        let mut block = Vec::with_capacity(count * keys);
        for b in 0..batch {
            block.clear();
            for r in rows.clone() {
                let seen = self.keys(b, self.column(r));
                block.extend((0..keys).map(|k| {
                    if seen.contains(&k) {
                        0.0f32
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
            for _ in 0..kv_heads {
                values.extend_from_slice(&block);
            }
        }
        Tensor::from_data(
            TensorData::new(values, [batch, kv_heads, count, keys]),
            device,
        )
    }
}

/// Query rows per block in the default attention kernels: their scores
/// against every key are the largest tensor they hold.
pub const ATTENTION_BLOCK_ROWS: usize = 256;

/// [`ModelBackend::dense_attention_with_probs`] as three operations: the
/// scores `q kᵀ`, their masked softmax and the probabilities times `v`.
pub(crate) fn composed_dense_attention<B: ModelBackend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: &CausalMask,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let scores = B::matmul(q, B::float_swap_dims(k, 2, 3));
    let probs = B::causal_softmax(scores, mask);
    (B::matmul(probs.clone(), v), probs)
}

/// [`ModelBackend::dense_attention_backward`] as the backward passes of
/// [`composed_dense_attention`]'s operations under autodiff: the products'
/// ([`ModelBackend::matmul_rhs_grad`] for each right factor, as a transposed
/// view where `kᵀ` is one), the softmax's, and the transposition of `k`'s.
pub(crate) fn composed_dense_attention_backward<B: ModelBackend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    probs: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let keys_t = B::float_swap_dims(k, 2, 3);
    let v_transposed = B::is_transposed(&v);
    let dp = B::matmul(grad.clone(), B::float_transpose(v));
    let dv = B::matmul_rhs_grad(probs.clone(), grad, v_transposed);
    let ds = B::softmax_last_backward(probs, dp);
    let keys_t_transposed = B::is_transposed(&keys_t);
    let dq = B::matmul(ds.clone(), B::float_transpose(keys_t));
    let dk = B::matmul_rhs_grad(q, ds, keys_t_transposed);
    (dq, B::float_swap_dims(dk, 2, 3), dv)
}

/// [`ModelBackend::causal_attention_with_lse`] by burn's operations (the
/// trait's default, what GPU backends run), `block` query rows at a time:
/// it holds the scores of one block of rows against every key, never all.
pub(crate) fn dense_causal_attention_with_lse<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: &CausalMask,
    block: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let [batch, heads, rows, d] = q.dims();
    let keys_t = k.swap_dims(2, 3);
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for start in (0..rows).step_by(block.max(1)) {
        let end = (start + block.max(1)).min(rows);
        let q = q.clone().slice([0..batch, 0..heads, start..end, 0..d]);
        let scores =
            q.clone().matmul(keys_t.clone()) + mask.bias::<B>(heads, start..end, &q.device());
        let max = scores.clone().max_dim(3);
        let lse = (scores.clone() - max.clone()).exp().sum_dim(3).log() + max;
        let probs = (scores - lse.clone()).exp();
        outs.push(probs.matmul(v.clone()));
        lses.push(lse.squeeze_dim::<3>(3));
    }
    (
        primitive(Tensor::cat(outs, 2)),
        primitive(Tensor::cat(lses, 2)),
    )
}

/// [`ModelBackend::causal_attention_backward`] by burn's operations (the
/// trait's default), `block` query rows at a time; the key and value
/// gradients add up over the blocks in order.
#[allow(clippy::too_many_arguments)] // the trait method's inputs, plus the block size
pub(crate) fn dense_causal_attention_backward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    grad: FloatTensor<B>,
    mask: &CausalMask,
    block: usize,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let (out, grad, lse) = (float::<B, 4>(out), float::<B, 4>(grad), float::<B, 3>(lse));
    let [batch, heads, rows, d] = q.dims();
    let (mut dk, mut dv) = (k.zeros_like(), v.zeros_like());
    let mut dqs = Vec::new();
    for start in (0..rows).step_by(block.max(1)) {
        let end = (start + block.max(1)).min(rows);
        let span = [0..batch, 0..heads, start..end, 0..d];
        let (q, out, grad) = (
            q.clone().slice(span.clone()),
            out.clone().slice(span.clone()),
            grad.clone().slice(span),
        );
        let lse = lse
            .clone()
            .slice([0..batch, 0..heads, start..end])
            .unsqueeze_dim::<4>(3);
        let scores = q.clone().matmul(k.clone().swap_dims(2, 3))
            + mask.bias::<B>(heads, start..end, &q.device());
        let probs = (scores - lse).exp();
        dv = dv + probs.clone().swap_dims(2, 3).matmul(grad.clone());
        let dp = grad.clone().matmul(v.clone().swap_dims(2, 3));
        let ds = probs * (dp - (grad * out).sum_dim(3));
        dqs.push(ds.clone().matmul(k.clone()));
        dk = dk + ds.swap_dims(2, 3).matmul(q);
    }
    (primitive(Tensor::cat(dqs, 2)), primitive(dk), primitive(dv))
}

/// Causal grouped-query attention, `softmax(q k^T + mask) v`, with the
/// bits of [`matmul`], [`causal_softmax`] and `matmul` one after the other
/// (and of their backward passes), as one operation: the probabilities are
/// computed once and kept for the backward pass. On the CPU backend each
/// key/value head's products, softmax and gradients run on one thread,
/// with its scores in that core's caches (for the shapes and layouts it
/// takes; the others run the three operations).
///
/// # Shapes
/// - `q`: `[batch, kv_heads, group * seq, d]`, already scaled by `d^-1/2`
/// - `k`, `v`: `[batch, kv_heads, start + seq, d]`
/// - returns `[batch, kv_heads, group * seq, d]`
pub fn dense_attention<B: ModelBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &CausalMask,
) -> Tensor<B, 4> {
    check_attention_inputs("dense_attention", &q, &k, &v, mask);
    float(B::dense_attention(
        primitive(q),
        primitive(k),
        primitive(v),
        mask,
    ))
}

/// Panics, naming `op`, unless `q`, `k` and `v` have the shapes
/// [`attention`] and [`dense_attention`] take and `mask` fits them.
fn check_attention_inputs<B: Backend>(
    op: &str,
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    mask: &CausalMask,
) {
    let ([b, h, rows, d], [kb, kh, keys, kd]) = (q.dims(), k.dims());
    assert!(
        [b, h, d] == [kb, kh, kd] && k.dims() == v.dims(),
        "{op}: q {:?}, k {:?} and v {:?} do not match",
        q.dims(),
        k.dims(),
        v.dims()
    );
    assert!(
        mask.fits(b, rows, keys),
        "{op}: the mask ({} rows, start {}, seq {}) does not fit q {:?} and k {:?}",
        mask.pad_left.len(),
        mask.start,
        mask.seq,
        q.dims(),
        k.dims()
    );
}

/// Causal grouped-query attention, `softmax(q k^T + mask) v` over the
/// keys `mask` lets each query see, as one operation: on the CPU backend
/// one query row at a time, so that no `rows x keys` score matrix is ever
/// held, and a backward pass that recomputes the probabilities from the
/// rows' log-sum-exp. Each sum runs over the keys in order: the result is
/// fixed by the shapes (the bits differ from `softmax(q k^T + bias) v`
/// computed as three operations).
///
/// # Shapes
/// - `q`: `[batch, kv_heads, group * seq, d]`, already scaled by `d^-1/2`
/// - `k`, `v`: `[batch, kv_heads, start + seq, d]`
/// - returns `[batch, kv_heads, group * seq, d]`
pub fn attention<B: ModelBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &CausalMask,
) -> Tensor<B, 4> {
    check_attention_inputs("attention", &q, &k, &v, mask);
    float(B::causal_attention(
        primitive(q),
        primitive(k),
        primitive(v),
        mask,
    ))
}
