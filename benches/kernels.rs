//! What the fixed summation order costs: each of `mappa-kernels`' CPU
//! operations against burn's own on the same tensors, at the shapes of the
//! 25m config's training step (batch 8 x 128 tokens, hidden 512, MLP 1536,
//! 8 heads, vocab 8192), SwiGLU with its exponential, and decoding's
//! products over every weight of a 25m decoding step (no counterpart: burn
//! packs each weight for such a product). `just bench-kernels` runs it.

// `criterion_group!` defines a public function without docs.
#![allow(missing_docs)] // criterion's macros generate undocumented items

use burn::prelude::*;
use criterion::{criterion_group, criterion_main, Criterion};
use mappa_model::backend::Cpu;
use mappa_model::kernels;

fn tensor<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<Cpu, D> {
    let n: usize = shape.iter().product();
    let mut rng = mappa_core::rng::RngStream::from_u64(seed);
    let values: Vec<f32> = (0..n).map(|_| rng.uniform() as f32 - 0.5).collect();
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

fn benches(c: &mut Criterion) {
    let tokens = 8 * 128;
    let mut group = c.benchmark_group("kernels-25m");
    group.sample_size(10);
    matmuls(&mut group, tokens);
    normalisations(&mut group, tokens);
    activations(&mut group, tokens);
    decoding(&mut group);
    group.finish();
}

/// The step's products against burn's.
fn matmuls(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    tokens: usize,
) {
    // A projection (k = 512), the down projection (k = 1536) and a weight
    // gradient (k = 1024 token rows).
    for (name, m, k, n) in [
        ("matmul x.W (1024x512 @ 512x1536)", tokens, 512, 1536),
        ("matmul x.W (1024x1536 @ 1536x512)", tokens, 1536, 512),
        ("matmul dW (512x1024 @ 1024x1536)", 512, tokens, 1536),
    ] {
        let (a, b) = (tensor([m, k], 1), tensor([k, n], 2));
        group.bench_function(format!("{name}/burn"), |bench| {
            bench.iter(|| a.clone().matmul(b.clone()).into_primitive())
        });
        group.bench_function(format!("{name}/mappa"), |bench| {
            bench.iter(|| kernels::matmul(a.clone(), b.clone()).into_primitive())
        });
    }
}

/// Softmax, log-softmax and RMSNorm against burn's.
fn normalisations(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    tokens: usize,
) {
    let scores = tensor([8, 8, 128, 128], 3);
    group.bench_function("softmax [8,8,128,128]/burn", |bench| {
        bench.iter(|| burn::tensor::activation::softmax(scores.clone(), 3).into_primitive())
    });
    group.bench_function("softmax [8,8,128,128]/mappa", |bench| {
        bench.iter(|| kernels::softmax(scores.clone()).into_primitive())
    });

    let logits = tensor([8, 128, 8192], 4);
    group.bench_function("log_softmax [8,128,8192]/burn", |bench| {
        bench.iter(|| burn::tensor::activation::log_softmax(logits.clone(), 2).into_primitive())
    });
    group.bench_function("log_softmax [8,128,8192]/mappa", |bench| {
        bench.iter(|| kernels::log_softmax(logits.clone()).into_primitive())
    });

    let (x, gamma) = (tensor([tokens, 512], 5), tensor([512], 6));
    group.bench_function("rms_norm [1024,512]/burn", |bench| {
        bench.iter(|| {
            let rms = (x.clone().square().mean_dim(1) + 1e-6).sqrt();
            (x.clone() / rms * gamma.clone().unsqueeze::<2>()).into_primitive()
        })
    });
    group.bench_function("rms_norm [1024,512]/mappa", |bench| {
        bench.iter(|| kernels::rms_norm(x.clone(), gamma.clone(), 1e-6).into_primitive())
    });
}

/// SwiGLU and the exponentials inside it and the softmax.
fn activations(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    tokens: usize,
) {
    // SwiGLU at the MLP's width, and the exponential inside its sigmoid:
    // the C library's `expf` one call per value against `mappa-kernels`'
    // vectorised port of it (same bits).
    let (gate, up) = (tensor([tokens, 1536], 7), tensor([tokens, 1536], 8));
    group.bench_function("swiglu [1024,1536]/burn", |bench| {
        bench.iter(|| (burn::tensor::activation::silu(gate.clone()) * up.clone()).into_primitive())
    });
    group.bench_function("swiglu [1024,1536]/mappa", |bench| {
        bench.iter(|| kernels::swiglu(gate.clone(), up.clone()).into_primitive())
    });
    let values: Vec<f32> = gate.to_data().to_vec().expect("f32 values");
    group.bench_function("exp [1024*1536]/C library", |bench| {
        bench.iter(|| mapped(&values, |v| v.iter_mut().for_each(|x| *x = x.exp())))
    });
    group.bench_function("exp [1024*1536]/mappa", |bench| {
        bench.iter(|| mapped(&values, kernels::expf::exp_in_place))
    });
    // The softmax's exponential (the `libm` crate's `expf`), one call per
    // value against the vectorised port (same bits), on values of a
    // softmax's range (at most 0).
    let shifted: Vec<f32> = values.iter().map(|x| -x.abs()).collect();
    group.bench_function("libm expf [1024*1536]/libm", |bench| {
        bench.iter(|| mapped(&shifted, |v| v.iter_mut().for_each(|x| *x = libm::expf(*x))))
    });
    group.bench_function("libm expf [1024*1536]/mappa", |bench| {
        bench.iter(|| mapped(&shifted, kernels::expf::libm_exp_in_place))
    });
}

/// Decoding's products (no counterpart in burn).
fn decoding(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    // Decoding's products: every weight of one 25m decoding step (each
    // layer's projections and the tied LM head, about 105 MB) times the
    // step's eight token rows (`W xᵀ`), the weights read from memory as in
    // generation.
    let config = mappa_benches::Size::M25.config();
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let (q, kv) = (
        config.num_heads * config.head_dim,
        config.num_kv_heads * config.head_dim,
    );
    let layer = [
        (q, hidden),
        (kv, hidden),
        (kv, hidden),
        (hidden, q),
        (inter, hidden),
        (inter, hidden),
        (hidden, inter),
    ];
    let shapes = (0..config.num_layers)
        .flat_map(|_| layer)
        .chain([(config.vocab_size, hidden)]);
    let products: Vec<_> = shapes
        .zip(100u64..)
        .map(|((out, inp), seed)| (tensor([out, inp], seed), tensor([8, inp], seed + 1000)))
        .collect();
    group.bench_function(
        "decode W xT, a 25m step's weights (8 tokens)/mappa",
        |bench| {
            bench.iter(|| {
                for (w, x) in &products {
                    std::hint::black_box(
                        kernels::matmul(w.clone(), x.clone().transpose()).into_primitive(),
                    );
                }
            })
        },
    );
}

/// A copy of `values` with `f` applied in place (the copy is timed too,
/// alike on both sides of a comparison).
fn mapped(values: &[f32], f: impl Fn(&mut [f32])) -> Vec<f32> {
    let mut v = values.to_vec();
    f(&mut v);
    v
}

criterion_group!(kernel_benches, benches);
criterion_main!(kernel_benches);
