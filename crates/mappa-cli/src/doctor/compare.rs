//! How `mappa doctor` compares numbers from the device with the CPU's: the
//! tolerances (fixed here, per dtype, before any GPU ran them), the
//! distances it measures, and the walk over a model's parameters by path
//! that names the first parameter whose values differ.

use std::marker::PhantomData;

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use mappa_model::AutodiffModelBackend;
use serde::Serialize;

/// The tolerances of one dtype. Distances are relative to the reference's
/// scale (see [`rel_max`] and [`rel_l2`]) except the log-probs', which are
/// absolute (nats).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tolerance {
    /// The dtype the tolerances are for.
    pub dtype: &'static str,
    /// Logits: [`rel_max`].
    pub logits: f64,
    /// Per-token log-probs: largest absolute difference.
    pub logprobs: f64,
    /// A loss: relative difference.
    pub loss: f64,
    /// A gradient norm: relative difference.
    pub grad_norm: f64,
    /// Each parameter's gradient: [`rel_l2`].
    pub gradient: f64,
}

/// f32 everywhere (mappa's training dtype): a device's f32 products sum in
/// another order than the CPU's (blocked, fused, atomics), which moves the
/// last bits of each product and compounds through the layers.
pub const F32: Tolerance = Tolerance {
    dtype: "f32",
    logits: 1e-3,
    logprobs: 2e-3,
    loss: 1e-4,
    grad_norm: 1e-3,
    gradient: 5e-3,
};

/// A bf16 base (`train.base_dtype = "bf16"`): the base's weights are
/// rounded to 8 bits of mantissa on both sides alike, but a device may
/// multiply in bf16 where the CPU widens to f32 first.
pub const BF16: Tolerance = Tolerance {
    dtype: "bf16",
    logits: 2e-2,
    logprobs: 5e-2,
    loss: 2e-3,
    grad_norm: 2e-2,
    gradient: 5e-2,
};

/// `max |a - b| / max(max |b|, 1e-6)`: the largest difference against the
/// reference `b`'s largest magnitude. Lengths must be equal.
pub fn rel_max(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    diff / scale.max(1e-6)
}

/// `|a - b|_2 / max(|b|_2, 1e-12)`: the difference against the reference
/// `b` as vectors (robust to a few elements whose sign flips near zero).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    let diff: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (diff / norm.max(1e-24)).sqrt()
}

/// Largest absolute difference.
pub fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

/// `|a - b| / max(|b|, 1e-12)`.
pub fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// A tensor's values on the host.
pub fn host<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32 values")
}

/// Every float parameter of a model by path (`layers.0.self_attn.q_proj.weight`
/// in burn's field names), in visit order: the embeddings, each layer in
/// turn, the final norm, the head.
pub type Named = Vec<(String, Vec<f32>)>;

/// Tracks the module path while visiting.
#[derive(Default)]
struct Path(Vec<String>);

impl Path {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }
    fn exit(&mut self) {
        self.0.pop();
    }
    fn joined(&self) -> String {
        self.0.join(".")
    }
}

struct Values<B> {
    path: Path,
    out: Named,
    backend: PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for Values<B> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out.push((self.path.joined(), host(param.val())));
    }
}

/// A module's float parameters by path ([`Named`]).
pub fn parameters<B: Backend, M: Module<B>>(module: &M) -> Named {
    let mut visitor = Values::<B> {
        path: Path::default(),
        out: Vec::new(),
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.out
}

struct Gradients<'a, B> {
    grads: &'a GradientsParams,
    path: Path,
    out: Named,
    backend: PhantomData<B>,
}

impl<B: AutodiffModelBackend> ModuleVisitor<B> for Gradients<'_, B> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.out.push((self.path.joined(), host(g)));
        }
    }
}

/// The gradients of a module's trainable parameters by path.
pub fn gradients<B: AutodiffModelBackend, M: Module<B>>(
    module: &M,
    grads: &GradientsParams,
) -> Named {
    let mut visitor = Gradients::<B> {
        grads,
        path: Path::default(),
        out: Vec::new(),
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.out
}

/// The worst [`rel_l2`] over parameters present in both, and the first
/// parameter (in visit order) above `tolerance`, if any.
pub fn first_over(device: &Named, reference: &Named, tolerance: f64) -> (f64, Option<String>) {
    let mut worst = 0.0f64;
    let mut first = None;
    for ((name, a), (other, b)) in device.iter().zip(reference) {
        assert_eq!(name, other, "the two models' parameters differ in order");
        let d = rel_l2(a, b);
        worst = worst.max(d);
        if d > tolerance && first.is_none() {
            first = Some(format!("{name} (relative L2 distance {d:.2e})"));
        }
    }
    (worst, first)
}

/// The first parameter whose bits differ, if any.
pub fn first_unequal(a: &Named, b: &Named) -> Option<String> {
    a.iter().zip(b).find_map(|((name, x), (_, y))| {
        let differ = x.iter().zip(y).filter(|(p, q)| p.to_bits() != q.to_bits());
        let count = differ.count();
        (count > 0).then(|| format!("{name} ({count} of {} values)", x.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_are_relative_to_the_reference() {
        let b = [1.0, -2.0, 4.0];
        assert_eq!(rel_max(&b, &b), 0.0);
        assert!((rel_max(&[1.0, -2.0, 4.4], &b) - 0.1).abs() < 1e-6);
        assert!((rel_l2(&[0.0, 0.0, 0.0], &b) - 1.0).abs() < 1e-12);
        assert!((max_abs(&[1.5, -2.0, 4.0], &b) - 0.5).abs() < 1e-12);
        assert!((rel(1.1, 1.0) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn the_first_parameter_over_the_tolerance_is_named() {
        let a: Named = vec![
            ("embed".into(), vec![1.0, 1.0]),
            ("layers.0.w".into(), vec![1.0, 1.5]),
            ("layers.1.w".into(), vec![9.0, 1.0]),
        ];
        let b: Named = vec![
            ("embed".into(), vec![1.0, 1.0]),
            ("layers.0.w".into(), vec![1.0, 1.0]),
            ("layers.1.w".into(), vec![1.0, 1.0]),
        ];
        let (worst, first) = first_over(&a, &b, 0.1);
        assert!(worst > 5.0);
        assert!(first.unwrap().starts_with("layers.0.w "));
        assert_eq!(first_over(&b, &b, 0.0), (0.0, None));
        assert!(first_unequal(&a, &b)
            .unwrap()
            .starts_with("layers.0.w (1 of 2"));
        assert_eq!(first_unequal(&a, &a), None);
    }
}
