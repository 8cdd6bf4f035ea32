//! AdamW, as burn's `AdamW` computes it, in one pass per parameter.
//!
//! burn's `AdamW` updates a parameter in a dozen element-wise operations,
//! each reading and writing whole tensors; on the CPU backend that is a
//! tenth of a training step. [`FusedAdamW`] hands the update to
//! [`ModelBackend::adamw_step`](mappa_model::kernels::ModelBackend::adamw_step),
//! which the CPU backend runs as one pass with the same arithmetic, operation
//! by operation, so the parameters and moments are the same bits as burn's
//! (tested below). Its state is burn's `AdamWState`, so optimiser records
//! (checkpoints) are unchanged. AMSGrad and cautious weight decay are not
//! offered.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamWState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::prelude::*;
use mappa_model::kernels::{self, AdamWStep, ModelBackend};
use mappa_model::AutodiffModelBackend;

/// AdamW with decoupled weight decay; the fields as burn's `AdamWConfig`
/// names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAdamW {
    /// Decay of the first moment.
    pub beta_1: f32,
    /// Decay of the second moment.
    pub beta_2: f32,
    /// Added to the second moment's square root.
    pub epsilon: f32,
    /// Decoupled weight decay (scaled by the learning rate).
    pub weight_decay: f32,
}

impl Default for FusedAdamW {
    /// burn's `AdamWConfig` defaults: betas 0.9 and 0.999, epsilon 1e-5,
    /// weight decay 1e-4.
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-5,
            weight_decay: 1e-4,
        }
    }
}

impl FusedAdamW {
    /// The optimiser for a model `M` trained on `B`.
    pub fn init<B: AutodiffModelBackend, M: AutodiffModule<B>>(
        self,
    ) -> OptimizerAdaptor<Self, M, B> {
        OptimizerAdaptor::from(self)
    }
}

impl<B: ModelBackend> SimpleOptimizer<B> for FusedAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let (time, moments) = match state {
            Some(state) => {
                let momentum = state.momentum;
                (
                    momentum.time + 1,
                    Some((momentum.moment_1, momentum.moment_2)),
                )
            }
            None => (1, None),
        };
        let step = AdamWStep {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            lr,
            time,
        };
        let [tensor, moment_1, moment_2] = kernels::adamw_step(tensor, grad, moments, &step);
        let momentum = AdaptiveMomentumState::new(time, moment_1, moment_2);
        (tensor, Some(AdamWState::new(momentum)))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::{ModuleVisitor, Param};
    use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
    use mappa_model::backend::{Cpu, CpuAutodiff};
    use mappa_model::config::Family;
    use mappa_model::{Transformer, TransformerConfig};

    /// A tiny model.
    fn model() -> Transformer<CpuAutodiff> {
        TransformerConfig::for_family(Family::Qwen3, 50, 16, 32, 2, 4, 2, 8)
            .init(3, &Default::default())
    }

    /// Gradients of a loss that reaches every parameter.
    fn grads(model: &Transformer<CpuAutodiff>, round: usize) -> GradientsParams {
        let tokens: Vec<i64> = (0..12).map(|i| ((i * 7 + round * 3) % 50) as i64).collect();
        let tokens = Tensor::<CpuAutodiff, 2, Int>::from_data(
            TensorData::new(tokens, [2, 6]),
            &Default::default(),
        );
        let loss = model.forward(tokens).powi_scalar(2).mean();
        GradientsParams::from_grads(loss.backward(), model)
    }

    /// Every parameter's bits, in the module's order.
    struct Bits(Vec<u32>);

    impl<B: Backend> ModuleVisitor<B> for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param
                .val()
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .unwrap();
            self.0.extend(values.iter().map(|v| v.to_bits()));
        }
    }

    fn bits(model: &Transformer<CpuAutodiff>) -> Vec<u32> {
        let mut visitor = Bits(Vec::new());
        model.visit(&mut visitor);
        visitor.0
    }

    /// Four updates of a model with each optimiser, weight decay on and
    /// off: the parameters are the same bits as burn's `AdamW`'s.
    #[test]
    fn fused_updates_are_burns_adamw_bit_for_bit() {
        for weight_decay in [0.0, 0.1] {
            let config = FusedAdamW {
                weight_decay,
                ..FusedAdamW::default()
            };
            let mut burns = AdamWConfig::new()
                .with_weight_decay(weight_decay)
                .init::<CpuAutodiff, Transformer<CpuAutodiff>>();
            let mut fused = config.init::<CpuAutodiff, Transformer<CpuAutodiff>>();
            let (mut a, mut b) = (model(), model());
            for round in 0..4 {
                let lr = 1e-2 / (round + 1) as f64;
                let (ga, gb) = (grads(&a, round), grads(&b, round));
                a = burns.step(lr, a, ga);
                b = fused.step(lr, b, gb);
                assert_eq!(
                    bits(&a),
                    bits(&b),
                    "weight decay {weight_decay}, update {round}"
                );
            }
        }
    }

    /// The CPU backend's fused pass and the generic operations (what the GPU
    /// backends run; here the same backend under autodiff, which does not
    /// fuse) give the same parameter and moments, at a first and a later
    /// update.
    #[test]
    fn the_fused_pass_is_the_generic_operations() {
        let device = Default::default();
        // Varied values over several orders of magnitude.
        let t = |seed: f32, scale: f32| {
            let values: Vec<f32> = (0..64)
                .map(|i| (i as f32 * seed).sin() * scale * 10f32.powi(i % 5 - 2))
                .collect();
            Tensor::<Cpu, 2>::from_data(TensorData::new(values, [4, 16]), &device)
        };
        let (param, grad) = (t(0.37, 1.0), t(1.3, 0.5));
        // Moments of the gradient's size, so that no update's term is lost
        // in their rounding.
        let moments = (t(0.71, 0.05), t(2.1, 1e-4).abs());
        let lift = |x: Tensor<Cpu, 2>| Tensor::<CpuAutodiff, 2>::from_inner(x);
        for (time, weight_decay) in [(1, 0.0), (1, 0.1), (7, 0.0), (7, 0.1)] {
            let step = AdamWStep {
                beta_1: 0.9,
                beta_2: 0.999,
                epsilon: 1e-5,
                weight_decay,
                lr: 3e-2,
                time,
            };
            let before = (time > 1).then(|| moments.clone());
            let fused = kernels::adamw_step(param.clone(), grad.clone(), before.clone(), &step);
            let generic = kernels::adamw_step(
                lift(param.clone()),
                lift(grad.clone()),
                before.map(|(m, v)| (lift(m), lift(v))),
                &step,
            );
            for (x, y) in fused.into_iter().zip(generic) {
                assert_eq!(
                    mappa_model::kernels::bits(x),
                    mappa_model::kernels::bits(y.inner()),
                    "time {time}, decay {weight_decay}"
                );
            }
        }
    }
}
