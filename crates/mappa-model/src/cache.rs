//! The key/value cache of incremental decoding.
//!
//! Each layer's keys and values live in tensors allocated once for the whole
//! generation (`[batch, kv_heads, capacity, head_dim]`); every forward call
//! writes its new columns in place and attends over the filled prefix.

use burn::prelude::*;
use mappa_kernels as kernels;

/// Cached keys and values of one layer.
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
    len: usize,
}

impl<B: kernels::ModelBackend> LayerCache<B> {
    /// Writes the new keys and values after the cached ones and returns the
    /// keys and values of all columns so far.
    ///
    /// # Shapes
    /// - `k`, `v`: `[batch, kv_heads, new, head_dim]`
    /// - returns two tensors `[batch, kv_heads, len + new, head_dim]`
    pub fn append(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [b, h, new, d] = k.dims();
        let capacity = self.keys.dims()[2];
        let end = self.len + new;
        assert!(
            end <= capacity,
            "KV cache overflow: {end} columns needed, capacity {capacity}"
        );
        let span = [0..b, 0..h, self.len..end, 0..d];
        // The write consumes the tensor: swap in a placeholder so that the
        // backend can write in place, holding the only reference (burn's
        // `slice_assign` on the CPU backend copies the whole buffer anyway,
        // hence `kernels::write_slice`).
        let keys = std::mem::replace(&mut self.keys, Tensor::empty([0, 0, 0, 0], &k.device()));
        let values = std::mem::replace(&mut self.values, Tensor::empty([0, 0, 0, 0], &v.device()));
        self.keys = kernels::write_slice(keys, span.clone(), k);
        self.values = kernels::write_slice(values, span, v);
        self.len = end;
        let filled = [0..b, 0..h, 0..end, 0..d];
        (
            self.keys.clone().slice(filled.clone()),
            self.values.clone().slice(filled),
        )
    }
}

/// Cached keys and values of every layer, and the number of columns filled.
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache.
    pub fn new(
        num_layers: usize,
        batch: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        device: &B::Device,
    ) -> Self {
        let layers = (0..num_layers)
            .map(|_| LayerCache {
                keys: Tensor::zeros([batch, kv_heads, capacity, head_dim], device),
                values: Tensor::zeros([batch, kv_heads, capacity, head_dim], device),
                len: 0,
            })
            .collect();
        Self { layers, len: 0 }
    }

    /// Number of columns cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cache of layer `i`.
    pub(crate) fn layer_mut(&mut self, i: usize) -> &mut LayerCache<B> {
        &mut self.layers[i]
    }

    /// Records that `n` more columns were written to every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.layers.iter().all(|l| l.len == self.len));
    }
}
