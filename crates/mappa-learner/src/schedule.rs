//! The learning-rate schedule: linear warm-up to the peak, then cosine decay
//! to the floor (the shape of DeepSpeed's WarmupCosineLR used by the paper).

use crate::config::TrainConfig;

/// Warm-up steps: `ceil(warmup_fraction * total_steps)`.
pub fn warmup_steps(config: &TrainConfig) -> usize {
    (config.warmup_fraction * config.total_steps as f64).ceil() as usize
}

/// The learning rate of optimiser step `step` (0-based). During warm-up it
/// rises linearly to `lr` at the last warm-up step; then it follows a cosine
/// from `lr` down to `min_lr` at `total_steps - 1`, and stays there.
pub fn learning_rate(config: &TrainConfig, step: usize) -> f64 {
    let warmup = warmup_steps(config);
    if step < warmup {
        return config.lr * (step + 1) as f64 / warmup as f64;
    }
    let decay_steps = config
        .total_steps
        .saturating_sub(warmup)
        .saturating_sub(1)
        .max(1);
    let progress = ((step - warmup) as f64 / decay_steps as f64).min(1.0);
    config.min_lr
        + 0.5 * (config.lr - config.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_the_floor() {
        let config = TrainConfig {
            lr: 1e-6,
            min_lr: 1e-7,
            warmup_fraction: 0.1,
            total_steps: 100,
            ..Default::default()
        };
        assert_eq!(warmup_steps(&config), 10);
        assert!((learning_rate(&config, 0) - 1e-7).abs() < 1e-18);
        assert!((learning_rate(&config, 9) - 1e-6).abs() < 1e-18);
        assert!((learning_rate(&config, 10) - 1e-6).abs() < 1e-18);
        assert!((learning_rate(&config, 99) - 1e-7).abs() < 1e-18);
        assert!((learning_rate(&config, 500) - 1e-7).abs() < 1e-18);
        let mut last = f64::INFINITY;
        for step in 10..100 {
            let lr = learning_rate(&config, step);
            assert!(lr <= last, "not decreasing at {step}");
            last = lr;
        }
    }

    #[test]
    fn no_warmup_starts_at_the_peak() {
        let config = TrainConfig {
            warmup_fraction: 0.0,
            total_steps: 3,
            ..Default::default()
        };
        assert_eq!(learning_rate(&config, 0), config.lr);
        assert!((learning_rate(&config, 2) - config.min_lr).abs() < 1e-18);
    }
}
