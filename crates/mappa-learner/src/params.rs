//! Walks over a model's parameters: the global gradient norm and its
//! clipping (burn's own clipping works per tensor; the paper clips the norm
//! of all gradients together), and parameter ids in visit order (optimiser
//! state is keyed by id, so a model reloaded from safetensors takes back the
//! ids it was saved with).

use std::marker::PhantomData;

use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use mappa_model::kernels;
use mappa_model::AutodiffModelBackend;

struct SquaredNorm<'a, B> {
    grads: &'a GradientsParams,
    total: f64,
    backend: PhantomData<B>,
}

impl<B: AutodiffModelBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.total += kernels::sum(g.powi_scalar(2)).into_scalar().elem::<f64>();
        }
    }
}

struct Scale<'a, B> {
    grads: &'a mut GradientsParams,
    factor: f64,
    backend: PhantomData<B>,
}

impl<B: AutodiffModelBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, g * self.factor);
        }
    }
}

/// The L2 norm of all of `module`'s gradients together.
pub fn global_grad_norm<B: AutodiffModelBackend, M: Module<B>>(
    module: &M,
    grads: &GradientsParams,
) -> f64 {
    let mut visitor = SquaredNorm::<B> {
        grads,
        total: 0.0,
        backend: PhantomData,
    };
    module.visit(&mut visitor);
    visitor.total.sqrt()
}

/// Scale all gradients so that their global norm is at most `max_norm`;
/// returns the norm before clipping.
pub fn clip_global_grad_norm<B: AutodiffModelBackend, M: Module<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> f64 {
    let norm = global_grad_norm(module, grads);
    if norm > max_norm {
        let mut visitor = Scale::<B> {
            grads,
            factor: max_norm / (norm + 1e-12),
            backend: PhantomData,
        };
        module.visit(&mut visitor);
    }
    norm
}

struct CollectIds(Vec<ParamId>);

impl<B: Backend> ModuleVisitor<B> for CollectIds {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.id);
    }
}

/// The ids of `module`'s float parameters, in visit order.
pub fn param_ids<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamId> {
    let mut visitor = CollectIds(Vec::new());
    module.visit(&mut visitor);
    visitor.0
}

struct AssignIds<'a> {
    ids: &'a [ParamId],
    next: usize,
}

impl<B: Backend> ModuleMapper<B> for AssignIds<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (_, tensor, mapper) = param.consume();
        let id = self.ids[self.next];
        self.next += 1;
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Give `module`'s float parameters the given ids, in visit order. Errors
/// when the counts differ.
pub fn assign_param_ids<B: Backend, M: Module<B>>(module: M, ids: &[ParamId]) -> Result<M, String> {
    let count = param_ids(&module).len();
    if count != ids.len() {
        return Err(format!(
            "the model has {count} parameter tensors but {} ids were saved",
            ids.len()
        ));
    }
    Ok(module.map(&mut AssignIds { ids, next: 0 }))
}
