//! AdamW's update in one pass per parameter, with the arithmetic of
//! burn's operations one by one, in place where nothing else holds the
//! parameter and its moments.

use crate::AdamWStep;

/// Elements of a parameter handled by one rayon task in AdamW's update.
/// The optimiser updates one parameter at a time, and most of a small
/// model's are a few [`ELEMENTS_PER_TASK`] or less (the 1m benchmark's
/// attention weights are 8-16K values): in tasks that size, one thread
/// updated each of them while the others waited. In tasks of 4K values the
/// 1m training step ran about 2% faster (`docs/experiments/speed.md`).
/// The update is element by element, so the split changes no bit.
pub(super) const ADAMW_ELEMENTS_PER_TASK: usize = 1 << 12;

/// The scalars of one AdamW update as burn's operations use them (each
/// scalar operation takes its scalar as f32).
#[derive(Debug, Clone, Copy)]
pub(super) struct AdamWScalars {
    beta_1: f32,
    beta_2: f32,
    factor_1: f32,
    factor_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    /// `1 - lr * weight_decay`, or `None` without decay.
    keep: Option<f32>,
    lr: f32,
}

/// The parameter, first and second moment of a chunk of elements, read
/// and written in place.
pub(super) type AdamWChunk<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

impl AdamWScalars {
    pub(super) fn of(step: &AdamWStep) -> Self {
        let [correction_1, correction_2] = step.corrections();
        let decay_rate = step.decay_rate();
        Self {
            beta_1: step.beta_1,
            beta_2: step.beta_2,
            factor_1: 1.0 - step.beta_1,
            factor_2: 1.0 - step.beta_2,
            correction_1,
            correction_2,
            epsilon: step.epsilon,
            keep: (decay_rate != 0.0).then_some((1.0 - decay_rate) as f32),
            lr: step.lr as f32,
        }
    }

    /// One chunk, vectorised with AVX2 where the CPU has it (the
    /// operations are IEEE's, correctly rounded at any width). At the
    /// `first` update the moments' old values are not read: burn starts
    /// them from the gradient's terms alone, which differs from `0 * beta +
    /// term` where the term is `-0`.
    pub(super) fn update(&self, chunk: AdamWChunk, grad: &[f32], first: bool) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present.
            unsafe { self.update_avx2(chunk, grad, first) };
            return;
        }
        self.update_any(chunk, grad, first);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn update_avx2(&self, chunk: AdamWChunk, grad: &[f32], first: bool) {
        self.update_any(chunk, grad, first);
    }

    /// Each operation rounds to f32, as burn's separate passes do (Rust
    /// never fuses a multiply and an add).
    #[inline(always)]
    fn update_any(&self, (w, m, v): AdamWChunk, grad: &[f32], first: bool) {
        let tail = |w: f32, m: f32, v: f32| {
            let delta = (m / self.correction_1) / ((v / self.correction_2).sqrt() + self.epsilon);
            let w = match self.keep {
                Some(keep) => w * keep,
                None => w,
            };
            w - delta * self.lr
        };
        let elements = w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(grad);
        if first {
            for (((w, m), v), &g) in elements {
                (*m, *v) = (g * self.factor_1, (g * g) * self.factor_2);
                *w = tail(*w, *m, *v);
            }
        } else {
            for (((w, m), v), &g) in elements {
                *m = *m * self.beta_1 + g * self.factor_1;
                *v = *v * self.beta_2 + (g * g) * self.factor_2;
                *w = tail(*w, *m, *v);
            }
        }
    }
}
