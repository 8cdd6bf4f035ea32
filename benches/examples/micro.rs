use burn::prelude::*;
use std::time::Instant;
type B = mappa_model::backend::Cpu;

fn time<F: FnMut() -> f32>(name: &str, flops: f64, mut f: F) {
    for _ in 0..2 {
        f();
    }
    let n = 10;
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    let s = t.elapsed().as_secs_f64() / n as f64;
    println!(
        "{name:40} {:8.3} ms  {:6.1} GFLOP/s",
        s * 1e3,
        flops / s / 1e9
    );
}

fn main() {
    let d = Default::default();
    let dist = burn::tensor::Distribution::Normal(0.0, 1.0);
    for (m, k, n) in [
        (1024, 128, 384),
        (1024, 512, 1536),
        (1024, 512, 8192),
        (8, 512, 1536),
    ] {
        let a = Tensor::<B, 2>::random([m, k], dist, &d);
        let w = Tensor::<B, 2>::random([k, n], dist, &d);
        let f = 2.0 * (m * k * n) as f64;
        time(&format!("2d {m}x{k}x{n}"), f, || {
            a.clone()
                .matmul(w.clone())
                .slice([0..1, 0..1])
                .into_scalar()
        });
        let a3 = a.clone().reshape([8, m / 8.max(1), k]);
        if m >= 8 {
            time(&format!("3d bcast {m}x{k}x{n}"), f, || {
                a3.clone()
                    .matmul(w.clone().unsqueeze::<3>())
                    .slice([0..1, 0..1, 0..1])
                    .into_scalar()
            });
            let l = burn::nn::Linear {
                weight: burn::module::Param::from_tensor(w.clone()),
                bias: None,
            };
            time(&format!("nn::Linear 3d {m}x{k}x{n}"), f, || {
                l.forward(a3.clone())
                    .slice([0..1, 0..1, 0..1])
                    .into_scalar()
            });
        }
    }
    let x = Tensor::<B, 3>::random([8, 128, 512], dist, &d);
    time("elementwise mul 512k", 0.0, || {
        (x.clone() * x.clone())
            .slice([0..1, 0..1, 0..1])
            .into_scalar()
    });
    time("silu 512k", 0.0, || {
        burn::tensor::activation::silu(x.clone())
            .slice([0..1, 0..1, 0..1])
            .into_scalar()
    });
    time("silu as x/(1+exp(-x))", 0.0, || {
        (x.clone() / ((-x.clone()).exp() + 1.0))
            .slice([0..1, 0..1, 0..1])
            .into_scalar()
    });
    time("exp 512k", 0.0, || {
        x.clone().exp().slice([0..1, 0..1, 0..1]).into_scalar()
    });
    let s = Tensor::<B, 4>::random([8, 8, 128, 128], dist, &d);
    time("softmax 8x8x128x128", 0.0, || {
        burn::tensor::activation::softmax(s.clone(), 3)
            .slice([0..1, 0..1, 0..1, 0..1])
            .into_scalar()
    });
    let q = Tensor::<B, 4>::random([8, 4, 256, 64], dist, &d);
    let k = Tensor::<B, 4>::random([8, 4, 128, 64], dist, &d);
    time(
        "attn scores q@kT [8,4,256,64]x[..128]",
        2.0 * 8.0 * 4.0 * 256.0 * 128.0 * 64.0,
        || {
            q.clone()
                .matmul(k.clone().swap_dims(2, 3))
                .slice([0..1, 0..1, 0..1, 0..1])
                .into_scalar()
        },
    );
    let xs = Tensor::<B, 4>::random([8, 128, 8, 64], dist, &d);
    time("swap_dims+reshape copy", 0.0, || {
        xs.clone()
            .swap_dims(1, 2)
            .reshape([8, 8 * 128, 64])
            .slice([0..1, 0..1, 0..1])
            .into_scalar()
    });
}
#[allow(dead_code)]
fn silu_variants() {}
